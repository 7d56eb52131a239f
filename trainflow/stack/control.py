"""``trainflow stack up | status | env | down``: a team's services on this machine, in a
folder of their own.

The folder keeps ``stack.json`` (each service's port and process, PostgreSQL's password:
mode 0600), ``ray/auth_token`` (the Ray cluster's token, 0600), MLflow's artifact store
(``artifacts/``), Prefect's home, the workers' ``home/`` (TRAINFLOW_HOME of the runs the
Prefect worker starts) and ``logs/``. Ports are chosen free at the first ``up`` and kept,
so the URLs a team wrote down stay true after ``down`` and ``up``."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.stack.mlflow_env import mlflow_python
from trainflow.stack.services import (
    Postgres,
    StackError,
    alive,
    answers,
    free_port,
    members,
    port_open,
    start,
    stop,
    stop_members,
    wait_until,
)

POOL = "trainflow"  # the work pool of deployments/prefect.yaml
PREFECT = Path(sys.executable).with_name("prefect")
START_TIMEOUT_S = 240.0  # a service started cold on a busy machine, before it answers
# The stack's services, in the order they start.
SERVICES = ("postgres", "mlflow", "prefect", "ray-head", "ray-node", "worker")
# Variables of the shell ``up`` runs in that would point a service at another one.
NOT_INHERITED = (
    *("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "PYTHONPATH"),
    *("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "TRAINFLOW_HOME"),
)


def default_folder() -> Path:
    """TRAINFLOW_STACK, else trainflow/stack in the user's data folder (XDG_DATA_HOME,
    else ~/.local/share)."""
    if os.environ.get("TRAINFLOW_STACK"):
        return Path(os.environ["TRAINFLOW_STACK"]).expanduser().resolve()
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "trainflow" / "stack"


@dataclass
class Health:
    name: str
    url: str
    healthy: bool
    detail: str = ""


@dataclass
class Stack:
    """A team stack's folder and what ``stack.json`` records of it."""

    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    password: str = ""
    node_cpus: float = 1

    @classmethod
    def load(cls, folder: Path) -> Stack:
        folder = folder.resolve()
        state = folder / "stack.json"
        if not state.is_file():
            return cls(folder)
        saved = json.loads(state.read_text())
        return cls(
            folder, saved["ports"], saved.get("pids", {}), saved["password"], saved.get("node_cpus", 1)
        )

    @property
    def exists(self) -> bool:
        return (self.folder / "stack.json").is_file()

    def save(self) -> None:
        """stack.json, written whole (a temporary file renamed over it), readable by its owner only."""
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {
            "ports": self.ports,
            "pids": self.pids,
            "password": self.password,
            "node_cpus": self.node_cpus,
        }
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".stack-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
        os.replace(tmp, self.folder / "stack.json")

    @property
    def postgres(self) -> Postgres:
        return Postgres(self.folder, self.ports["postgres"], self.password)

    @property
    def token_file(self) -> Path:
        return self.folder / "ray" / "auth_token"

    @property
    def ray_temp(self) -> Path:
        """Ray's session folder: short (its socket paths must fit 107 bytes), one per stack."""
        return (
            Path(tempfile.gettempdir())
            / f"tf-stack-{hashlib.sha256(str(self.folder).encode()).hexdigest()[:10]}"
        )

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['mlflow']}"

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.ports['prefect']}/api"

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.ports['ray']}"

    @property
    def ray_client(self) -> str:
        return f"ray://127.0.0.1:{self.ports['ray_client']}"

    def client_env(self, ray_client: bool = False) -> dict[str, str]:
        """What a shell, a run or a worker needs to use the stack; ``ray_client``: reach Ray
        through Ray Client (``ray://``), as a machine off the cluster does."""
        return {
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "PREFECT_API_URL": self.prefect_api,
            "RAY_ADDRESS": self.ray_client if ray_client else self.ray_address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_file),
        }

    def base_env(self) -> dict[str, str]:
        from trainflow.cluster.quiet import QUIET_ENV

        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED and not k.startswith("PREFECT_")}
        return {**QUIET_ENV, **env}


