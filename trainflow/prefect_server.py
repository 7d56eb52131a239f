"""Prefect's temporary API server for one command, started first and waited on with a
deadline that fits a busy machine.

With no ``PREFECT_API_URL``, a flow run starts Prefect's temporary server itself on its
first API call and gives it ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` (20)
to answer. Its first start on a machine runs every database migration, and on two busy
cores, beside a Ray cluster and torch imports starting at the same time, it can miss
that deadline: the run then fails before it begins. ``trainflow run``, ``sweep`` and
``predict`` start the same server (``uvicorn prefect.server.api.server:create_app``, as
Prefect does) before Ray and torch start (``trainflow.runtime``), point
``PREFECT_API_URL`` at it, and wait for its health check right before the flow needs
it, for up to TRAINFLOW_START_TIMEOUT seconds (:mod:`trainflow.start_wait`, which bounds
Ray's start too); if it exits or misses that, the command fails in one line saying what to do.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from trainflow.start_wait import START_TIMEOUT_ENV, machine_load, start_timeout

log = logging.getLogger("trainflow")

# The server's health check is waited for TRAINFLOW_START_TIMEOUT seconds, counted from
# its start: an empty PREFECT_HOME runs every migration first (benchmarks/results.md,
# overhead phase by phase, times a first run), and two busy cores stretch it. A value of
# PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS in the environment wins, for it alone.
TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
# uvicorn's exit code when the app's start-up failed, or its port was taken in between.
_STARTUP_FAILED = 3


# The server's process: uvicorn, in a session of its own, ended by the kernel however its
# command dies (PR_SET_PDEATHSIG, Linux, when the starting thread ends: commands start it
# in their main thread; on macOS only the command's stop ends it). argv: the command's pid,
# ``--unless-configured`` (TemporaryServer.start_early), uvicorn's arguments.
_ENDS_WITH_PARENT = """
import gc
gc.disable()  # till the app's imports are done and frozen: no collection walks them again
import ctypes, os, runpy, signal, sys
parent = int(sys.argv[1])
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # the command died before the line above ran
    sys.exit(1)
if sys.argv[2] == "--unless-configured":
    del sys.argv[2]
    from prefect.settings import get_current_settings
    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        sys.exit(0)
# What Prefect's own temporary server runs with: no UI, no background services.
os.environ.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
if "prefect.settings" in sys.modules:
    from prefect.context import refresh_global_settings_context
    refresh_global_settings_context()
import prefect.server.api.server, uvicorn.main
gc.freeze()
gc.enable()
sys.argv = ["uvicorn", *sys.argv[2:]]
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""


class PrefectServerError(RuntimeError):
    """The temporary server did not come up; the message says what to do."""


