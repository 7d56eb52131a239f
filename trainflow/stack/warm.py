"""A warm start for one user's runs (``trainflow up`` and ``down``): a local Ray cluster and
a Prefect server kept running in the background, in ``<TRAINFLOW_HOME>/warm/``, which
``trainflow run``, ``sweep`` and ``predict`` started from the same workspace find and use
(:func:`attach`) instead of starting their own, and a forkserver those commands start in
(:mod:`trainflow.stack.forkserver`). A watcher process stops them once no command has
used them for the idle time (:data:`IDLE_MINUTES` by default).

Ray's head keeps token auth on (the folder's ``auth_token``, 0600) and its workers the
driver's priority, as on the clusters a run starts itself; every service listens on
loopback. ``warm.json`` records each service's port and process."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainflow.files import replacing_file
from trainflow.ray_internals import switches
from trainflow.stack import worker_forks
from trainflow.stack.forkserver import SERVE, SOCKET, ray_auth_env
from trainflow.stack.services import (
    alive,
    answers,
    free_port,
    port_open,
    start,
    stop,
    stop_members,
    wait_until,
)

IDLE_MINUTES = 30.0  # unused this long, the services stop
START_TIMEOUT_S = 180.0  # a service started on a busy machine, before it answers
SERVICES = ("ray-head", "prefect", "forkserver", "workers", "watcher")
# Variables of the shell ``up`` runs in that would point a service at another one.
NOT_INHERITED = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "PREFECT_API_URL", "PREFECT_UI_URL")


@dataclass
class Warm:
    """The warm services of one workspace: ``folder`` is ``<TRAINFLOW_HOME>/warm``."""

    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    idle_minutes: float = IDLE_MINUTES

    @classmethod
    def load(cls, folder: Path) -> Warm:
        state = folder / "warm.json"
        if not state.is_file():
            return cls(folder)
        saved = json.loads(state.read_text())
        return cls(folder, saved["ports"], saved["pids"], saved["idle_minutes"])

    def save(self) -> None:
        """warm.json, written whole (a temporary file renamed over it)."""
        state = {k: v for k, v in asdict(self).items() if k != "folder"}
        with replacing_file(self.folder / "warm.json") as tmp:
            tmp.write_text(json.dumps(state, indent=2))

    @property
    def token_file(self) -> Path:
        return self.folder / "auth_token"

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.ports['ray']}"

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.ports['prefect']}/api"

    def running(self) -> bool:
        """Whether Ray's head and the Prefect server run and listen."""
        return (
            bool(self.ports)
            and all(alive(self.pids.get(name)) for name in ("ray-head", "prefect"))
            and port_open(self.ports["ray"])
            and port_open(self.ports["prefect"])
        )

    def client_env(self) -> dict[str, str]:
        """What a command sets to use the services."""
        from trainflow.cluster.session import OWN_CLUSTER_ENV, WORKER_PYTHON_ENV

        return {
            "RAY_ADDRESS": self.ray_address,
            OWN_CLUSTER_ENV: self.ray_address,
            WORKER_PYTHON_ENV: worker_forks.worker_python(self.folder),
            **ray_auth_env(self.folder),
            "PREFECT_API_URL": self.prefect_api,
        }


def warm_folder(home: Path) -> Path:
    return home / "warm"


