"""A model card per version: what the version is, where it comes from, how it scored and
how to load it, as Markdown that MLflow keeps with the version's run (``model_card.md``).

The card is made from what the registry holds (the version's lineage tags and the gate's
decision) and the run's config, when the version is registered; the register step also
publishes it as a Prefect artifact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainflow.config.training import kind_name
from trainflow.files import redacted
from trainflow.pipelines.registry.lineage import (
    CONFIG_HASH_TAG,
    DATA_FINGERPRINT_TAG,
    GIT_COMMIT_TAG,
    TEST_FINGERPRINT_TAG,
)
from trainflow.pipelines.registry.registration import FLOW_NAME_TAG, FLOW_RUN_ID_TAG, FLOW_RUN_NAME_TAG
from trainflow.pipelines.registry.store import client
from trainflow.pipelines.registry.versions import resolve

if TYPE_CHECKING:
    from trainflow.config import PipelineConfig
    from trainflow.pipelines.registry.registration import Registration
    from trainflow.workspace import Workspace

# The card's file among the artifacts of the version's MLflow run.
CARD_FILE = "model_card.md"

# What the card says under "Drift at training time" when no drift check ran before training.
NO_DRIFT = "No drift check ran before this version was trained."


def card_markdown(
    reg: Registration,
    config: PipelineConfig,
    tags: dict[str, str],
    metrics: dict[str, float],
    drift: str | None = None,
) -> str:
    """The card of the version ``reg``, trained with ``config``: ``tags`` are the version's
    lineage tags as registered, ``metrics`` its test metrics. ``drift`` is the Markdown
    (a table per feature) that a drift check of the training data against the champion's
    made before training; None: no check ran, and the card says so."""
    return "\n\n".join(
        [
            f"# {reg.name} version {reg.version}",
            _what_it_is(reg, config),
            "## Data and lineage\n\n" + _lineage(reg, config, tags),
            "## Metrics\n\n" + _metrics(reg, metrics),
            "## Drift at training time\n\n" + (drift or NO_DRIFT),
            "## How to load it\n\n" + _how_to_load(reg),
        ]
    )


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def _what_it_is(reg: Registration, config: PipelineConfig) -> str:
    loop = f" trained by the loop `{config.train.loop}`" if config.train.loop else ""
    rows = [
        ("model", f"`{reg.name}`, version {reg.version}"),
        ("objective", config.objective),
        ("model kind", f"`{config.model.kind}`{loop}"),
    ]
    if config.preprocess.tokenizer is not None:
        tok = config.preprocess.tokenizer
        name = tok.name or f"the base model's ({kind_name(config.model.kind)})"
        rows.append(("tokenizer", f"{name}, column `{tok.column}`, {tok.max_length} tokens; saved with it"))
    if config.train.lora is not None:
        lora = config.train.lora
        how = "merged into the base weights when loaded" if lora.merge else "beside the base weights"
        targets = ", ".join(lora.target_modules) if lora.target_modules else "PEFT's defaults"
        rows.append(
            (
                "LoRA adapter",
                f"r {lora.r}, alpha {lora.alpha:g}, dropout {lora.dropout:g}, on {targets}; {how}",
            )
        )
    rows.append(("aliases when registered", ", ".join(reg.aliases) or "none"))
    return _table(rows)


def _lineage(reg: Registration, config: PipelineConfig, tags: dict[str, str]) -> str:
    flow_run = tags.get(FLOW_RUN_ID_TAG)
    if flow_run:
        named = f"{tags[FLOW_RUN_NAME_TAG]} " if tags.get(FLOW_RUN_NAME_TAG) else ""
        flow = f" of flow `{tags[FLOW_NAME_TAG]}`" if tags.get(FLOW_NAME_TAG) else ""
        flow_run = f"{named}(id `{flow_run}`){flow}"
    return _table(
        [
            ("data source", f"`{redacted(config.data.source)}`"),
            ("data fingerprint", _code(tags.get(DATA_FINGERPRINT_TAG))),
            ("test split fingerprint", _code(tags.get(TEST_FINGERPRINT_TAG))),
            ("config hash", _code(tags.get(CONFIG_HASH_TAG))),
            ("git commit", _code(tags.get(GIT_COMMIT_TAG), "none: not trained from a git checkout")),
            ("Prefect flow run", flow_run or "none: registered outside a flow"),
            ("MLflow run", f"`{reg.run_id}`"),
        ]
    )


def _code(value: str | None, missing: str = "not recorded") -> str:
    return f"`{value}`" if value else missing


def _metrics(reg: Registration, metrics: dict[str, float]) -> str:
    d = reg.decision
    verdict = "passed: champion" if d.passed else "failed: challenger"
    rows = "\n".join(f"| {k} | {float(v):.4f} |" for k, v in metrics.items())
    return f"Gate on `{d.metric}` {verdict}. {d.reason}\n\n| test metric | value |\n|---|---|\n{rows}"


def _how_to_load(reg: Registration) -> str:
    ref = f"{reg.name}/{reg.version}"
    return (
        "```python\nimport trainflow\n\n"
        f'model = trainflow.load_model("models:/{ref}")\n'
        "predictions = model.predict(frame)  # a pandas DataFrame of raw rows\n```\n\n"
        f"Serve it over HTTP: `trainflow models serve {ref}`. "
        f"Train it again from its config and data: `trainflow models reproduce {ref}`."
    )


def write_card(
    ws: Workspace,
    reg: Registration,
    config: PipelineConfig,
    metrics: dict[str, float],
    drift: str | None = None,
) -> str:
    """Make the card of a registered version from its lineage tags as the registry holds
    them, log it as ``model_card.md`` among its run's artifacts, and return it."""
    c = client(ws)
    tags = dict(c.get_model_version(reg.name, reg.version).tags)
    card = card_markdown(reg, config, tags, metrics, drift)
    c.log_text(reg.run_id, card, CARD_FILE)
    return card


def read_card(ws: Workspace, uri: str) -> str | None:
    """The card of the version ``uri`` names (NAME/VERSION, NAME@ALIAS), None for a version
    registered without one."""
    import tempfile

    mv = resolve(ws, uri)
    c = client(ws)
    if CARD_FILE not in {f.path for f in c.list_artifacts(mv.run_id)}:
        return None
    with tempfile.TemporaryDirectory(prefix="trainflow-card-") as tmp:
        with open(c.download_artifacts(mv.run_id, CARD_FILE, tmp), encoding="utf-8") as f:
            return f.read()
