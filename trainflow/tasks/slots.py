"""One training of a model at a time, whichever deployments, schedules or hands start them:
a Prefect global concurrency limit of one slot per model, ``trainflow-model-<name>``.

A driver killed outright (SIGKILL, out of memory, a machine that went down) cannot give
its slot back, and nothing expires it on a temporary Prefect server: each holder is named
in a file beside the Prefect database that keeps the slot (:func:`slot_holders`), so that
a slot whose holders all died on this machine is freed by the next run, and their runs
under ``storage`` are marked interrupted (``--resume`` continues them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from pydantic import BaseModel

from trainflow.config import PipelineConfig
from trainflow.pipelines.training.run_records import Driver, records, write_record
from trainflow.workspace import storage_location

log = logging.getLogger("trainflow")


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's logger of the current flow or task run; trainflow's own outside one."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


@contextmanager
def one_training_at_a_time(
    model: PipelineConfig | str, logger: logging.Logger | logging.LoggerAdapter | None = None
) -> Iterator[None]:
    """Hold the Prefect concurrency slot of ``model`` (a config, or a model's name) for the
    block: two trainings of one model never overlap; the later one waits, and says so in
    its log with how to free a slot that a killed run kept. Slots whose holders all died
    on this machine are freed first (:func:`_free_dead_slots`); the runs they held under
    the config's ``storage`` are marked interrupted. Needs a Prefect API (a flow run has one)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name, storage = (model, None) if isinstance(model, str) else (model.name, storage_location(model))
    logger = logger or run_logger()
    limit = f"trainflow-model-{name}"
    with get_client(sync_client=True) as client:
        # Look before creating: the server logs a refused duplicate as an error with a
        # traceback, which users read as a failure of their run.
        try:
            found = client.read_global_concurrency_limit_by_name(limit)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))
            except ObjectAlreadyExists:  # another run created it in between
                pass
            found = client.read_global_concurrency_limit_by_name(limit)
        taken = found.active_slots
        holders = slot_holders(limit, found.id)
        if taken and _free_dead_slots(client, holders, taken, storage, name, logger):
            taken = 0
    if taken:
        logger.warning(
            "waiting for another training of %s to finish (Prefect concurrency limit %s is taken); "
            "if none is running, a killed run kept the slot: free it with "
            "`prefect gcl update %s --active-slots 0`",
            name,
            limit,
            limit,
        )
    with concurrency(limit, occupy=1, strict=True), _slot_holder(holders):
        yield


class SlotHolder(BaseModel):
    """Who holds a model's concurrency slot, in a file of :func:`slot_holders` while it
    does: what tells a slot that a killed driver kept (in any step) from one a live run
    holds."""

    driver: Driver
    flow_run: str | None = None
    since: float


def slot_holders(limit: str, limit_id: object) -> Path:
    """The folder naming who holds ``limit``'s slot, beside the Prefect database the slot
    is kept in: a temporary server's (``PREFECT_HOME/prefect.db`` unless set otherwise),
    which outlives any one run and whichever TRAINFLOW_HOME the run had. On a server
    elsewhere, PREFECT_HOME: the drivers of this machine that share it. Named after the
    limit's id, which its database gave it, so that a run on one server never takes the
    holders of another server's slot of the same name for its own."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = str(settings.server.database.connection_url.get_secret_value() or "")
    _, _, database = url.partition(":///")
    on_file = url.startswith("sqlite") and database and ":memory:" not in database
    folder = Path(database).parent if on_file else settings.home
    return folder / "trainflow-slots" / limit / str(limit_id)


def _holders(folder: Path) -> dict[Path, SlotHolder]:
    holders = {}
    for path in folder.glob("*.json"):
        try:
            holders[path] = SlotHolder.model_validate_json(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or not whole: a holder writes by rename
    return holders


@contextmanager
def _slot_holder(folder: Path) -> Iterator[None]:
    """Record this driver in ``folder`` as the holder of its limit's slot until the block ends."""
    # The slot is this run's (a limit of 1): any other holder recorded here died and its
    # slot was given back already (by hand, or by _free_dead_slots elsewhere).
    for path, holder in _holders(folder).items():
        if holder.driver.alive() is False:
            path.unlink(missing_ok=True)
    me = SlotHolder(
        driver=Driver.this(), flow_run=str(flow_run.id) if flow_run.id else None, since=time.time()
    )
    path = folder / f"{me.driver.host}-{me.driver.pid}-{me.driver.start}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(me.model_dump_json())
    partial.replace(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _free_dead_slots(client, folder: Path, taken: int, storage: str | None, name: str, logger) -> bool:
    """Give back the slots whose holders died on this machine (killed outright, the
    machine restarted): each took one and could not release it. Only when every taken
    slot is such a one (a driver alive, or on another machine, holds its slot). The runs
    they left under ``storage`` become ``interrupted`` (``--resume`` continues them) and
    their flow runs Crashed. Whether the slots were freed."""
    holders = _holders(folder)
    dead = {path: h for path, h in holders.items() if h.driver.alive() is False}
    if not dead or len(dead) < taken or len(dead) < len(holders):
        return False  # a live holder (or one on another machine) may hold what is taken
    held = max(time.time() - min(h.since for h in dead.values()), 1.0)  # the server takes only > 0
    client.release_concurrency_slots(names=[f"trainflow-model-{name}"], slots=taken, occupancy_seconds=held)
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
