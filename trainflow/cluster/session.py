"""The Ray session of a run: connect (a local cluster of the run's own, or the cluster at
``ray.address``/RAY_ADDRESS, trainflow shipped to it), and shut down only what was started.

And trainflow's own package and a user's modules (``PipelineConfig.user_modules``), shipped
to Ray workers as runtime_env ``py_modules``: at ``ray.init`` for the whole job, and to
Ray Train's workers and actors on a session the run did not start."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trainflow.cluster.quiet import (
    LOCAL_CLUSTER_ENV,
    apply_quiet_env,
    configure_ray_data,
    quiet_ray_client,
    quiet_token_auth_notice,
)
from trainflow.cluster.watch import (
    ClusterWatch,
    cluster_ended,
    cluster_marked,
    end_cluster,
    end_monitor,
    end_with_the_cluster,
    local_cluster_processes,
    watch_local_cluster,
)
from trainflow.config import PipelineConfig
from trainflow.ray_internals import drop_worker_noise, upload_py_modules
from trainflow.ray_internals.client import with_setup_hook
from trainflow.ray_internals.errors import NODE_START_TIMEOUT
from trainflow.ray_internals.switches import agent_port_of_the_systems_choosing, node_start_waits
from trainflow.start_wait import machine_load, raise_it, said_if_slow, start_timeout
from trainflow.timeline import timeline

log = logging.getLogger("trainflow")
T = TypeVar("T")


# The address of a cluster that `trainflow up` started from this Python, with this trainflow
# (set by ``stack.warm.attach``): its workers import the driver's own, as on a local cluster.
OWN_CLUSTER_ENV = "TRAINFLOW_OWN_RAY_ADDRESS"
# The command that starts each Ray worker of this process's jobs (Ray's py_executable), set
# by ``stack.warm.attach`` for the cluster of `trainflow up`: a child of its worker forkserver.
WORKER_PYTHON_ENV = "TRAINFLOW_WORKER_PYTHON"


def ray_address(config: PipelineConfig) -> str | None:
    """The address of the cluster a run of ``config`` connects to; None: a local one of its own."""
    return config.ray.address or os.environ.get("RAY_ADDRESS") or None


def on_this_machine(config: PipelineConfig) -> bool:
    """Whether a run of ``config`` meets a cluster of this machine alone before it starts:
    a local one of its own, or the one `trainflow up` started."""
    address = ray_address(config)
    return address is None or address == os.environ.get(OWN_CLUSTER_ENV)


class PreflightError(RuntimeError):
    """The cluster cannot run what the config asks for; the message says what to change."""


@dataclass
class Session:
    """This process's Ray session, as trainflow opened it."""

    # The cluster started elsewhere that it connected to, with trainflow shipped there;
    # None: a local cluster of its own.
    address: str | None
    watch: ClusterWatch | None = None  # the local cluster's watch
    shipped: bool = False  # trainflow shipped to the cluster at ``address``, its versions to check
    mark: str | None = None  # the local cluster's CLUSTER_MARK
    # What the cluster checks found on it (cluster/checks.py), so that each runs once.
    verified: set[tuple] = field(default_factory=set)


_session: Session | None = None  # the session trainflow opened in this process, while it lasts


def current_session() -> Session | None:
    """The Ray session trainflow opened in this process; None when it opened none (Ray
    not connected, or connected by someone else: a notebook's ``ray.init()``)."""
    return _session


@contextmanager
def ray_session(
    config: PipelineConfig,
    logger: logging.Logger | logging.LoggerAdapter = log,
    warm: Sequence[str] = (),
) -> Iterator[None]:
    """Ray for the block. A process connected already keeps its connection as it is (a
    command that started Ray ahead of its flow run, a test's session cluster, a
    notebook); otherwise this connects now (:func:`connect`) and shuts down at the
    block's end. ``warm``: modules for worker processes started at once to import
    (:func:`warm_workers`). A local cluster is started in the calling thread, which must
    outlive the block: Ray's local cluster dies with the thread that made it."""
    import ray

    if ray.is_initialized():
        yield
        return
    connect(config, logger, warm)
    try:
        yield
    finally:
        shutdown()


