"""``trainflow ui``: MLflow's UI over trainflow's registry until Ctrl-C, and the Prefect
UI's address.

MLflow's UI runs from MLflow's full environment, a venv of its own in the user's cache
folder made on first use (:mod:`trainflow.stack.mlflow_env`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainflow.cli.root import app, fail
from trainflow.stack.mlflow_env import UIError, last_error, ui_python

if TYPE_CHECKING:
    from trainflow.workspace import Workspace

READY_TIMEOUT_S = 180  # MLflow's server, started cold on a busy machine, before it answers
STOP_TIMEOUT_S = 10  # after SIGTERM, before SIGKILL


@dataclass
class Server:
    process: subprocess.Popen
    log: Path
    url: str  # where this machine reaches it


HostOpt = Annotated[
    str, typer.Option(help="The address MLflow's UI listens on; 127.0.0.1 keeps it on this machine.")
]
PortOpt = Annotated[int, typer.Option(min=1, max=65535, help="MLflow's UI port.")]


@app.command("ui")
def ui(host: HostOpt = "127.0.0.1", port: PortOpt = 5000) -> None:
    """Open MLflow's UI over trainflow's registry until Ctrl-C.

    It shows the models, their versions, aliases and runs; the Prefect UI's address is
    printed too when a Prefect server is configured. The first run installs MLflow's UI
    into an environment of its own (a minute or two); later runs reuse it.
    """
    ws, uri = _registry()
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow UI: {uri.rstrip('/')} (the MLflow server MLFLOW_TRACKING_URI names)")
        typer.echo(prefect_line())
        return
    try:
        check_port(host, port)
    except ValueError as e:
        raise fail(str(e)) from None
    serving = False
    try:
        with stop_signals_interrupt():
            python = ui_python(typer.echo)
            typer.echo(f"starting MLflow's UI over {uri} ...")
            with started(python, uri, ws, host, port) as server:
                where = f"; listening on {host}" if _local(host) != host else ""
                typer.echo(f"MLflow UI: {server.url} (models: {server.url}/#/models{where}); Ctrl-C stops")
                typer.echo(prefect_line())
                serving = True
                serve_until_stopped(server)
    except UIError as e:
        raise fail(str(e), code=1) from None
    except KeyboardInterrupt:
        typer.echo("stopped")
        raise typer.Exit(0 if serving else 130) from None


def _registry() -> tuple[Workspace, str]:
    """The workspace and the registry's URI, as trainflow's registry opens it."""
    from trainflow.pipelines.registry.store import tracking_uri
    from trainflow.workspace import workspace

    ws = workspace()
    return ws, tracking_uri(ws)


def check_port(host: str, port: int) -> None:
    """ValueError when ``host:port`` cannot be listened on (in use, not an address here)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn, MLflow's server, does
        try:
            s.bind(address)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port") from None


def mlflow_command(python: Path, uri: str, ws: Workspace, host: str, port: int) -> list[str]:
    """``mlflow ui`` over the registry at ``uri``, with one worker (one person browses). An
    experiment made in the UI keeps its artifacts in TRAINFLOW_HOME/mlartifacts, beside
    trainflow's own, not in ./mlartifacts of the folder the command runs in."""
    return [
        str(python), "-m", "mlflow", "ui",
        "--backend-store-uri", uri,
        "--artifacts-destination", str(ws.artifacts),
        "--host", host,
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip


@contextlib.contextmanager
def started(python: Path, uri: str, ws: Workspace, host: str, port: int) -> Iterator[Server]:
    """MLflow's UI, started and answering; stopped when the block ends. Its output goes to
    TRAINFLOW_HOME/mlflow-ui.log. It runs in a session of its own, so that a Ctrl-C
    reaches this command alone, which stops it (SIGTERM, then SIGKILL)."""
    log = ws.home / "mlflow-ui.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own packages only
    # MLflow's server jobs (GenAI scoring, trace archival) run in a job runner and its queue
    # consumers, processes that browsing a registry does not need; a user may turn them on.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    with open(log, "w") as out:
        process = subprocess.Popen(
            mlflow_command(python, uri, ws, host, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    server = Server(process, log, _url(_local(host), port))
    try:
        _wait_until_ready(server)
        yield server
    finally:
        stop(process)


def _local(host: str) -> str:
    """Where this machine reaches a server listening on ``host``."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _wait_until_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers(f"{server.url}/health"):
        code = server.process.poll()
        if code is not None:
            raise UIError(
                f"MLflow's UI ended as it started (exit code {code}): {last_error(server.log)}; "
                f"its log: {server.log}"
            )
        if time.monotonic() > deadline:
            raise UIError(f"MLflow's UI did not answer within {READY_TIMEOUT_S} s; its log: {server.log}")
        time.sleep(0.25)


def _answers(url: str, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: it is up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def serve_until_stopped(server: Server) -> None:
    """Wait until Ctrl-C (a KeyboardInterrupt); MLflow's UI ending first is a failure."""
    code = server.process.wait()
    raise UIError(f"MLflow's UI stopped (exit code {code}): {last_error(server.log)}; its log: {server.log}")


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command as Ctrl-C does (KeyboardInterrupt): MLflow's UI,
    in a session of its own, is then stopped with it, not left running. Outside the main
    thread (where Python runs signal handlers), nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def stop(process: subprocess.Popen) -> None:
    """End MLflow's UI and every process it started (its session's process group)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def prefect_ui() -> tuple[str | None, bool]:
    """The Prefect UI's address when a Prefect server is configured (PREFECT_API_URL, in
    the environment or the active profile: its UI is that URL less ``/api``, as Prefect
    derives it, Prefect Cloud's included), and whether its API answers now."""
    from prefect.settings import Settings

    settings = Settings()  # read now, from the environment and the profile
    api = settings.api.url
    if not api:
        return None, False
    return (settings.ui_url or api).rstrip("/"), _answers(f"{api.rstrip('/')}/health")


def prefect_line() -> str:
    url, answers = prefect_ui()
    if url is None:
        return (
            "Prefect UI: no server configured (each run starts a temporary one that ends with it); "
            "`prefect server start` and PREFECT_API_URL=http://127.0.0.1:4200/api keep one"
        )
    return f"Prefect UI: {url}" + ("" if answers else " (its server does not answer now)")