def configured_api_url() -> str | None:
    """The Prefect API a flow run would use (environment or profile), or None when it
    would start a temporary server of its own."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return str(settings.api.url)
    if not settings.server.ephemeral.enabled:
        return "(PREFECT_SERVER_EPHEMERAL_ENABLED=false)"
    return None


def _prefect_parent() -> Path:
    """The folder Prefect's package is in, found without importing it."""
    import importlib.util

    return Path(importlib.util.find_spec("prefect").origin).parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TemporaryServer:
    """Prefect's temporary server in a subprocess on loopback, for this process's flows."""

    def __init__(self, log_path: Path, timeout_s: float | None = None) -> None:
        self.log_path = log_path
        self._timeout_s = timeout_s
        self.process: subprocess.Popen | None = None
        # Where the output of a server started early goes until it is entered, then renamed
        # to log_path: a command whose checks failed leaves no server log behind.
        self._early_log: Path | None = None
        self.port = 0
        self._settings = None

    @property
    def timeout_s(self) -> float:
        """Seconds to wait for the server: the caller's, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        else TRAINFLOW_START_TIMEOUT (a bad value of which is a ConfigError, at the wait)."""
        env_timeout = os.environ.get(TIMEOUT_ENV)
        return self._timeout_s or (float(env_timeout) if env_timeout else start_timeout())

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> TemporaryServer:
        """Start the server (unless :meth:`start_early` did) and point this process's
        Prefect client at it until exit."""
        if self.process is None:
            self._start()
        if self._early_log is not None:
            os.replace(self._early_log, self.log_path)
            self._early_log = None
        self._point_at_server()
        return self

    def start_early(self) -> TemporaryServer:
        """Start the server's process now, before this process has read Prefect's settings
        (importing Prefect takes a second of the command's checks): the process reads them
        itself and leaves at once when they name a server. Enter this object (or
        :meth:`stop` it) after all; the command's exit stops it too."""
        import atexit

        self._early_log = self.log_path.with_name(f"{self.log_path.name}.early")
        self._start(unless_configured=True)
        atexit.register(self.stop)
        return self

    def _point_at_server(self) -> None:
        """PREFECT_API_URL for this process: in the environment, for Prefect's
        process-wide settings (what threads without a settings context of their own
        read, such as the one that follows training progress) and for this thread's."""
        from prefect.context import refresh_global_settings_context
        from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

        if self._settings is not None:
            self._settings.__exit__(None, None, None)
        # No UI here: without an empty UI URL, Prefect logs a "View at" link to nothing.
        urls = {"PREFECT_API_URL": self.api_url, "PREFECT_UI_URL": ""}
        os.environ.update(urls)
        refresh_global_settings_context()
        self._settings = temporary_settings(updates={PREFECT_API_URL: self.api_url, PREFECT_UI_URL: ""})
        self._settings.__enter__()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self, unless_configured: bool = False) -> None:
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
        if not unless_configured:  # as this process's settings have them, overrides in force included
            from prefect.settings import get_current_settings

            settings = get_current_settings().to_environment_variables(exclude_unset=True)
            env.update({k: v for k, v in settings.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._early_log or self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _ENDS_WITH_PARENT,
                    str(os.getpid()),
                    *(["--unless-configured"] if unless_configured else []),
                    "--app-dir",
                    str(_prefect_parent()),
                    "--factory",
                    "prefect.server.api.server:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Out of the command's process group: Ctrl-C (SIGINT to the terminal's
                # foreground group) or a stop of the whole group must not take the API
                # away while the flow run still reports its end to it (Prefect would then
                # retry against nothing, a traceback at a time). The command stops it.
                start_new_session=True,
            )
        self.started = time.monotonic()

    def wait(self, check: Callable[[], None] = lambda: None) -> None:
        """Return once the server answers its health check; PrefectServerError if it exits
        or has not answered within the deadline (counted from its start). ``check`` is
        called between tries (it may raise: a Ctrl-C the caller holds back)."""
        deadline = self.started + self.timeout_s
        retries = 3
        while True:
            code = self.process.poll()
            if code == _STARTUP_FAILED and "address already in use" in self._log() and retries:
                retries -= 1  # another process took the port in between: again on another
                self._start()
                self._point_at_server()
                continue
            if code is not None:
                raise PrefectServerError(
                    f"Prefect's temporary server exited with code {code} before it answered: "
                    f"{self._last_log_line()} (whole log: {self.log_path}); start a server with "
                    "`prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise PrefectServerError(
                    f"Prefect's temporary server did not answer within {self.timeout_s:g} s "
                    f"(log: {self.log_path}; {machine_load()}): set {START_TIMEOUT_ENV} higher "
                    f"({TIMEOUT_ENV} for this server alone), or start a server with `prefect server "
                    "start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
                )
            check()
            time.sleep(0.1)

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _last_log_line(self) -> str:
        """The server log's last error line (an exception's), else its last line."""
        lines = [line.strip() for line in self._log().splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
        return (errors or lines or ["no output"])[-1]

    def stop(self) -> None:
        """Send what Prefect's background workers still hold (logs, events), then stop
        the server: sent after it, they would be retried against nothing for a minute.
        A server never entered (a command whose checks failed) has nothing to send."""
        if self._settings is not None and self.process is not None and self.process.poll() is None:
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            for worker in (APILogWorker, EventsWorker):
                worker.drain_all(timeout=10, at_exit=False)
        if self._settings is not None:
            self._settings.__exit__(None, None, None)
            self._settings = None
        if os.environ.get("PREFECT_API_URL") == self.api_url:
            from prefect.context import refresh_global_settings_context

            del os.environ["PREFECT_API_URL"]
            os.environ.pop("PREFECT_UI_URL", None)
            refresh_global_settings_context()
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        if self._early_log is not None:  # started early, never entered
            self._early_log.unlink(missing_ok=True)


def record_failed_run(flow: str, name: str, message: str, parameters: dict | None = None) -> None:
    """A flow run ``name`` of the flow ``flow``, Failed with ``message``, on the Prefect
    server the environment names: a run that failed its checks before its flow started
    shows on a team's server beside the runs that started. Nothing where a flow run would
    start a temporary server, or where the server does not answer within seconds (the
    command's own one line says what failed)."""
    url = configured_api_url()
    if not url or not url.startswith(("http://", "https://")) or not _answers(url):
        return
    from prefect import Flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, temporary_settings
    from prefect.states import Failed

    def not_started() -> None:
        """The flow, as its run that failed its checks: never called."""

    try:
        with temporary_settings({PREFECT_API_REQUEST_TIMEOUT: 5.0}), get_client(sync_client=True) as client:
            client.create_flow_run(
                Flow(not_started, name=flow),
                name=name,
                parameters=parameters or {},
                tags=["trainflow"],
                state=Failed(message=message),
            )
    except Exception:  # noqa: BLE001 - the run's own error is what the user reads
        log.debug("could not record the failed run on %s", url, exc_info=True)


def _answers(api_url: str) -> bool:
    """Whether anything answers at the Prefect API's address, within two seconds (its
    client would retry a refused connection for longer)."""
    try:
        urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True