def connected(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> None:
    """Connect to Ray for the rest of this process, unless connected already: what a
    step does when its caller opened no session, as Ray's own calls connect on first
    use. The session shuts down when the process exits."""
    import ray

    if ray.is_initialized():
        return
    connect(config, logger)
    # After ray.init's own exit hook, so before it: the watch stops first.
    atexit.register(shutdown)


def connect(
    config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log, warm: Sequence[str] = ()
) -> Session:
    """Connect to the cluster at ``ray.address`` or RAY_ADDRESS, with trainflow and a
    user's model module shipped to it; else start a local cluster of this process's own,
    watched (:mod:`.watch`)."""
    global _session

    address = ray_address(config)
    py_modules = module_paths(config.user_modules)
    shipped = bool(address) and address != os.environ.get(OWN_CLUSTER_ENV)
    if address:
        logger.info("connecting to the Ray cluster at %s", address)
    if shipped:
        # A cluster started elsewhere may lack trainflow, or hold another version of it:
        # its workers import this driver's copy, shipped with the job (py_modules come
        # first on a worker's sys.path). A local cluster imports the driver's own.
        py_modules = [trainflow_package(), *py_modules]
    if not address:
        for key, value in LOCAL_CLUSTER_ENV.items():
            os.environ.setdefault(key, value)
        quiet_token_auth_notice()
    # "local" starts a cluster for this run. Ray's own default (None) would attach to
    # whichever cluster `ray start` last left on this machine: a cluster is only ever
    # shared when the config or RAY_ADDRESS says so.
    kwargs = ray_init_kwargs(py_modules)
    timeline("ray starting")
    if address and address.startswith("ray://"):
        kwargs["runtime_env"] = with_setup_hook(kwargs["runtime_env"])
        quiet_ray_client()
        _client_init(address, kwargs, logger)
        mark = None
    else:
        mark = _local_init(address, kwargs, logger)
    drop_worker_noise()
    watch = None if address else watch_local_cluster(mark)
    _session = Session(address=address, watch=watch, shipped=shipped, mark=mark)
    configure_ray_data()
    if warm:
        warm_workers(warm)
    timeline("ray started")
    return _session


# Ray Client's server starts a server process for each job; on a busy head that process
# sometimes dies as it forks (ray-project/ray#63202), and ray.init fails with "Starting Ray
# client server failed", or with the proxier's psutil.ZombieProcess on reading it.
CLIENT_INIT_ATTEMPTS = 3
CLIENT_SERVER_DIED = ("Starting Ray client server failed", "ZombieProcess")


def client_server_died(error: ConnectionAbortedError) -> bool:
    """Whether Ray Client's ``ray.init`` failed because the job's server process died as it
    started, which another attempt starts anew."""
    return any(sign in str(error) for sign in CLIENT_SERVER_DIED)


def _client_init(address: str, kwargs: dict, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """``ray.init`` through Ray Client, tried again when the job's server process did not start."""
    import ray

    for attempt in range(1, CLIENT_INIT_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kwargs)
            return
        except ConnectionAbortedError as e:
            if not client_server_died(e) or attempt == CLIENT_INIT_ATTEMPTS:
                raise
            logger.warning("Ray Client's server at %s did not start this job's server; trying again", address)
            ray.shutdown()
            time.sleep(attempt)


def _local_init(
    address: str | None, kwargs: dict, logger: logging.Logger | logging.LoggerAdapter = log
) -> str | None:
    """``ray.init`` of a local cluster, or of a node's ``host:port``. A cluster this process
    starts may take up to TRAINFLOW_START_TIMEOUT (a busy machine), said once when slow;
    past it, a PreflightError in one line. Returns the CLUSTER_MARK of a cluster it started."""
    import ray

    if address:
        ray.init(address=address, **kwargs)
        return None
    agent_port_of_the_systems_choosing()  # not 52365, which another node may hold
    with cluster_marked() as mark, node_start_waits(start_timeout()) as waited:
        try:
            with said_if_slow("the local Ray cluster to start", logger):
                ray.init(address="local", **kwargs)
        except Exception as e:
            if not str(e).startswith(NODE_START_TIMEOUT):
                raise
            end_cluster(mark)  # what of it started: its GCS, its agents
            load = machine_load()
            raise PreflightError(
                f"the local Ray cluster did not start within {waited:g} s ({load}): {raise_it(waited)}"
            ) from None
    return mark


def shutdown() -> None:
    """Shut down the session trainflow opened (its local cluster with it); nothing when
    it has none."""
    global _session
    import ray

    if _session is None:
        return
    session = _session
    _session = None
    if session.watch is not None:
        session.watch.stop()
    ended = cluster_ended(local_cluster_processes())
    if ended is not None:  # a cluster gone: ray.shutdown() would wait 60 s for it
        end_with_the_cluster(*ended, mark=session.mark)
    if session.mark is not None:
        end_monitor()
    ray.shutdown()
    end_cluster(session.mark)
    timeline("ray shut down")


def started_local_cluster() -> bool:
    """Whether this process's Ray session is a local cluster it started itself (one that
    no autoscaler can grow), not one it connected to."""
    return "gcs_server" in local_cluster_processes()


def _import_modules(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)


def warm_workers(modules: Sequence[str], most: int = 8) -> list:
    """Start worker processes for this run now, one per CPU up to ``most``, each importing
    ``modules`` (what the run's first Ray tasks run); returns the tasks' refs, which no
    one needs to wait for. Ray starts a job's workers at its first tasks, which would
    otherwise wait for them; started here, they overlap the flow's own start-up."""
    import ray

    task = ray.remote(num_cpus=1)(_import_modules)
    return [task.remote(list(modules)) for _ in range(min(int(ray.cluster_resources().get("CPU", 0)), most))]


def ray_init_kwargs(py_modules: Sequence[str] = ()) -> dict:
    """What every ``ray.init`` of trainflow passes: quiet workers, no dashboard, and
    ``py_modules`` (local paths, :func:`module_paths`) shipped to every worker of the job."""
    runtime_env: dict = {
        "env_vars": apply_quiet_env(),
        "worker_process_setup_hook": "trainflow.cluster.quiet.quiet_worker",
    }
    if py_modules:
        runtime_env["py_modules"] = list(py_modules)
    if os.environ.get(WORKER_PYTHON_ENV):
        runtime_env["py_executable"] = os.environ[WORKER_PYTHON_ENV]
    # No dashboard: trainflow reaches Ray through its Python API (Train, Tune, Data, and
    # Serve's serve.run, which needs no dashboard; only Serve's REST API and `serve deploy`
    # do). Off, it is one process fewer on a small machine and one port fewer listening.
    return dict(runtime_env=runtime_env, logging_level=logging.WARNING, include_dashboard=False)


def module_paths(modules: Iterable[str]) -> list[str]:
    """Where the top-level package (a folder) or module (a ``.py`` file) of each of
    ``modules`` lives on this machine, for Ray's runtime_env ``py_modules``: a user's code
    that the driver imports from the current folder or PYTHONPATH, which a cluster's
    workers may not have. Nothing for a module that does not import here, nor for an
    installed one (site-packages, the standard library), which every node installs."""
    return list(dict.fromkeys(path for module in modules for path in _module_path(module)))


def _module_path(module: str) -> list[str]:
    import importlib.util
    import sysconfig

    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or [])
    if len(locations) > 1:
        return []  # a namespace package spread over folders: no one folder to ship
    if locations:
        path = Path(locations[0]).resolve()
    elif spec.origin and spec.origin.endswith(".py"):
        path = Path(spec.origin).resolve()
    else:
        return []  # built in, frozen or compiled: installed with Python or a package
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    if any(path.is_relative_to(Path(root).resolve()) for root in installed):
        return []
    return [str(path)]


def trainflow_package() -> str:
    """trainflow's own package folder on this machine (an installed or a checked-out copy),
    shipped as runtime_env ``py_modules`` to a cluster the run did not start."""
    return str(Path(__file__).resolve().parents[1])


def worker_runtime_env(modules: Iterable[str]) -> dict:
    """The runtime_env of Ray Train's workers and of the actors that load a checkpoint
    (``RunConfig(worker_runtime_env=...)``, an actor's options): the user's ``modules``
    uploaded, beside the job's own ``py_modules`` (trainflow, on a cluster the run did not
    start). Ray merges a runtime_env key by key, so a worker's ``py_modules`` replace the
    job's: both are listed. Empty when there is nothing to add."""
    import ray

    extra = uploaded_modules(module_paths(modules))
    if not extra:
        return {}
    job = list(ray.get_runtime_context().runtime_env.get("py_modules") or [])
    return {"py_modules": list(dict.fromkeys([*job, *extra["py_modules"]]))}


def uploaded_modules(paths: Sequence[str]) -> dict:
    """A runtime_env whose ``py_modules`` are ``paths`` uploaded to the connected cluster
    (``gcs://`` URIs): an actor's runtime_env takes only URIs, where ``ray.init`` takes
    local paths. Ray Train's ``RunConfig(worker_runtime_env=...)`` ships them so to its
    workers on any cluster the driver is connected to, one the run did not start too."""
    import ray.util.client

    if not paths or ray.util.client.ray.is_connected():
        return {}  # through Ray Client, ray.init's runtime_env ships them to every worker
    return upload_py_modules(paths)


def on_the_cluster(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` where Ray Data can execute: in this process, or, when this
    process reaches its cluster through Ray Client (``ray://``), whose driver cannot run a
    Ray Data execution, in a task on the cluster. The task asks for no CPU: the Ray Data
    tasks it starts ask for their own."""
    from ray.util.client import ray as client

    if not client.is_connected():
        return fn(*args, **kwargs)
    import ray

    return ray.get(ray.remote(num_cpus=0)(fn).remote(*args, **kwargs))


@contextmanager
def driver_side(fn: Callable[[T], None]) -> Iterator[Callable[[T], None]]:
    """``fn``, callable from what Ray runs on this driver's behalf: ``fn`` itself, or, through
    Ray Client (where Tune's driver loop and its callbacks run in an actor on the cluster,
    without this process's Prefect run or console), a function that queues its argument (a
    Ray queue, an actor of no CPU) for a thread here, which calls ``fn`` with each in order.
    Every queued call is made before the block ends, and the queue is gone."""
    from ray.util.client import ray as client

    if not client.is_connected():
        yield fn
        return
    import threading
    from queue import Empty

    from ray.util.queue import Queue

    queue = Queue(actor_options={"num_cpus": 0})
    done = threading.Event()

    def relay() -> None:
        while True:
            try:
                fn(queue.get(timeout=0.5))
            except Empty:
                if done.is_set():
                    return

    thread = threading.Thread(target=relay, name="trainflow-relay", daemon=True)
    thread.start()
    try:
        yield queue.put
    finally:
        done.set()
        thread.join()
        queue.shutdown()