def up(home: Path, idle_minutes: float = IDLE_MINUTES, say: Callable[[str], None] = print) -> Warm:
    """Start the warm services of the workspace ``home`` unless they run, and wait until
    each answers; on a failure, stop what started and raise StackError."""
    warm = Warm.load(warm_folder(home))
    if warm.running():
        return warm
    _stop(warm)
    ports = {name: free_port() for name in ("ray", "client", "prefect")}
    warm = Warm(warm_folder(home), ports, {}, idle_minutes)
    warm.folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(warm.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    try:
        _start(warm, say)
    except BaseException:
        _stop(warm)
        raise
    return warm


def _start(warm: Warm, say: Callable[[str], None]) -> None:
    from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV, QUIET_ENV

    env = {**QUIET_ENV, **{k: v for k, v in os.environ.items() if k not in NOT_INHERITED}}
    bin_dir = Path(sys.executable).parent
    head = [
        *[bin_dir / "ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1"],
        *[f"--port={warm.ports['ray']}", f"--ray-client-server-port={warm.ports['client']}"],
        *["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={_ray_temp(warm)}"],
        # A port of the system's choosing for the node's dashboard agent: Ray's fixed 52365 held
        # here would cost every other Ray node started on this machine (a command's own local
        # cluster) about 3.5 s of retries before its agent gives up on it.
        "--dashboard-agent-listen-port=0",
    ]
    ray_env = {**LOCAL_CLUSTER_ENV, **ray_auth_env(warm.folder)}
    # One node: on `trainflow down` nothing can take over its work, so no drain to wait for.
    ray_env[switches.SHUTDOWN_DRAIN_TIMEOUT] = "0"
    say(f"Ray on {warm.ray_address} ...")
    warm.pids["ray-head"] = start("ray-head", head, {**env, **ray_env}, warm.folder)
    server = [bin_dir / "prefect", "server", "start", "--host", "127.0.0.1", "--port", warm.ports["prefect"]]
    say(f"Prefect server on {warm.prefect_api.removesuffix('/api')} ...")
    warm.pids["prefect"] = start("prefect", [*server, "--analytics-off"], env, warm.folder)
    # The forkserver: imports what a run imports while the other two start.
    forkserver = [sys.executable, "-m", "trainflow.cli", SERVE, warm.folder]
    # It imports Ray as the commands that use the warm cluster do: with its token auth.
    forkserver_env = {**env, **ray_auth_env(warm.folder)}
    warm.pids["forkserver"] = start("forkserver", forkserver, forkserver_env, warm.folder)
    # The worker forkserver: PyTorch imported once for every Ray worker of the cluster.
    workers = [sys.executable, "-m", "trainflow.stack.worker_forks", warm.folder]
    warm.pids["workers"] = start("workers", workers, env, warm.folder)
    warm.save()
    _await(warm, "ray-head", "Ray's head", lambda: "Ray runtime started" in _log(warm, "ray-head"))
    _await(warm, "prefect", "the Prefect server", lambda: answers(f"{warm.prefect_api}/health"))
    _await(warm, "forkserver", "the forkserver", (warm.folder / SOCKET).is_socket)
    _await(warm, "workers", "the worker forkserver", (warm.folder / worker_forks.SOCKET).is_socket)
    watcher = [sys.executable, "-m", "trainflow.stack.warm", str(warm.folder)]
    warm.pids["watcher"] = start("watcher", watcher, env, warm.folder)
    warm.save()


def _await(warm: Warm, name: str, what: str, ready: Callable[[], bool]) -> None:
    wait_until(ready, what, warm.pids[name], warm.folder, name, START_TIMEOUT_S)


def _log(warm: Warm, name: str) -> str:
    log = warm.folder / "logs" / f"{name}.log"
    return log.read_text(errors="replace") if log.is_file() else ""


def _ray_temp(warm: Warm) -> Path:
    """Ray's session folder: short (its socket paths must fit 107 bytes), one per workspace."""
    digest = hashlib.sha256(str(warm.folder).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"tf-warm-{digest}"


def down(home: Path) -> bool:
    """Stop the warm services of the workspace ``home``; False when none ran."""
    warm = Warm.load(warm_folder(home))
    was_running = warm.running()
    _stop(warm)
    return was_running


def _stop(warm: Warm) -> None:
    """Stop the services and what they left running (Ray's workers), and forget them."""
    stop([pid for name, pid in warm.pids.items() if name != "watcher" or pid != os.getpid()])
    stop_members(warm.folder)
    (warm.folder / "warm.json").unlink(missing_ok=True)
    (warm.folder / SOCKET).unlink(missing_ok=True)
    (warm.folder / worker_forks.SOCKET).unlink(missing_ok=True)
    shutil.rmtree(_ray_temp(warm), ignore_errors=True)


def attach(home: Path, ray_address: str | None) -> Warm | None:
    """Point this command at the warm services of ``home``, where they run: Ray, unless
    the config or RAY_ADDRESS names a cluster, and Prefect, unless an API is configured.
    Marks the services used now and while this process lives. None: none run. The caller
    refreshes Prefect's settings when it set PREFECT_API_URL."""
    from trainflow.prefect_server import configured_api_url

    warm = Warm.load(warm_folder(home))
    if not warm.pids or not warm.running():
        return None
    env = warm.client_env()
    if ray_address or os.environ.get("RAY_ADDRESS"):
        env = {k: v for k, v in env.items() if k == "PREFECT_API_URL"}
    if configured_api_url() is not None:
        env.pop("PREFECT_API_URL")
    if not env:
        return None
    os.environ.update(env)
    clients = warm.folder / "clients"
    clients.mkdir(exist_ok=True)
    (clients / str(os.getpid())).touch()
    return warm


def in_use(warm: Warm) -> bool:
    """Whether a command that attached to the services still runs; forgets those that ended."""
    clients = warm.folder / "clients"
    using = False
    for mark in clients.iterdir() if clients.is_dir() else []:
        if alive(int(mark.name)):
            using = True
        else:
            mark.unlink(missing_ok=True)
    return using


def watch(folder: Path) -> None:
    """The watcher's loop: stop the services once no command has used them for their idle
    time, or when one of them ended."""
    warm = Warm.load(folder)
    idle_s = warm.idle_minutes * 60
    every = max(0.5, min(10.0, idle_s / 4))
    last_used = time.monotonic()
    while True:
        time.sleep(every)
        warm = Warm.load(folder)
        if not warm.pids:
            return
        if in_use(warm):
            last_used = time.monotonic()
        if not warm.running() or time.monotonic() - last_used >= idle_s:
            _stop(warm)
            return


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
