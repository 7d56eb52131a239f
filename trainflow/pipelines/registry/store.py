"""Where the registry lives and how it is opened.

The registry is the embedded SQLite store under TRAINFLOW_HOME unless
MLFLOW_TRACKING_URI points at an MLflow server. The embedded store is one SQLite file
that several processes write to, so every client call retries while the database is
locked, and a file lock lets one process at a time create or upgrade its tables. (Who
moves a model's aliases when is the gate's lease, kept in the registry: ``lease``.)
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
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
