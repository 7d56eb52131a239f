"""A registered model's versions: find one by URI, list and describe them, move the
champion by hand, and load a version's checkpoint on this machine; and the registry as
`trainflow models` shows it: a model per line, a version per line, a version's details,
where the champion alias went, and the plain-text table every console summary uses
(:func:`columns`). Torch-free at import, as those commands are: :mod:`trainflow.tasks.render`
shapes the rest."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainflow.config import headline_metrics
from trainflow.pipelines.registry.gate import (
    CHAMPION,
    alias_version,
    champion_stack,
    move_alias,
    moves,
)
from trainflow.pipelines.registry.lineage import (
    CONFIG_HASH_TAG,
    DATA_FINGERPRINT_TAG,
    local_checkpoint,
)
from trainflow.pipelines.registry.store import client, is_queue, model_lease, tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from trainflow.pipelines.models.checkpoint import Predictor
    from trainflow.workspace import Workspace


class RegistryError(ValueError):
    """A model, version or alias that does not exist, or a move that cannot be made."""


@contextlib.contextmanager
def server_in_one_line(ws: Workspace) -> Iterator[None]:
    """The block, where MLflow's client failing to reach the server MLFLOW_TRACKING_URI
    names (after its own retries) is a one-line RegistryError that says what is kept and
    how to finish."""
    from requests.exceptions import ConnectionError as NoConnection

    from trainflow.files import redacted

    try:
        yield
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, NoConnection):
            cause = cause.__cause__ or cause.__context__
        if cause is None or not tracking_uri(ws).startswith(("http://", "https://")):
            raise
        reason = re.search(r"\[Errno -?\d+\] [^\"')]+", str(cause))
        raise RegistryError(
            f"registry: the MLflow server at {redacted(tracking_uri(ws))} stopped answering "
            f"({reason.group(0) if reason else 'no connection'}); the trained checkpoint is kept: once "
            "the server is back, the same run with --resume registers it without training again"
        ) from None


def require_model(c: MlflowClient, name: str) -> None:
    """Refuse a model name the registry does not hold, naming the ones it does."""
    from mlflow.exceptions import MlflowException

    try:
        c.get_registered_model(name)
    except MlflowException:
        known = sorted(rm.name for rm in c.search_registered_models() if not is_queue(rm.tags))
        raise RegistryError(
            f"unknown model {name!r}; registered models: {', '.join(known) or 'none'}"
        ) from None


def require_version(c: MlflowClient, name: str, version: str) -> ModelVersion:
    """A version of a model, or an error naming the versions it has."""
    from mlflow.exceptions import MlflowException

    require_model(c, name)
    try:
        return c.get_model_version(name, version)
    except MlflowException:
        versions = sorted(int(v.version) for v in c.search_model_versions(f"name='{name}'"))
        raise RegistryError(
            f"{name} has no version {version}; its versions: {', '.join(map(str, versions)) or 'none'}"
        ) from None


# --- resolving a model URI -----------------------------------------------------------

_URI = re.compile(r"^(?:models:/)?(?P<name>[^@/]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))?$")


def resolve(ws: Workspace, uri: str) -> ModelVersion:
    """``NAME``, ``NAME@ALIAS``, ``NAME/VERSION`` or their ``models:/`` forms -> a ModelVersion.

    A bare name means its champion.
    """
    m = _URI.match(uri)
    if not m:
        raise RegistryError(f"model {uri!r}: use NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")
    c = client(ws)
    name = m["name"]
    if m["version"]:
        return require_version(c, name, m["version"])
    require_model(c, name)
    alias = m["alias"] or CHAMPION
    mv = alias_version(c, name, alias)
    if mv is None:
        aliases = sorted(c.get_registered_model(name).aliases)
        raise RegistryError(f"{name} has no alias {alias!r}; its aliases: {', '.join(aliases) or 'none'}")
    return mv


def followed_alias(uri: str) -> str | None:
    """The alias a model URI follows (``champion`` for a bare name); None for a pinned
    ``NAME/VERSION``, which never moves."""
    m = _URI.match(uri)
    if not m:
        raise RegistryError(f"model {uri!r}: use NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")
    return None if m["version"] else (m["alias"] or CHAMPION)


# --- listing and describing ----------------------------------------------------------


def list_versions(ws: Workspace, name: str) -> list[ModelVersion]:
    c = client(ws)
    require_model(c, name)
    return sorted(c.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))


def version_trained_on(ws: Workspace, name: str, config_hash: str, fingerprint: str) -> str | None:
    """The newest version of ``name`` trained with the config of ``config_hash`` on data of
    ``fingerprint`` (its lineage tags); None when there is none, or no such model."""
    matches = [
        v.version
        for v in client(ws).search_model_versions(f"name='{name}'")
        if v.tags.get(CONFIG_HASH_TAG) == config_hash and v.tags.get(DATA_FINGERPRINT_TAG) == fingerprint
    ]
    return max(matches, key=int, default=None)


@dataclass(frozen=True)
class VersionSummary:
    """One version as ``trainflow models list`` shows it."""

    version: str
    aliases: list[str]
    metrics: dict[str, float]  # its run's metrics: test_accuracy, test_macro_f1, ...
    gate_passed: bool | None  # None when the gate never ran on it
    created_ms: int


def version_summaries(ws: Workspace, name: str) -> list[VersionSummary]:
    """Every version of a model, oldest first, with its aliases, metrics and gate result."""
    versions = list_versions(ws, name)
    c = client(ws)
    # Searched versions come without their aliases; the registered model holds them.
    aliases: dict[str, list[str]] = {}
    for alias, version in c.get_registered_model(name).aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    return [
        VersionSummary(
            version=str(mv.version),
            aliases=sorted(aliases.get(str(mv.version), [])),
            metrics=dict(c.get_run(mv.run_id).data.metrics) if mv.run_id else {},
            gate_passed=gate_values(mv.tags).get("passed"),
            created_ms=int(mv.creation_timestamp),
        )
        for mv in versions
    ]


@dataclass(frozen=True)
class ModelSummary:
    """One registered model as ``trainflow models list`` shows it with no name."""

    name: str
    champion: str | None  # the version the champion alias names; None when none does
    latest: str | None  # its newest version; None for a model without versions
    versions: int


def model_summaries(ws: Workspace) -> list[ModelSummary]:
    """Every registered model, by name, with its champion and newest version; the gate's
    queues (:mod:`.lease`) are not models and are left out."""
    c = client(ws)
    page = c.search_registered_models(max_results=1000)
    found = list(page)
    while page.token:
        page = c.search_registered_models(max_results=1000, page_token=page.token)
        found += page
    found = [rm for rm in found if not is_queue(rm.tags)]
    out = []
    for rm in sorted(found, key=lambda rm: rm.name):
        numbers = [int(v.version) for v in c.search_model_versions(f"name='{rm.name}'")]
        champion = rm.aliases.get(CHAMPION)
        out.append(
            ModelSummary(
                rm.name,
                champion=None if champion is None else str(champion),
                latest=str(max(numbers)) if numbers else None,
                versions=len(numbers),
            )
        )
    return out


# The gate's decision is kept as ``gate.*`` tags (:func:`~trainflow.pipelines.registry.gate.gate_tags`),
# which MLflow holds as strings; each value is read back as the type GateDecision gave it.
_GATE_TEXT = ("metric", "reason", "champion_version")


def gate_values(tags: dict[str, str]) -> dict[str, Any]:
    """A version's gate decision from its tags, typed: ``passed`` a bool, the numbers
    floats, ``champion_version`` a string, an absent value None. ``trainflow models show``
    and the serving endpoint's ``GET /model`` both say it so."""
    out: dict[str, Any] = {}
    for tag, text in tags.items():
        if not tag.startswith("gate."):
            continue
        key = tag.removeprefix("gate.")
        if text == "None":
            out[key] = None
        elif key in _GATE_TEXT:
            out[key] = text
        elif text in ("True", "False"):
            out[key] = text == "True"
        else:
            out[key] = _number(text)
    return out


