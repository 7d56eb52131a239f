"""A team's shared services for the tests, on loopback, with the team stack's own code
(``trainflow.stack``): PostgreSQL (the machine's own server programs, as the ``postgres``
user when the tests run as root) and an MLflow tracking server on it with its artifact
store, from MLflow's full environment (the one `trainflow ui` keeps) with PostgreSQL's
driver added.

Each is started in a process group of its own and stopped by its process id."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainflow.stack.mlflow_env import mlflow_python
from trainflow.stack.services import Postgres, StackError, postgres_bin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres() -> Iterator[str]:
    """A new PostgreSQL cluster on a free loopback port with a database ``mlflow`` and a
    user ``trainflow``, as `trainflow stack up` makes it; yields its SQLAlchemy URI for
    psycopg2. Skips when the machine has no PostgreSQL server."""
    if postgres_bin() is None:
        pytest.skip("no PostgreSQL server on this machine (apt-get install postgresql)")
    server = Postgres(Path(tempfile.mkdtemp(prefix="trainflow-pg-")), free_port(), secrets.token_urlsafe(16))
    try:
        server.start(("mlflow",))
        yield server.uri("mlflow", "psycopg2")
    finally:
        server.stop()
        server.delete()
        shutil.rmtree(server.folder, ignore_errors=True)


def with_postgres_driver() -> str:
    """MLflow's full environment with psycopg2, as the team stack's MLflow server runs."""
    try:
        return str(mlflow_python(lambda _: None))
    except StackError as e:
        pytest.skip(str(e))


@contextmanager
def mlflow_server(python: str, backend_uri: str, folder: Path) -> Iterator[str]:
    """`mlflow server` on a free loopback port over ``backend_uri``, serving its artifacts
    from ``folder``/artifacts, two workers; yields its URL once it answers."""
    port = free_port()
    log = folder / "mlflow-server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [python, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
             "--artifacts-destination", str(folder / "artifacts"), "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _answers(f"{url}/health"):
            assert proc.poll() is None, f"mlflow server ended: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mlflow server did not answer: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
