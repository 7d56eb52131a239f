"""The training pipeline: ingest -> preprocess -> train -> evaluate -> register."""

# No `from __future__ import annotations` here: Prefect builds the flow's parameter
# model from these annotations, and a served run fails to when they are strings.

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from pydantic import BaseModel

from trainflow import checks
from trainflow.cluster.preflight import preflight
from trainflow.cluster.session import ray_session
from trainflow.config import ConfigError, PipelineConfig, load_config, smoke_config
from trainflow.files import redacted
from trainflow.flows.logs import one_line_expected_errors
from trainflow.pipelines.training.run import TrainingDiverged
from trainflow.pipelines.training.runs import Driver, recorded_run, records, write_record
from trainflow.signals import raise_if_interrupted
from trainflow.tasks import evaluate, ingest, preprocess, register, render, train
from trainflow.tasks.results import PipelineResult
from trainflow.timeline import timeline
from trainflow.workspace import workspace

log = logging.getLogger("trainflow")


def resolve_config(
    config: PipelineConfig | str, overrides: list[str] | None = None, smoke: bool = False
) -> PipelineConfig:
    """The run's config from a flow parameter: a config, or a YAML/JSON path in the checkout."""
    resolved = load_config(config, overrides or [])
    return smoke_config(resolved) if smoke else resolved


def _run_name() -> str:
    """Flow run names say what ran: the model's name and the config's hash."""
    params = flow_run.parameters
    try:
        config = resolve_config(
            params.get("config", DEFAULT_CONFIG), params.get("overrides"), params.get("smoke", False)
        )
    except ConfigError:
        return "invalid-config"
    return f"{config.name}-{config.config_hash()[:8]}"


@contextmanager
def one_run_per_model(
    name: str, logger: logging.Logger | logging.LoggerAdapter = log, storage: str | None = None
) -> Iterator[None]:
    """Hold the model's Prefect concurrency slot: two trainings of one model never overlap,
    whichever deployments, schedules or hands started them; the later one waits, and says
    so in its log with how to free a slot that a killed run kept. Slots whose holders all
    died on this machine are freed first (:func:`_free_dead_slots`); the runs they held
    under ``storage`` are marked interrupted."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    limit = f"trainflow-model-{name}"
    with get_client(sync_client=True) as client:
        # Look before creating: the server logs a refused duplicate as an error with a
        # traceback, which users read as a failure of their run.
        try:
            taken = client.read_global_concurrency_limit_by_name(limit).active_slots
        except ObjectNotFound:
            taken = 0
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))
            except ObjectAlreadyExists:  # another run created it in between
                pass
        if taken and _free_dead_slots(client, limit, taken, storage, name, logger):
            taken = 0
    if taken:
        # A run killed outright (SIGKILL, out of memory, a machine that went down) cannot
        # release its slot; on a temporary Prefect server nothing expires it either.
        logger.warning(
            "waiting for another training of %s to finish (Prefect concurrency limit %s is taken); "
            "if none is running, a killed run kept the slot: free it with "
            "`prefect gcl update %s --active-slots 0`",
            name,
            limit,
            limit,
        )
    with concurrency(limit, occupy=1, strict=True), _slot_holder(limit):
        yield


class SlotHolder(BaseModel):
    """Who holds a model's concurrency slot, in a file of :func:`slot_holders` while it
    does: what tells a slot that a killed driver kept (in any step) from one a live run
    holds."""

    driver: Driver
    flow_run: str | None = None
    since: float


def slot_holders(limit: str) -> Path:
    """The folder naming who holds ``limit``'s slot, beside the Prefect database the slot
    is kept in: a temporary server's (``PREFECT_HOME/prefect.db`` unless set otherwise),
    which outlives any one run and whichever TRAINFLOW_HOME the run had. On a server
    elsewhere, PREFECT_HOME: the drivers of this machine that share it."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = str(settings.server.database.connection_url.get_secret_value() or "")
    _, _, database = url.partition(":///")
    on_file = url.startswith("sqlite") and database and ":memory:" not in database
    folder = Path(database).parent if on_file else settings.home
    return folder / "trainflow-slots" / limit


