"""Retraining when data arrives or what is served drifts: checks that emit Prefect events,
and the flow those events' triggers start (docs/guides/schedules.md).

``watch-data`` emits ``trainflow.data.changed`` (resource ``trainflow.data.<model>``) when
no registered version of a config was trained on its source's fingerprint; the event's id
comes from the model, the config's hash and the fingerprint, so Prefect acts on the same
data once. Whoever writes the data may emit it too (``emit_data_changed``).

``watch-served`` scores an endpoint's request samples against the champion's train split,
and under the champion's ``drift.action: retrain`` emits ``trainflow.model.drifted`` with
that config; ``warn`` and ``block`` only log.

``retrain-on-new-data`` answers both: it trains the config as the training flow does,
unless a registered version of it was already trained on that data."""

# No `from __future__ import annotations` here: Prefect builds the flows' parameter
# models from these annotations.

import uuid

from prefect import flow, get_run_logger

from trainflow import run_checks
from trainflow.config import PipelineConfig
from trainflow.flows.training import DEFAULT_CONFIG, resolve_config, training_pipeline
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.results import PipelineResult

DATA_CHANGED = "trainflow.data.changed"
RESOURCE_PREFIX = "trainflow.data."
MODEL_DRIFTED = "trainflow.model.drifted"
MODEL_RESOURCE_PREFIX = "trainflow.model."
_EVENT_IDS = uuid.UUID("6f1c3d2e-52b7-4c61-9a38-2f0b8d7e4a10")  # the namespace of the events' ids


def data_changed_id(name: str, config_hash: str, fingerprint: str) -> uuid.UUID:
    """The id of the event that says ``name``'s data is now ``fingerprint``: the same for
    the same model, config and data, so that Prefect acts on it once."""
    return uuid.uuid5(_EVENT_IDS, f"{name}/{config_hash}/{fingerprint}")


def emit_data_changed(config: PipelineConfig, fingerprint: str, parameters: dict | None = None) -> uuid.UUID:
    """Emit ``trainflow.data.changed`` for ``config``'s model and data; ``parameters``:
    what the triggered run is given (its ``config`` and ``overrides``), in the payload.
    Returns the event's id."""
    from prefect.events import emit_event

    event_id = data_changed_id(config.name, config.config_hash(), fingerprint)
    emit_event(
        event=DATA_CHANGED,
        resource={
            "prefect.resource.id": f"{RESOURCE_PREFIX}{config.name}",
            "prefect.resource.name": config.name,
            "trainflow.config_hash": config.config_hash(),
            "trainflow.data_fingerprint": fingerprint,
        },
        payload={"source": config.data.source, **(parameters or {})},
        id=event_id,
    )
    return event_id


def trained_version(config: PipelineConfig, fingerprint: str) -> str | None:
    """The newest registered version of ``config``'s model trained with this config on
    data of this fingerprint; None when there is none."""
    from trainflow.pipelines.registry import versions
    from trainflow.workspace import workspace

    return versions.version_trained_on(workspace(), config.name, config.config_hash(), fingerprint)


@flow(name="watch-data", persist_result=False)
def watch_data(config: PipelineConfig | str = DEFAULT_CONFIG, overrides: list[str] | None = None) -> bool:
    """Announce that a config's data changed: emit ``trainflow.data.changed`` when no
    registered version of this config was trained on the source as it is now.

    Args:
        config: the config, or the path of a YAML/JSON config in the checkout; the event
            carries it, for the run it triggers.
        overrides: dotted overrides applied on top; the event then carries the config
            with them applied.

    Returns:
        whether it emitted the event.
    """
    one_line_expected_errors()
    resolved = resolve_config(config, overrides)
    fingerprint = run_checks.source(resolved).fingerprint
    logger = get_run_logger()
    version = trained_version(resolved, fingerprint)
    if version is not None:
        logger.info(
            "%s: version %s was trained on this data (%s); nothing to do", resolved.name, version, fingerprint
        )
        return False
    # The triggered run's config: its path as given (read again where that run runs), or
    # the config itself, with the overrides applied.
    given = config if isinstance(config, str) and not overrides else resolved.model_dump(mode="json")
    emit_data_changed(resolved, fingerprint, {"config": given})
    logger.info("%s: its data changed (%s); emitted %s", resolved.name, fingerprint, DATA_CHANGED)
    return True