def _number(text: str) -> float | str:
    """A number kept as text, back as a float; anything else as it is."""
    try:
        return float(text)
    except ValueError:
        return text


def version_details(ws: Workspace, uri: str) -> dict[str, Any]:
    """A version's aliases, test metrics, lineage tags, gate decision (typed:
    :func:`gate_values`) and alias moves."""
    mv = resolve(ws, uri)
    c = client(ws)
    run = c.get_run(mv.run_id)
    tags = dict(mv.tags)
    return {
        "name": mv.name,
        "version": str(mv.version),
        "status": mv.status,
        "aliases": sorted(mv.aliases),
        "source": mv.source,
        "metrics": {k: v for k, v in run.data.metrics.items() if k.startswith("test_")},
        "gate": gate_values(tags),
        "alias_moves": [m for m in moves(c, mv.name) if m["version"] == str(mv.version)],
        "tags": tags,
    }


# --- moving the champion by hand -----------------------------------------------------


def promote(ws: Workspace, name: str, version: str, reason: str = "promoted by hand") -> dict:
    """Make ``version`` the champion, whatever the gate said."""
    c = client(ws)
    mv = require_version(c, name, version)
    if mv.status != "READY":
        raise RegistryError(f"{name} version {version} is {mv.status}, not READY; it cannot be champion")
    with model_lease(c, ws, name):
        return move_alias(c, name, CHAMPION, str(version), action="promote", reason=reason)


def rollback(ws: Workspace, name: str) -> dict:
    """Move the champion back to the champion before it."""
    c = client(ws)
    require_model(c, name)
    with model_lease(c, ws, name):
        current = alias_version(c, name, CHAMPION)
        stack = champion_stack(moves(c, name))
        if current is None or len(stack) < 2 or stack[-1] != str(current.version):
            now = f"v{current.version}" if current else "none"
            raise RegistryError(f"{name} has no previous champion to roll back to (champion: {now})")
        return move_alias(
            c, name, CHAMPION, stack[-2], action="rollback", reason=f"rolled back from v{current.version}"
        )


# --- loading -------------------------------------------------------------------------


def load_model(uri: str, ws: Workspace | None = None) -> Predictor:
    """A registered model, ready to predict raw rows with its saved preprocessing.

    >>> model = load_model("digits@champion")
    >>> model.predict(frame)
    """
    from trainflow.pipelines.models.checkpoint import load_checkpoint  # torch: for loading alone
    from trainflow.workspace import workspace

    ws = ws or workspace()
    mv = resolve(ws, uri)
    predictor = load_checkpoint(local_checkpoint(ws, mv))
    predictor.version = str(mv.version)
    return predictor


# --- the registry as `trainflow models` shows it ---------------------------------------


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