def _holders(limit: str) -> dict[Path, SlotHolder]:
    folder = slot_holders(limit)
    holders = {}
    for path in folder.glob("*.json"):
        try:
            holders[path] = SlotHolder.model_validate_json(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or not whole: a holder writes by rename
    return holders


@contextmanager
def _slot_holder(limit: str) -> Iterator[None]:
    """Record this driver as the holder of ``limit``'s slot until the block ends."""
    # The slot is this run's (a limit of 1): any other holder recorded here died and its
    # slot was given back already (by hand, or by _free_dead_slots elsewhere).
    for path, holder in _holders(limit).items():
        if holder.driver.alive() is False:
            path.unlink(missing_ok=True)
    me = SlotHolder(
        driver=Driver.this(), flow_run=str(flow_run.id) if flow_run.id else None, since=time.time()
    )
    path = slot_holders(limit) / f"{me.driver.host}-{me.driver.pid}-{me.driver.start}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(me.model_dump_json())
    partial.replace(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _free_dead_slots(client, limit: str, taken: int, storage: str | None, name: str, logger) -> bool:
    """Give back the slots whose holders died on this machine (killed outright, the
    machine restarted): each took one and could not release it. Only when every taken
    slot is such a one (a driver alive, or on another machine, holds its slot). The runs
    they left under ``storage`` become ``interrupted`` (``--resume`` continues them) and
    their flow runs Crashed. Whether the slots were freed."""
    holders = _holders(limit)
    dead = {path: h for path, h in holders.items() if h.driver.alive() is False}
    if not dead or len(dead) < taken or len(dead) < len(holders):
        return False  # a live holder (or one on another machine) may hold what is taken
    held = max(time.time() - min(h.since for h in dead.values()), 1.0)  # the server takes only > 0
    client.release_concurrency_slots(names=[limit], slots=taken, occupancy_seconds=held)
    for path in dead:
        path.unlink(missing_ok=True)
    died = {h.flow_run: h for h in dead.values()}
    for record in records(storage, name) if storage else []:
        if record.driver_died():
            died.pop(record.flow_run, None)
            logger.warning(
                "%s died with its driver; its concurrency slot is free again, and "
                "`trainflow run --resume` continues it from its latest checkpoint",
                record.describe(),
            )
            record.status = "interrupted"
            write_record(storage, record)
            _crashed(client, record.flow_run, record.driver)
    for flow_run_id, holder in died.items():
        logger.warning(
            "a training of %s (%s%s) died before it trained; its concurrency slot is free again",
            name,
            holder.driver.describe(),
            f", flow run {flow_run_id}" if flow_run_id else "",
        )
        _crashed(client, flow_run_id, holder.driver)
    return True


def _crashed(client, flow_run_id: str | None, driver: Driver) -> None:
    """Mark a dead driver's flow run Crashed: a display aid, the slot is what mattered."""
    from prefect.states import Crashed

    if not flow_run_id:
        return
    try:
        client.set_flow_run_state(
            flow_run_id, Crashed(message=f"its driver ({driver.describe()}) died"), force=True
        )
    except Exception as e:  # noqa: BLE001
        log.debug("could not mark flow run %s crashed: %s", flow_run_id, e)


# The bundled digits job: what a deployment runs when given no config.
DEFAULT_CONFIG = PipelineConfig()


def timed(step, *args, cached: list[str] | None = None) -> tuple[Any, float]:
    """Call a task and measure its wall time, retries included, for the run's summary.
    A task that Prefect answered from its cache is added to ``cached``."""
    raise_if_interrupted()
    start = time.perf_counter()
    timeline(f"{step.name} start")
    state = step(*args, return_state=True)
    out = state.result()
    if cached is not None and state.name == "Cached":
        cached.append(step.name)
    return out, time.perf_counter() - start


# Retries live on the tasks (a retried train task resumes its Ray run); results stay
# small and are not persisted.
@flow(name="training-pipeline", flow_run_name=_run_name, persist_result=False)
def training_pipeline(
    config: PipelineConfig | str = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    smoke: bool = False,
    resume: bool = False,
) -> PipelineResult:
    """Train, evaluate and register one model.

    Args:
        config: the run's config, or the path of a YAML/JSON config in the checkout.
        overrides: dotted overrides applied on top, such as ``["train.lr=0.01"]``.
        smoke: a quick end-to-end check: a sample of the data, one epoch, one worker,
            registered as ``<name>-smoke``.
        resume: continue the latest unfinished training of this config and data (its
            driver died, or it failed) from its latest checkpoint, rather than start anew;
            refused when the unfinished run is of another config or data.
    """
    one_line_expected_errors()
    logger = get_run_logger()
    config = resolve_config(config, overrides, smoke)
    timings: dict[str, float] = {}
    cached: list[str] = []

    # check: the source and what the run asks of the cluster, before any Ray worker
    # starts (the command's own checks, when it checked before starting Prefect and Ray)
    checked = checks.before_run(config, resume=resume)
    # ingest: skipped (cached) when the input's fingerprint and the data config are unchanged
    source, timings["ingest"] = timed(ingest, config, checked.source, cached=cached)

    storage = config.storage or str(workspace().runs)
    with one_run_per_model(config.name, logger, storage):
        # train: one Ray run per flow run, so a retry of the task resumes it; with
        # resume, the unfinished run the checks found
        resumed = checked.resume
        run_name = resumed.run_name if resumed else f"{config.name}-{str(flow_run.id or 'local')[:8]}"
        if resumed:
            logger.info("resuming %s, %s", resumed.describe(), resumed.status)
        elif resume:
            logger.info(
                "no unfinished run of %s under %s to resume: starting a new one",
                config.name,
                redacted(storage),
            )
        asked = config  # what the run is recorded as: preflight may fit its scaling to the cluster
        # Ray's worker processes start beside the flow for preparing on Ray; an input
        # small enough to prepare in this process needs none
        with ray_session(config, logger, warm=checked.warm):
            # what ScalingConfig asks, against the cluster: fail now rather than wait forever
            config = preflight(config, logger)
            # preprocess: skipped (cached) when its prepared entry exists
            prepared, timings["preprocess"] = timed(preprocess, config, source, cached=cached)
            # the run's record under storage, for --resume and a slot its driver may leave
            with recorded_run(
                storage, asked, source.fingerprint, run_name, flow_run=flow_run.id, resumed=resumed
            ) as record:
                try:
                    trained, timings["train"] = timed(train, config, prepared, run_name)
                except TrainingDiverged:
                    record.status = "diverged"  # would diverge again: nothing to resume
                    raise
                record.status = trained.status
                # evaluate
                evaluated, timings["evaluate"] = timed(evaluate, config, prepared, trained)
                # register: the champion alias moves only if the gate passes (a champion
                # measured on other test data is scored on this run's, on Ray, first)
                registered, timings["register"] = timed(
                    register, config, source, prepared, trained, evaluated
                )

    result = PipelineResult(
        name=config.name,
        config_hash=config.config_hash(),
        test_metrics=evaluated.headline,
        registered=registered,
        checkpoint=trained.best_checkpoint,
        prepared_reused=prepared.reused or "preprocess" in cached,
        timings=timings,
        cached=cached,
    )
    if cached:
        logger.info("%s: cached from an earlier run with the same data and config", " and ".join(cached))
    create_markdown_artifact(
        key=f"{render.artifact_key(config.name)}-summary", markdown=render.summary_markdown(result)
    )
    logger.info("done: %s", render.summary_line(result))
    return result
