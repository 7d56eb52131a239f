"""The registry as `trainflow models` shows it: a model per line, a version per line, a
version's details, where the champion alias went; and the plain-text table every console summary uses
(:func:`columns`). Torch-free, as those commands are: :mod:`trainflow.tasks.render` shapes
the rest."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainflow.config import headline_metrics

if TYPE_CHECKING:
    from trainflow.pipelines.registry.versions import ModelSummary, VersionSummary


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A plain-text table: each column as wide as its widest cell, two spaces apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def _score(metrics: dict[str, float], name: str) -> str:
    return f"{metrics[name]:.4f}" if name in metrics else "-"


def models_lines(models: Sequence[ModelSummary]) -> list[str]:
    """``trainflow models list`` with no name: a registered model per line, with the version
    its champion alias names and its newest version."""
    if not models:
        return ["no registered models yet: `trainflow run` registers one"]
    rows = [(m.name, m.champion or "-", m.latest or "-", str(m.versions)) for m in models]
    return columns(("model", "champion", "latest", "versions"), rows)


def versions_lines(versions: Sequence[VersionSummary]) -> list[str]:
    """``trainflow models list``: a version per line, with aliases, test metrics (the
    newest version's objective's) and gate."""
    names = headline_metrics(versions[-1].metrics, "test_")[:2] if versions else ("accuracy", "macro_f1")
    rows = [
        (
            v.version,
            ",".join(v.aliases) or "-",
            *(_score(v.metrics, f"test_{name}") for name in names),
            {True: "passed", False: "failed"}.get(v.gate_passed, "-"),
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(v.created_ms / 1000)),
        )
        for v in versions
    ]
    return columns(("version", "aliases", *names, "gate", "created (UTC)"), rows)


def version_json(details: dict[str, Any]) -> str:
    """``trainflow models show``: a version's details as indented JSON."""
    return json.dumps(details, indent=2)


def move_line(name: str, move: dict[str, Any]) -> str:
    """``trainflow models promote`` and ``rollback``: where the champion alias went."""
    if move["action"] == "rollback":
        return f"{name}: champion -> v{move['version']} (rolled back from v{move['previous']})"
    was = f" (was v{move['previous']})" if move["previous"] else ""
    return f"{name}: champion -> v{move['version']}{was}"
