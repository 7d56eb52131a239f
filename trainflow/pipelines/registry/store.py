"""Where the registry lives, how it is opened, and the gate's lease kept in it.

The registry is the embedded SQLite store under TRAINFLOW_HOME unless
MLFLOW_TRACKING_URI points at an MLflow server. Every client call retries while the
SQLite file is locked, and a file lock lets one process at a time create or upgrade its
tables.

The lease (:func:`model_lease`) lets one process at a time, on any machine, read a
model's champion and move its aliases. Beside each model is a queue, the registered model
``<name>.trainflow-gate``: a process registers a version of it (its ticket, numbered by
MLflow) and holds the lease once every lower ticket is done. A ticket beats every quarter
of ``lease_s``; a waiter that sees a beat unchanged for ``lease_s`` marks it expired.
Before moving an alias the holder checks that its ticket still holds
(:meth:`Lease.verify`), so a stalled process decides again."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainflow.workspace import Workspace

EXPERIMENT = "trainflow"


def tracking_uri(ws: Workspace) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def _embedded() -> bool:
    return not os.environ.get("MLFLOW_TRACKING_URI")


def check_server(ws: Workspace, timeout_s: float = 5.0) -> None:
    """PreflightError when MLFLOW_TRACKING_URI names an MLflow server where nothing answers:
    MLflow's client would retry each call for minutes, and a run would train first. A
    server that answers at all (an error status behind a proxy, say) is left to MLflow."""
    import urllib.error
    import urllib.request

    from trainflow.cluster.checks import PreflightError
    from trainflow.files import redacted

    uri = redacted(tracking_uri(ws))  # MLflow's /health asks for no credentials
    if not uri.startswith(("http://", "https://")):
        _check_database_driver(uri)
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return
    except OSError as e:
        reason = getattr(e, "reason", None) or e
        raise PreflightError(
            f"registry: no MLflow server answers at {uri} (MLFLOW_TRACKING_URI): {reason}; "
            "start it, or unset MLFLOW_TRACKING_URI for the embedded registry in TRAINFLOW_HOME"
        ) from None


def _check_database_driver(uri: str) -> None:
    """PreflightError when MLFLOW_TRACKING_URI is a database whose SQLAlchemy driver is not
    installed here (``postgresql://`` means psycopg2), named with what to install."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from trainflow.cluster.checks import PreflightError

    try:
        url = make_url(uri)
        if url.get_backend_name() == "sqlite":
            return
        url.get_dialect().import_dbapi()
    except NoSuchModuleError:  # an ArgumentError too: caught first
        raise PreflightError(
            f"registry: MLFLOW_TRACKING_URI {uri}: SQLAlchemy has no driver {url.drivername!r}; write "
            "one it has (postgresql+psycopg2://..., mysql+pymysql://...), or point it at an MLflow server"
        ) from None
    except ArgumentError:  # not a database URI: MLflow says what it makes of it
        return
    except ImportError as e:
        driver = url.get_driver_name()
        raise PreflightError(
            f"registry: MLFLOW_TRACKING_URI {uri} needs the database driver {e.name or driver}, "
            f"which is not installed here: {_DRIVER_PACKAGES.get(driver, 'install it')}, "
            "or point MLFLOW_TRACKING_URI at an MLflow server on that database"
        ) from None


# What installs the database drivers SQLAlchemy picks by default.
_DRIVER_PACKAGES = {
    "psycopg2": "pip install psycopg2-binary",
    "psycopg": "pip install 'psycopg[binary]'",
    "mysqldb": "pip install mysqlclient",
    "pymysql": "pip install pymysql",
    "pyodbc": "pip install pyodbc",
}


def _artifact_location(ws: Workspace) -> str | None:
    """Where a new experiment keeps its artifacts: beside its SQLite database (the embedded
    store's, or one that MLFLOW_TRACKING_URI names), not in ./mlruns of whatever folder
    the run started in, MLflow's default for a database it did not create through a
    server; an MLflow server's own artifact root (None) otherwise."""
    if _embedded():
        return ws.artifacts.as_uri()
    uri = tracking_uri(ws)
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def _locked_database(e: BaseException) -> bool:
    return "database is locked" in str(e) or "database table is locked" in str(e)


def retry_locked(fn: Callable, *args, attempts: int = 12, **kwargs):
    """Call fn, retrying with backoff while SQLite says the database is locked.

    The embedded store is one SQLite file; flow runs registering at the same moment take
    turns on its write lock, and SQLite answers the loser "database is locked" instead
    of waiting. A locked write did not happen, so trying it again is safe.
    """
    delay = 0.05
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if attempt == attempts - 1 or not _locked_database(e):
                raise
            time.sleep(delay * (1 + (os.getpid() % 7) / 7))  # spread the processes apart
            delay = min(delay * 2, 2.0)


class _RetryingClient:
    """An MlflowClient whose every call retries while the SQLite database is locked."""

    def __init__(self, inner: MlflowClient):
        self._inner = inner

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        return functools.partial(retry_locked, attr)


@contextlib.contextmanager
def registry_lock(ws: Workspace) -> Iterator[None]:
    """One process of this machine at a time in the block: the embedded store's table
    creation and upgrade (:func:`client`)."""
    path = ws.home / "registry.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def client(ws: Workspace) -> MlflowClient:
    from mlflow import MlflowClient

    uri = tracking_uri(ws)
    if _embedded() and uri not in _opened:
        # A process's first client creates or upgrades the tables: two at once collide
        # ("duplicate column name"), so each does it under the lock. MLflow logs the
        # creation, which a new user reads as a problem: quiet it here too (a check runs
        # before a command's start-up quiets MLflow).
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        with registry_lock(ws):
            c = MlflowClient(tracking_uri=uri, registry_uri=uri)
            c.search_registered_models(max_results=1)
        _opened.add(uri)
    else:
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return _RetryingClient(c)  # type: ignore[return-value]


_opened: set[str] = set()  # the embedded stores this process has opened


def set_version_tags(c: MlflowClient, name: str, version: str, tags: dict[str, str]) -> None:
    """Set several tags of a model version. MLflow sets one tag a request: against a server
    they go a few at a time; the embedded store takes one writer at a time, so one by one."""
    from concurrent.futures import ThreadPoolExecutor

    def set_tag(item: tuple[str, str]) -> None:
        c.set_model_version_tag(name, version, *item)

    if _embedded() or len(tags) < 2:
        for item in tags.items():
            set_tag(item)
        return
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainflow-tags") as pool:
        list(pool.map(set_tag, tags.items()))


def experiment_id(c: MlflowClient, ws: Workspace) -> str:
    """The id of trainflow's MLflow experiment, made on first use with its artifacts
    where :func:`_artifact_location` says."""
    exp = c.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        return exp.experiment_id
    location = _artifact_location(ws)
    try:
        return c.create_experiment(EXPERIMENT, artifact_location=location)
    except Exception:
        # Another run created it between our look and our create.
        exp = c.get_experiment_by_name(EXPERIMENT)
        if exp is None:
            raise
        return exp.experiment_id


# --- the gate's lease ---------------------------------------------------------------

log = logging.getLogger("trainflow")

QUEUE_SUFFIX = ".trainflow-gate"
QUEUE_OF_TAG = "trainflow.gate_queue_of"  # on the queue: the model it queues for
QUEUE_RUN_TAG = "trainflow.gate_queue_run"  # on the queue: the MLflow run of its tickets
# A ticket's tags: its state, its beat and who holds it (user@host pid N).
STATE = "trainflow.ticket.state"
BEAT = "trainflow.ticket.beat"
HOLDER = "trainflow.ticket.holder"
# Its states: in the queue (waiting for its turn, or holding the lease once every lower
# ticket is done), and the two that are done.
QUEUED = "queued"
RELEASED = "released"
EXPIRED = "expired"
DONE = (RELEASED, EXPIRED)
LEASE_S = 60.0  # the default: registry.lease_s
POLL_S = 0.25  # how often a waiting ticket looks at the queue


class LeaseLost(RuntimeError):
    """The ticket no longer holds the model's lease: its process stalled past ``lease_s``
    and a waiter took it for crashed."""


def queue_name(name: str) -> str:
    return f"{name}{QUEUE_SUFFIX}"


def is_queue(tags: dict[str, str]) -> bool:
    """Whether a registered model's tags say it is a gate's queue, not a model."""
    return QUEUE_OF_TAG in tags


@dataclass
class Lease:
    """A held lease on a model's gate: its ticket in the model's queue."""

    c: MlflowClient
    queue: str
    ticket: str
    lease_s: float
    _stop: threading.Event = field(default_factory=threading.Event)

    def verify(self) -> None:
        """The fencing check: LeaseLost unless this ticket still holds the lease."""
        from mlflow.exceptions import MlflowException

        try:
            state = self.c.get_model_version(self.queue, self.ticket).tags.get(STATE)
        except MlflowException:
            state = None  # removed from the queue as done
        if state != QUEUED:
            raise LeaseLost(
                f"the gate's lease on {self.queue.removesuffix(QUEUE_SUFFIX)} was lost: this run "
                f"stalled for longer than registry.lease_s ({self.lease_s:g} s)"
            )

    def _beat(self) -> None:
        """Count the ticket's beat up every quarter of lease_s until the lease ends."""
        beat = 0
        while not self._stop.wait(self.lease_s / 4):
            beat += 1
            try:
                self.c.set_model_version_tag(self.queue, self.ticket, BEAT, str(beat))
            except Exception as e:  # a registry that does not answer for a moment: beat again
                log.debug("the gate's ticket %s/%s missed a beat: %s", self.queue, self.ticket, e)


def _ensure_queue(c: MlflowClient, ws: Workspace, name: str) -> tuple[str, str]:
    """The model's queue, made on first use; with the id of the MLflow run its tickets
    name as their source (a server takes a version only from a run's artifacts)."""
    from mlflow.exceptions import MlflowException

    queue = queue_name(name)
    try:
        return queue, c.get_registered_model(queue).tags[QUEUE_RUN_TAG]
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    run = c.create_run(experiment_id(c, ws), run_name=f"{name} gate queue")
    c.set_terminated(run.info.run_id)
    try:
        c.create_registered_model(
            queue,
            tags={QUEUE_OF_TAG: name, QUEUE_RUN_TAG: run.info.run_id},
            description=f"The promotion gate's queue for {name}, kept by trainflow: each version is "
            "a run's turn at moving its aliases.",
        )
        return queue, run.info.run_id
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    c.delete_run(run.info.run_id)  # another process made the queue first
    return queue, c.get_registered_model(queue).tags[QUEUE_RUN_TAG]


def _holder() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


@contextlib.contextmanager
def model_lease(c: MlflowClient, ws: Workspace, name: str, lease_s: float = LEASE_S) -> Iterator[Lease]:
    """Hold the lease on ``name``'s gate for the block; wait for it first."""
    queue, run_id = _ensure_queue(c, ws, name)
    tags = {STATE: QUEUED, BEAT: "0", HOLDER: _holder()}
    mv = c.create_model_version(queue, f"runs:/{run_id}/ticket", run_id=run_id, tags=tags)
    lease = Lease(c, queue, str(mv.version), lease_s)
    beating = threading.Thread(target=lease._beat, name="trainflow-gate-beat", daemon=True)
    beating.start()
    done_below: list[str] = []
    try:
        done_below = _wait_for_turn(lease)
        yield lease
    finally:
        lease._stop.set()
        with contextlib.suppress(Exception):  # else a waiter takes it for crashed in lease_s
            c.set_model_version_tag(queue, lease.ticket, STATE, RELEASED)
    for version in done_below:  # the queue's done tickets, cleared once the next turn runs
        with contextlib.suppress(Exception):  # another holder may have cleared it first
            c.delete_model_version(queue, version)


def _wait_for_turn(lease: Lease) -> list[str]:
    """Until every lower ticket in the queue is done (released, expired or gone): then
    this ticket holds the lease. Returns the done tickets below it."""
    c = lease.c
    ticket = int(lease.ticket)
    seen: dict[str, tuple[str | None, float]] = {}  # ticket: its beat, when that beat was first seen
    waited_on: str | None = None
    while True:
        tickets = c.search_model_versions(f"name='{lease.queue}'")
        ahead = [t for t in tickets if int(t.version) < ticket and t.tags.get(STATE) not in DONE]
        now = time.monotonic()
        alive = []
        for t in ahead:
            beat = t.tags.get(BEAT)
            if t.version not in seen or seen[t.version][0] != beat:
                seen[t.version] = (beat, now)
            if now - seen[t.version][1] < lease.lease_s:
                alive.append(t)
                continue
            log.warning(
                "the gate's lease of %s (%s) has not been renewed for %g s: taken as crashed",
                lease.queue.removesuffix(QUEUE_SUFFIX),
                t.tags.get(HOLDER, "another run"),
                lease.lease_s,
            )
            c.set_model_version_tag(lease.queue, t.version, STATE, EXPIRED)
        if not alive:
            return [t.version for t in tickets if int(t.version) < ticket and t.tags.get(STATE) in DONE]
        holder = alive[0].tags.get(HOLDER, "another run")
        if holder != waited_on:
            log.info("waiting for the gate of %s: %s has it", lease.queue.removesuffix(QUEUE_SUFFIX), holder)
            waited_on = holder
        time.sleep(POLL_S)
