"""A team's shared services for the tests, on loopback: PostgreSQL (the machine's own
server binaries, run as the ``postgres`` user when the tests run as root, which
PostgreSQL refuses) and an MLflow tracking server on it with its artifact store, from
MLflow's full environment (the one `trainflow ui` keeps) with PostgreSQL's driver added.

Each is started in a process group of its own and stopped by its process id."""

from __future__ import annotations

import os
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

from trainflow.stack.services import postgres_bin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner() -> list[str]:
    """PostgreSQL will not run as root: as root, run its programs as ``postgres``."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@contextmanager
def postgres() -> Iterator[str]:
    """A new PostgreSQL cluster on a free loopback port with a database ``mlflow`` and a
    user ``trainflow``; yields its SQLAlchemy URI for psycopg2. Skips when the machine has
    no PostgreSQL server."""
    bin_ = postgres_bin()
    if bin_ is None:
        pytest.skip("no PostgreSQL server on this machine (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="trainflow-pg-"))
    root.chmod(0o777)  # its owner, postgres when the tests run as root, writes here
    data, port = root / "data", free_port()
    owner = _as_owner()
    run = dict(check=True, capture_output=True, text=True, timeout=120)
    subprocess.run([*owner, bin_ / "initdb", "-D", data, "-U", "trainflow", "--auth=trust"], **run)
    server = [*owner, bin_ / "pg_ctl", "-D", data, "-l", root / "postgres.log"]
    options = f"-h 127.0.0.1 -p {port} -k {root}"  # TCP on loopback only; its socket in root
    subprocess.run([*server, "-o", options, "-w", "start"], **run)
    try:
        createdb = [bin_ / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "trainflow", "mlflow"]
        subprocess.run(createdb, **run)
        yield f"postgresql+psycopg2://trainflow@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run([*server, "-m", "fast", "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def with_postgres_driver(python: str) -> str:
    """``python`` (MLflow's full environment) with psycopg2, installed once."""
    if subprocess.run([python, "-c", "import psycopg2"], capture_output=True).returncode != 0:
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "psycopg2-binary"]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"psycopg2-binary does not install for MLflow's server: {done.stderr[-500:]}")
    return python


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