def default_node_cpus() -> int:
    """Half the machine's CPUs per node, at least 2: on a small machine a served model's
    replica, a batch prediction's actor and the task reading its rows each hold a CPU
    (Ray's CPUs are counts of slots, not cores), and one CPU a node would leave the
    reading task waiting on the other two for ever."""
    return max(2, (os.cpu_count() or 2) // 2)


def new_stack(folder: Path, node_cpus: float) -> Stack:
    """A stack's ports, PostgreSQL's password and Ray's token, chosen once."""
    names = ("postgres", "mlflow", "prefect", "ray", "ray_client", "dashboard")
    stack = Stack(folder.resolve(), {n: free_port() for n in names}, {}, secrets.token_urlsafe(24), node_cpus)
    stack.token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(stack.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    stack.save()
    return stack


def up(
    folder: Path,
    *,
    node_cpus: float | None = None,
    deployments: Path | None = None,
    say: Callable[[str], None] = print,
) -> Stack:
    """Start every service of the stack in ``folder`` that is not running, and wait until
    each answers; on a failure, stop what this call started and raise StackError.

    ``node_cpus``: the CPUs each of Ray's two nodes offers (default: :func:`default_node_cpus`);
    ``deployments``: a ``prefect.yaml`` whose deployments are applied (from the folder it
    sits under, a checkout of trainflow), or None."""
    stack = Stack.load(folder)
    if not stack.exists:
        stack = new_stack(folder, node_cpus or default_node_cpus())
    elif node_cpus:
        stack.node_cpus = node_cpus
    started: list[str] = []
    try:
        _start_services(stack, started, deployments, say)
    except BaseException:
        if started:
            say(f"stopping what started: {', '.join(started)}")
            _stop(stack, only=started)
        raise
    return stack


def _start_services(
    stack: Stack, started: list[str], deployments: Path | None, say: Callable[[str], None]
) -> None:
    """Each service not running, in order, each awaited before what needs it."""
    if not stack.postgres.running():
        say(f"PostgreSQL on 127.0.0.1:{stack.ports['postgres']} ...")
        stack.postgres.start(("mlflow", "prefect"))
        started.append("postgres")
    launch = _Launcher(stack, started)
    if launch(
        "mlflow", mlflow_command(stack, mlflow_python(say)), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"
    ):
        say(f"MLflow server on {stack.mlflow_url} ...")
    server = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", stack.ports["prefect"]]
    prefect_db = stack.postgres.uri("prefect", "asyncpg")
    if launch(
        "prefect",
        server,
        PREFECT_HOME=str(stack.folder / "prefect"),
        PREFECT_API_DATABASE_CONNECTION_URL=prefect_db,
    ):
        say(f"Prefect server on {stack.prefect_api} ...")
    _start_ray(stack, launch, say)
    _await(stack, "mlflow", "the MLflow server", lambda: answers(f"{stack.mlflow_url}/health"))
    _await(stack, "prefect", "the Prefect server", lambda: answers(f"{stack.prefect_api}/health"))
    _work_pool(stack, launch.env)
    if deployments is not None:
        say(f"applying the deployments of {deployments} ...")
        _deploy(stack, launch.env, deployments)
    # The worker's runs reach Ray through Ray Client, as from a machine off the cluster.
    worker = [PREFECT, "worker", "start", "--pool", POOL, "--type", "process"]
    home = stack.folder / "home"
    checkout = deployments.resolve().parent.parent if deployments else stack.folder
    extra = {
        **stack.client_env(ray_client=True),
        "TRAINFLOW_HOME": str(home),
        "PREFECT_HOME": str(stack.folder / "worker"),
    }
    if launch("worker", worker, cwd=checkout, **extra):
        say(f"a Prefect worker on the {POOL} pool ...")
    _await(stack, "worker", "the Prefect worker", lambda: _worker_online(stack))


class _Launcher:
    """Starts a service unless its process runs, records its pid in stack.json at once
    (so that a failed ``up`` stops it) and in ``started``."""

    def __init__(self, stack: Stack, started: list[str]):
        self.stack = stack
        self.started = started
        self.env = stack.base_env()

    def __call__(self, name: str, args: list, cwd: Path | None = None, **extra: str) -> bool:
        stack = self.stack
        if alive(stack.pids.get(name)):
            return False
        (stack.folder / "logs" / f"{name}.log").unlink(missing_ok=True)  # readiness is read from a new log
        stack.pids[name] = start(name, args, {**self.env, **extra}, stack.folder, cwd)
        stack.save()
        self.started.append(name)
        return True


def _start_ray(stack: Stack, launch: _Launcher, say: Callable[[str], None]) -> None:
    """A head and one more node, token auth on (the stack's token file), each of
    ``node_cpus``; the workers at their driver's priority, as on trainflow's local clusters."""
    from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV

    ray = Path(sys.executable).with_name("ray")
    env = {**LOCAL_CLUSTER_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(stack.token_file)}
    node = [
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        f"--num-cpus={stack.node_cpus:g}",
        # Each node's dashboard agent on a port of the system's choosing: on Ray's fixed 52365,
        # the second node's agent retries for about 3.5 s, then serves no HTTP.
        "--dashboard-agent-listen-port=0",
    ]
    head = [
        *[ray, *node, "--head", f"--port={stack.ports['ray']}"],
        f"--ray-client-server-port={stack.ports['ray_client']}",
        *["--dashboard-host=127.0.0.1", f"--dashboard-port={stack.ports['dashboard']}"],
        f"--temp-dir={stack.ray_temp}",
    ]
    if launch("ray-head", head, **env):
        say(f"Ray head on {stack.ray_address} (Ray Client: {stack.ray_client}) ...")
    _wait_ray(stack, "ray-head")
    if launch("ray-node", [ray, *node, f"--address={stack.ray_address}"], **env):
        say("a second Ray node ...")
    _wait_ray(stack, "ray-node")


def _await(stack: Stack, name: str, what: str, ready: Callable[[], bool]) -> None:
    wait_until(ready, what, stack.pids[name], stack.folder, name, START_TIMEOUT_S)


def mlflow_command(stack: Stack, python: Path) -> list:
    """MLflow's tracking server over PostgreSQL, serving its artifact store (runs and
    registered models' files) to every client, so a client needs no access to the folder."""
    backend = stack.postgres.uri("mlflow", "psycopg2")
    artifacts = ["--artifacts-destination", stack.folder / "artifacts", "--serve-artifacts"]
    listen = ["--host", "127.0.0.1", "--port", stack.ports["mlflow"], "--workers", "2"]
    return [python, "-m", "mlflow", "server", "--backend-store-uri", backend, *artifacts, *listen]


def _wait_ray(stack: Stack, name: str) -> None:
    log = stack.folder / "logs" / f"{name}.log"

    def started() -> bool:
        return log.is_file() and "Ray runtime started" in log.read_text(errors="replace")

    _await(stack, name, f"Ray's {name.removeprefix('ray-')} node", started)


def _api(stack: Stack, path: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{stack.prefect_api}/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def _work_pool(stack: Stack, env: dict[str, str]) -> None:
    """trainflow's process work pool on the stack's Prefect server, unless it exists."""
    try:
        _api(stack, f"work_pools/{POOL}")
        return
    except OSError:
        pass
    create = [PREFECT, "work-pool", "create", POOL, "--type", "process"]
    done = subprocess.run(
        create, env={**env, "PREFECT_API_URL": stack.prefect_api}, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise StackError(f"Prefect: the {POOL} work pool was not created: {done.stdout.strip()[-300:]}")


def _deploy(stack: Stack, env: dict[str, str], prefect_file: Path) -> None:
    checkout = prefect_file.resolve().parent.parent
    run_env = deploy_env(checkout, {**env, "PREFECT_API_URL": stack.prefect_api})
    run_env["TRAINFLOW_HOME"] = str(stack.folder / "home")
    command = deploy_command(prefect_file.resolve())
    done = subprocess.run(command, cwd=checkout, env=run_env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise StackError(
            f"Prefect: the deployments of {prefect_file} were not applied: {done.stdout.strip()[-500:]}"
        )


def deploy_command(prefect_file: Path) -> list[str]:
    """``prefect deploy`` of every deployment in ``prefect_file``."""
    return [str(PREFECT), "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)]


def deploy_env(checkout: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the variables deployments/prefect.yaml reads:
    TRAINFLOW_CHECKOUT, TRAINFLOW_GIT_URL (origin, else the checkout) and TRAINFLOW_HOME
    (default <checkout>/.trainflow)."""
    env = dict(os.environ if env is None else env)
    origin = subprocess.run(
        ["git", "remote", "get-url", "origin"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()
    return {
        **env,
        "TRAINFLOW_CHECKOUT": str(checkout),
        "TRAINFLOW_GIT_URL": env.get("TRAINFLOW_GIT_URL") or origin or str(checkout),
        "TRAINFLOW_HOME": str(Path(env.get("TRAINFLOW_HOME") or checkout / ".trainflow").resolve()),
    }


def _worker_online(stack: Stack) -> bool:
    try:
        workers = _api(stack, f"work_pools/{POOL}/workers/filter", {})
    except OSError:
        return False
    return any(w.get("status") == "ONLINE" for w in workers)


def status(folder: Path) -> list[Health]:
    """Each service's address and whether it answers now."""
    stack = Stack.load(folder)
    if not stack.exists:
        raise StackError(f"no stack in {stack.folder}: start one with trainflow stack up")
    pids = stack.pids
    ray_up = alive(pids.get("ray-head")) and port_open(stack.ports["ray"])
    return [
        Health(
            "postgres",
            f"127.0.0.1:{stack.ports['postgres']}",
            stack.postgres.running(),
            str(stack.postgres.data),
        ),
        Health(
            "mlflow",
            stack.mlflow_url,
            answers(f"{stack.mlflow_url}/health"),
            f"artifacts: {stack.folder / 'artifacts'}",
        ),
        Health(
            "prefect",
            stack.prefect_api.removesuffix("/api"),
            answers(f"{stack.prefect_api}/health"),
            f"API: {stack.prefect_api}",
        ),
        Health(
            "ray-head",
            stack.ray_address,
            ray_up,
            f"Ray Client: {stack.ray_client}; dashboard: http://127.0.0.1:{stack.ports['dashboard']}",
        ),
        Health("ray-node", f"{stack.node_cpus:g} CPUs", alive(pids.get("ray-node")), ""),
        Health(
            "worker",
            f"pool {POOL}",
            alive(pids.get("worker")) and _worker_online(stack),
            f"runs reach Ray at {stack.ray_client}",
        ),
    ]


def env_lines(folder: Path) -> list[str]:
    """The ``export`` lines a shell sources to use the stack."""
    stack = Stack.load(folder)
    if not stack.exists:
        raise StackError(f"no stack in {stack.folder}: start one with trainflow stack up")
    # A token in RAY_AUTH_TOKEN would win over the stack's token file.
    lines = ["unset RAY_AUTH_TOKEN", *(f"export {k}={v}" for k, v in stack.client_env().items())]
    return [*lines, f"# Off the cluster's nodes, through Ray Client: export RAY_ADDRESS={stack.ray_client}"]


def down(folder: Path, *, delete: bool = False, say: Callable[[str], None] = print) -> None:
    """Stop every service of the stack in ``folder`` and what they left running; keep its
    data (the registry, Prefect's runs, the artifacts) unless ``delete``."""
    stack = Stack.load(folder)
    if not stack.exists:
        raise StackError(f"no stack in {stack.folder}")
    _stop(stack, only=SERVICES, say=say)
    if delete:
        stack.postgres.delete()
        shutil.rmtree(stack.folder, ignore_errors=True)
        say(f"deleted {stack.folder}")


def _stop(stack: Stack, only, say: Callable[[str], None] = lambda _: None) -> None:
    """Stop the services named in ``only``, together, then PostgreSQL; with all of them,
    also whatever they left running (a flow run's process, Ray's workers) and Ray's
    session folder."""
    running = [name for name in SERVICES if name in only and alive(stack.pids.get(name))]
    if running:
        say(f"stopping {', '.join(running)}")
    stop([stack.pids[name] for name in running])
    for name in only:
        stack.pids.pop(name, None)
    everything = set(SERVICES) <= set(only)
    if everything:
        stop_members(stack.folder)
    if "postgres" in only:
        stack.postgres.stop()
    if stack.exists:
        stack.save()
    if not everything:
        return
    shutil.rmtree(stack.ray_temp, ignore_errors=True)
    left = members(stack.folder)
    if left:
        raise StackError(f"processes of the stack still run after its stop: {left}")