def emit_model_drifted(
    config: PipelineConfig, fingerprint: str, drifted: list[str], reference: str
) -> uuid.UUID:
    """Emit ``trainflow.model.drifted`` for ``config``'s model: its served requests drifted
    (``drifted``: the features, the most shifted first) from ``reference`` (the champion),
    and its data is now ``fingerprint``; the payload carries ``config``, for the run it
    triggers. One event per model, config and data, as for new data. Returns its id."""
    from prefect.events import emit_event

    event_id = uuid.uuid5(_EVENT_IDS, f"drifted/{config.name}/{config.config_hash()}/{fingerprint}")
    emit_event(
        event=MODEL_DRIFTED,
        resource={
            "prefect.resource.id": f"{MODEL_RESOURCE_PREFIX}{config.name}",
            "prefect.resource.name": config.name,
            "trainflow.champion": reference,
            "trainflow.data_fingerprint": fingerprint,
        },
        payload={"config": config.model_dump(mode="json"), "drifted": drifted},
        id=event_id,
    )
    return event_id


@flow(name="watch-served", persist_result=False)
def watch_served(model: str = "digits") -> bool:
    """Score what ``model``'s endpoint was asked against its champion's train split (the
    request samples its replicas keep under its ``storage``, else TRAINFLOW_HOME, as
    ``trainflow models drift`` does), with the champion's drift thresholds; emit
    ``trainflow.model.drifted`` when a feature drifted, the champion's config says
    ``drift.action: retrain``, and no version of that config was trained on its data as
    it is now.

    Args:
        model: the registered model's name; its champion is the reference.

    Returns:
        whether it emitted the event.
    """
    from trainflow.config import DriftConfig
    from trainflow.pipelines.drift.samples import served_drift
    from trainflow.pipelines.registry.reproduce import saved_config
    from trainflow.workspace import workspace

    one_line_expected_errors()
    logger = get_run_logger()
    ws = workspace()
    champion, config = saved_config(ws, f"{model}@champion")
    thresholds = config.drift or DriftConfig()
    report, _ = served_drift(ws, model, psi_threshold=thresholds.psi, ks_pvalue=thresholds.ks_pvalue)
    if not report.drifted:
        logger.info("%s: served requests: %s", model, report.summary())
        return False
    if thresholds.action != "retrain":
        logger.warning(
            "%s: served requests: %s (drift.action %s)", model, report.summary(), thresholds.action
        )
        return False
    fingerprint = run_checks.source(config).fingerprint
    version = trained_version(config, fingerprint)
    if version is not None:
        trained = f"version {version} was trained on {config.data.source} as it is now ({fingerprint})"
        logger.warning(
            "%s: served requests: %s; %s: add the newer data there to retrain",
            model,
            report.summary(),
            trained,
        )
        return False
    drifted = [f.feature for f in sorted(report.drifted, key=lambda f: -f.psi)]
    emit_model_drifted(config, fingerprint, drifted, champion)
    logger.info("%s: served requests: %s; emitted %s", model, report.summary(), MODEL_DRIFTED)
    return True


@flow(name="retrain-on-new-data", persist_result=False)
def retrain_on_new_data(
    config: PipelineConfig | str = DEFAULT_CONFIG, overrides: list[str] | None = None
) -> PipelineResult | None:
    """Train a config on its data as it is now, unless a registered version of this
    config was already trained on it (then return None): what the ``on-new-data``
    deployment's trigger runs, so that the same data announced twice trains once.

    Args:
        config: the config, or the path of a YAML/JSON config in the checkout.
        overrides: dotted overrides applied on top, such as ``["train.lr=0.01"]``.
    """
    one_line_expected_errors()
    resolved = resolve_config(config, overrides)
    checked = run_checks.before_run(resolved)
    version = trained_version(resolved, checked.source.fingerprint)
    if version is not None:
        get_run_logger().info(
            "%s: version %s was trained on this data (%s); not training again",
            resolved.name,
            version,
            checked.source.fingerprint,
        )
        return None
    return training_pipeline(config=resolved, checked=checked)
