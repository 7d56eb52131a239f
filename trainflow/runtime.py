"""Ray connection, resource preflight, quiet defaults and the working folders.

Nothing here runs on import: callers ask for a :func:`workspace` or open a
:func:`ray_session` when they need one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainflow.config import PipelineConfig, ScalingSection, SweepConfig
from trainflow.files import filesystem, is_uri, join, redacted, write_text

log = logging.getLogger("trainflow")

# Ray Data needs at least one CPU of its own for reads and map_batches while the
# training workers hold theirs; with none left a run waits forever.
DATA_CPU_RESERVE = 1.0

# Set for trainflow's own processes and handed to every Ray worker. Each one is a
# default: a value already in the environment wins.
QUIET_ENV = {
    # Telemetry cannot leave these machines; offline it logs errors users take for failures.
    "RAY_USAGE_STATS_ENABLED": "0",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Each ray.train.report() waits about one controller poll, so Ray's default interval
    # adds up over a run's epochs (benchmarks/results.md runs bare Ray with the default and
    # with this value). The controller polls every worker at this rate: on a cluster of
    # hundreds of workers, set it higher.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.05",
    # MLflow draws a progress bar per artifact copy; trainflow logs the step instead.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow sets its loggers to INFO when imported, and announces the embedded store's
    # table creation and migrations there: nothing a user acts on.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def _process_start() -> float:
    """When this process started, on the monotonic clock (Linux); else when this module loaded."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        booted = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
        return ticks / os.sysconf("SC_CLK_TCK") - booted
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


_STARTED = _process_start()
TIMELINE = "TRAINFLOW_TIMELINE"


def timeline(phase: str) -> None:
    """With TRAINFLOW_TIMELINE=1, print ``timeline <s since the process started> <phase>`` on
    stderr: where a run's time goes, for ``benchmarks/overhead.py --phases``."""
    if os.environ.get(TIMELINE) == "1":
        print(f"timeline {time.monotonic() - _STARTED:.3f} {phase}", file=sys.stderr, flush=True)


# Set when trainflow starts a local cluster; a value already in the environment wins.
LOCAL_CLUSTER_ENV = {
    # Train V2's preemption watcher (an early warning that a node is being drained)
    # starts an actor that Ray core reports as an ERROR line on every run (ray issue
    # 53727); one local node is never drained.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray starts as many idle workers as the node has CPUs when the first driver connects.
    # A run used none of them (sampled in `trainflow run --smoke`): Ray Train gives its
    # controller and workers a runtime_env of their own, which an idle worker started
    # without it cannot take, and a small input is prepared in the driver. Each is a
    # process that imports Ray (about 0.5 CPU-seconds); a task that needs a worker starts one.
    "RAY_prestart_worker_first_driver": "0",
}


class _TokenAuthNotice(logging.Filter):
    """Ray keeps token authentication on for a local cluster it starts, and says so on
    every start unless RAY_AUTH_MODE was set before ray was imported. trainflow keeps it
    on (the cluster's ports listen on every interface, and without a token anyone who
    reaches them runs code) and drops the notice; Ray's warning that auth is off stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_token_auth_notice() -> None:
    """Drop Ray's notice that a local cluster keeps token auth on (it stays on)."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenAuthNotice) for f in logger.filters):
        logger.addFilter(_TokenAuthNotice())


def quiet_worker() -> None:
    """Runs in every Ray worker process of a trainflow run (a ``worker_process_setup_hook``).

    Points Ray's own helpers in the worker at the worker's cluster, has Train's
    placement-group cleaner ask that cluster's GCS whether a run's controller lives
    (:func:`answer_cleaner_from_gcs`), and keeps the driver's console to what a user acts
    on: the cleaner warns when it removes the placement group of a controller that died
    (a trial that a sweep's scheduler stops, unless the sweep got there first), every
    worker logs each report, a worker logs the traceback of trainflow's own one-line
    errors, and Ray's own internals trip deprecation and tensor warnings that no user of
    trainflow can act on.
    """
    import warnings

    import ray

    # Ray's helpers inside a worker (the state API, Ray Client) find their cluster by
    # RAY_ADDRESS, else by the last cluster started on this machine: on a machine running
    # several (tests, shared hosts) another one, or a dead one that they wait on. Name
    # this worker's own cluster.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    answer_cleaner_from_gcs()
    _errors_only(_PG_CLEANER)
    # Train's worker context names its logger by file path, outside ``ray.train``, so
    # RunConfig's LoggingConfig misses its line per report.
    context_py = os.path.join(
        os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution", "context.py"
    )
    logging.getLogger(context_py).setLevel(logging.WARNING)
    # Each Dataset execution in a worker (the training splits) warns that progress
    # bars are off: trainflow turns them off on purpose away from a terminal.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    # A streamed split's coordinator (an actor) logs "Dataset ... execution finished in
    # N seconds" at INFO once per epoch, on the driver's console; the train task logs
    # each epoch already.
    logging.getLogger("ray.data._internal.execution.streaming_executor").setLevel(logging.WARNING)
    # Train's controller registers the workers' resources with an autoscaling
    # coordinator actor (on a local cluster the run started, only where Ray Data streams
    # a split, or in a sweep's trials: training/controller.py) and, when that call
    # misses its timeout on a busy machine, logs a traceback it calls safe to ignore.
    _errors_only("ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client")
    # When a sweep stops a trial, trainflow removes its worker group's placement group
    # (training/placements.py) and the trial's controller, shutting down a backend whose
    # workers are gone, logs a warning and a traceback it calls expected.
    _errors_only("ray.train.v2._internal.callbacks.backend_setup")
    # A worker whose training function raised logs the traceback; when it is trainflow's
    # error for the user (a model module the worker cannot import, say), the driver
    # reports it in one line (run_training), so the traceback stays in the worker's log.
    train_util = logging.getLogger("ray.train.v2._internal.util")
    if not any(isinstance(f, _NoExpectedTrainErrors) for f in train_util.filters):
        train_util.addFilter(_NoExpectedTrainErrors())
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


# Ray Train V2 starts a placement-group cleaner (a detached actor) beside every run's
# controller: once the controller is dead, it removes the run's placement group. It asks
# whether the controller lives through the state API, at the address the cluster's GCS
# publishes for its dashboard. A cluster started without the dashboard (trainflow's:
# ray_init_kwargs) still publishes the default 127.0.0.1:8265 there, where nothing of its
# own listens, so the cleaner asks whichever cluster on the machine holds that port. One
# that never heard of the controller answers "no such actor", and the cleaner removes a
# live run's placement group: its workers die ("Destroying worker since its placement
# group was removed", a failed worker health check), or, when the answer comes before the
# run registers its group, the cleaner exits and the controller warns that it "Failed to
# register placement group with cleaner". The GCS knows its own cluster's actors, with or
# without the dashboard.
_PG_CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def controller_alive(actor_id: str, timeout: float | None = None) -> bool:
    """Whether the actor ``actor_id`` of the calling process's Ray cluster may still be
    alive: False only once the cluster's GCS records it DEAD. For Train's placement-group
    cleaner, in place of Ray's state-API check (same arguments; the GCS call keeps its own
    timeout). A GCS that does not answer raises the state API's error, which the cleaner
    logs and retries at its next check."""
    import ray._private.state
    from ray.util.state.exception import RayStateApiException

    try:
        info = ray._private.state.actors(actor_id=actor_id)
    except (ray.exceptions.RpcError, ray.exceptions.RaySystemError) as e:
        raise RayStateApiException(f"the GCS did not say whether actor {actor_id} lives: {e}") from e
    return info.get("State") != "DEAD"


class _CleanerFromGcs(importlib.abc.MetaPathFinder):
    """Gives the cleaner's module :func:`controller_alive` as its liveness check when a
    worker imports it (the cleaner's own actor), without importing it into every worker
    (it brings Ray Data: about 1.5 s)."""

    def find_spec(self, name, path, target=None):
        if name != _PG_CLEANER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _use_gcs_liveness(module)

        spec.loader.exec_module = exec_module
        return spec


def _use_gcs_liveness(module) -> None:
    # Where Ray renamed its check, the cleaner keeps its own (tests/test_runtime.py fails).
    if hasattr(module, "is_actor_alive"):
        module.is_actor_alive = controller_alive


def answer_cleaner_from_gcs() -> None:
    """Have Train's placement-group cleaner, in this process, learn whether a run's
    controller lives from the cluster's GCS rather than the state API (which needs the
    dashboard, and otherwise may ask another cluster on the machine). Idempotent."""
    if _PG_CLEANER in sys.modules:
        _use_gcs_liveness(sys.modules[_PG_CLEANER])
    elif not any(isinstance(finder, _CleanerFromGcs) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CleanerFromGcs())


class _NoExpectedTrainErrors(logging.Filter):
    """Drops Ray Train's "Error in training function" record of a ConfigError or DataError."""

    EXPECTED = ("trainflow.config.ConfigError: ", "trainflow.pipelines.data.DataError: ")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Error in training function"):
            return True
        last = message.rstrip().rsplit("\n", 1)[-1]
        return not last.startswith(self.EXPECTED)


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _errors_only(name: str) -> None:
    """Keep only a logger's errors. A filter rather than a level: Ray Train configures
    the ``ray.train`` loggers in its controller process (``logging.config.dictConfig``),
    which resets the level of every logger below them, and keeps their filters."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
        logger.addFilter(_ErrorsOnly())


class PreflightError(RuntimeError):
    """The cluster cannot run what the config asks for; the message says what to change."""


@dataclass(frozen=True)
class Workspace:
    """The folders under TRAINFLOW_HOME (default ``.trainflow`` in the working directory)."""

    home: Path

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    @property
    def mlflow_db(self) -> Path:
        return self.home / "mlflow.db"

    @property
    def artifacts(self) -> Path:
        return self.home / "mlartifacts"

    def ensure(self) -> Workspace:
        for folder in (self.home, self.cache, self.runs, self.artifacts):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def cache_location(config: PipelineConfig) -> str:
    """Where ``config``'s runs keep their prepared splits: its ``cache`` (a folder, made if
    missing, or a URI), else TRAINFLOW_HOME/cache."""
    if config.cache and is_uri(config.cache):
        return config.cache
    return str(cache_folder(config))


def cache_folder(config: PipelineConfig) -> Path:
    """The local folder of ``config``'s cache: its ``cache`` folder, made if missing, else
    TRAINFLOW_HOME/cache (also for a URI cache: what stays on this machine, such as
    downloaded torchvision datasets and Prefect's ingest records)."""
    if not config.cache or is_uri(config.cache):
        return workspace().cache
    folder = Path(config.cache).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def workspace() -> Workspace:
    home = os.environ.get("TRAINFLOW_HOME") or ".trainflow"
    return Workspace(Path(home).expanduser().resolve()).ensure()


def apply_quiet_env() -> dict[str, str]:
    """Set QUIET_ENV defaults in this process; return the values in force."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in QUIET_ENV}


def ray_address(config: PipelineConfig) -> str | None:
    return config.ray.address or os.environ.get("RAY_ADDRESS") or None


# Whether a Ray session was started ahead of its flow run (:func:`ray_ahead`) and waits
# for the run's own :func:`ray_session` to take it over.
_ahead = False


@contextmanager
def ray_session(
    config: PipelineConfig,
    logger: logging.Logger | logging.LoggerAdapter = log,
    warm: Sequence[str] = (),
) -> Iterator[None]:
    """Connect to Ray for the length of a run, and shut down only what this started.
    ``warm``: modules for worker processes started at once to import (:func:`warm_workers`);
    none, no warm-up. What the run asks of the cluster is checked before (``trainflow.checks``).

    A session that :func:`ray_ahead` started for this run is taken over: the run owns it
    and shuts it down. Any other initialized Ray (a test's session cluster, a notebook)
    is used as is. A local cluster is started in the calling thread, which must outlive
    the run: Ray's local cluster dies with the thread that made it.
    """
    global _ahead
    import ray

    if ray.is_initialized() and not _ahead:
        yield
        return
    if not _ahead:
        _connect(config, logger, warm)
    _ahead = False
    try:
        yield
    finally:
        _shutdown()


@contextmanager
def ray_ahead(
    config: PipelineConfig,
    logger: logging.Logger | logging.LoggerAdapter = log,
    warm: Sequence[str] = (),
) -> Iterator[None]:
    """Start the Ray session of the flow run that follows in this thread now, while the
    rest of the command starts; the run's :func:`ray_session` takes it over. Shut down
    here when the run ended before it did (a failed check, bad data)."""
    global _ahead
    import ray

    if ray.is_initialized():  # a cluster of someone else's: the run uses it as is
        yield
        return
    _connect(config, logger, warm)
    _ahead = True
    try:
        yield
    finally:
        if _ahead:
            _ahead = False
            _shutdown()


# The address of the cluster this process's Ray session connected to with trainflow
# shipped (a cluster it did not start), until the session shuts down; None otherwise.
_shipped_to: str | None = None


def _shutdown() -> None:
    global _shipped_to, _cluster_watch
    import ray

    _shipped_to = None
    if _cluster_watch is not None:
        _cluster_watch.set()
        _cluster_watch = None
    ended = _cluster_ended(_local_cluster_processes())
    if ended is not None:  # a cluster gone: ray.shutdown() would wait 60 s for it
        _end_with_the_cluster(*ended)
    ray.shutdown()
    timeline("ray shut down")


# The processes of a local cluster whose end ends the run: the GCS and the raylet however
# they exit (the cluster is gone); Ray's log monitor when a stop signal killed it, which
# happens at once when the signal went to the whole process group (the raylet takes
# seconds to exit, the GCS stays up, and the driver waits on them for 60 s).
_WATCHED = {"gcs_server": False, "raylet": False, "log_monitor": True}
# (Ctrl-C's SIGINT to the group is left to the graceful stop, which ends in seconds.)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _local_cluster_processes() -> dict:
    """The processes of :data:`_WATCHED` of the local cluster this process started, by
    name; none for a cluster started elsewhere. Ray keeps them in its node's table."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker._global_node
        table = node.all_processes if node is not None else {}
        return {name: table[name][0].process for name in _WATCHED if table.get(name)}
    except Exception:  # noqa: BLE001 - Ray's internals moved: no watch, Ray's own behaviour
        return {}


def started_local_cluster() -> bool:
    """Whether this process's Ray session is a local cluster it started itself (one that
    no autoscaler can grow), not one it connected to."""
    return "gcs_server" in _local_cluster_processes()


_interrupted = threading.Event()  # a Ctrl-C that sigint_stops_the_run's handler took
_deferring = 0  # > 0 inside interrupts_deferred()


def on_sigint(signum, frame) -> None:
    """The SIGINT handler of :func:`sigint_stops_the_run`."""
    _interrupted.set()
    if not _deferring:
        raise KeyboardInterrupt


@contextmanager
def sigint_stops_the_run() -> Iterator[None]:
    """A command's Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, and
    remembered. Prefect's engine, interrupted at some points of its own work between
    tasks, goes on as if nothing happened: :func:`raise_if_interrupted` (before every
    step and every training) stops the run then. Inside :func:`interrupts_deferred`,
    only remembered. Outside the main thread (where Python runs signal handlers), nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, on_sigint)
    if before is not on_sigint:  # (the ``trainflow`` command's own since its start)
        _interrupted.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C during the block is raised at its end, or where the block calls
    :func:`raise_if_interrupted`, not where it lands: a KeyboardInterrupt raised inside an
    import while other threads import (a command's start-up) can leave one of importlib's
    module locks taken, and the start-up waiting for it forever."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    raise_if_interrupted()


def raise_if_interrupted() -> None:
    """KeyboardInterrupt, if a Ctrl-C taken by :func:`sigint_stops_the_run` has not ended
    the run yet."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Around a blocking Ray call in the main thread (a training's ``fit()``), a stop
    signal ends it as Python would without Ray in the way.

    SIGTERM ends it as SystemExit(143). Prefect's SIGTERM handler, in force during a
    flow run, raises its own TerminationSignal, which ``ray.get`` swallows: a SIGTERM to
    the driver alone (Kubernetes, Docker, a Prefect worker's cancellation) was ignored
    until the training ended by itself.

    Ctrl-C (SIGINT) ends it as KeyboardInterrupt. Ray Train's own SIGINT handler, which
    ``fit()`` installs, aborts the run's controller (its workers stop, its checkpoints
    stay) and then ends the call as SystemExit(1), which reads as a crash; its handler is
    put back to what it was once the call ends. From the Ctrl-C on, the console no longer
    shows what the run's workers print (:func:`_worker_output_shown`): the stop ends in
    the command's one line, not in the output of workers being torn down (a worker's
    traceback once printed there); the next call shows it again."""
    raise_if_interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def stop(signum, frame) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    # Whichever handler runs, Python writes each signal's number here as the signal
    # arrives: how a Ctrl-C that Ray's handler took is known, and at once.
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    _worker_output_shown(True)
    ctrl_c = _SigintWatch(read)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    before = signal.signal(signal.SIGTERM, stop)
    before_int = signal.getsignal(signal.SIGINT)

    def interrupted() -> bool:
        ctrl_c.stop()
        return ctrl_c.seen.is_set()

    try:
        yield
    except SystemExit:
        if received:  # Ray hands it back as SystemExit(1)
            raise SystemExit(128 + received[0]) from None
        if interrupted():
            raise KeyboardInterrupt from None
        raise
    else:
        if interrupted():
            raise KeyboardInterrupt
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
        signal.signal(signal.SIGINT, before_int if before_int is not None else signal.default_int_handler)
        ctrl_c.stop()
        os.close(read)
        os.close(write)


class _SigintWatch:
    """A thread reading the signal numbers Python writes to ``read`` (its wakeup fd): on
    a SIGINT, ``seen`` is set and the workers' output leaves the console."""

    def __init__(self, read: int) -> None:
        self.seen = threading.Event()
        self._read = read
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="trainflow-sigint-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import select

        while True:
            ready, _, _ = select.select([self._read, self._stop_read], [], [])
            if self._read in ready:
                self._take()
            if self._stop_read in ready:
                return

    def _take(self) -> None:
        """Reads the signals written since the last read; on a SIGINT among them, the
        workers' output leaves the console."""
        try:
            signals = os.read(self._read, 512)
        except (BlockingIOError, OSError):
            return
        if signal.SIGINT in signals:
            self.seen.set()
            _worker_output_shown(False)

    def stop(self) -> None:
        """Ends the thread (once), then takes what it had not read."""
        if self._thread.is_alive():
            os.write(self._stop_write, b"x")
            self._thread.join()
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._take()


_hidden_worker_output: list = []  # Ray's console handler, while taken away


def _worker_output_shown(shown: bool) -> None:
    """Show or hide, on this driver's console, what the cluster's workers print (Ray's
    ``log_to_driver``, whose handler is taken away and put back)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except Exception:  # noqa: BLE001 - Ray's internals moved: its output stays shown
        return
    with dispatcher._lock:
        if shown and _hidden_worker_output:
            dispatcher.handlers.extend(_hidden_worker_output)
            _hidden_worker_output.clear()
        elif not shown:
            _hidden_worker_output.extend(pair for pair in dispatcher.handlers if pair[0] == "ray_print_logs")
            dispatcher.handlers = [pair for pair in dispatcher.handlers if pair[0] != "ray_print_logs"]


# Set to stop watching the local cluster (before a shutdown stops it on purpose).
_cluster_watch: threading.Event | None = None


def _watch_the_local_cluster() -> None:
    """While the session lasts, end the process in one line when its local cluster ends
    under it (:data:`_WATCHED`): a stop signal sent to the whole process group (systemd's
    stop, ``timeout``, ``kill -- -PGID``), or the kernel's OOM killer taking the GCS or
    the raylet. Ray itself would wait 60 s for them, whatever the run was doing, then
    print a native error and exit; what a clean stop would have done died with the
    cluster, and the run's record says it did not finish (``--resume`` continues it)."""
    global _cluster_watch
    processes = _local_cluster_processes()
    if not processes:
        return
    stop = _cluster_watch = threading.Event()

    def watch() -> None:
        # Often: the sooner, the fewer lines the dying cluster sends the console first.
        while not stop.wait(0.05):
            ended = _cluster_ended(processes)
            if ended is not None and not stop.is_set():
                _end_with_the_cluster(*ended)

    threading.Thread(target=watch, name="trainflow-cluster-watch", daemon=True).start()


def _cluster_ended(processes: dict) -> tuple[str, int] | None:
    """The watched process whose end ends the cluster, and its exit code; one that a stop
    signal killed first (it says what happened), else the GCS or raylet that exited."""
    codes = {name: process.poll() for name, process in processes.items()}
    ended = [(name, code) for name, code in codes.items() if code is not None]
    signalled = [(name, code) for name, code in ended if -code in _STOP_SIGNALS]
    hard = [(name, code) for name, code in ended if not _WATCHED[name]]
    return (signalled or hard or [None])[0]


def _end_with_the_cluster(process: str, code: int) -> None:
    """Exit now, in one line: this process's local cluster is gone (its ``process``
    exited with ``code``), and nothing Ray would do next can reach it."""
    if code < 0 and -code in (*_STOP_SIGNALS, signal.SIGINT):
        message, status = f"stopped ({signal.Signals(-code).name})", 128 - code
    else:
        try:  # where this session's logs are (RAY_TMPDIR moves them)
            import ray._private.worker as ray_worker

            logs = ray_worker._global_node.get_logs_dir_path()
        except Exception:  # noqa: BLE001 - Ray's internals moved: its default place
            logs = "/tmp/ray/session_latest/logs"
        message = (
            f"error: the local Ray cluster stopped during the run (its {process} exited with {code}); "
            f"its log: {logs}/{process}.out"
        )
        status = 1
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(status)


def _connect(
    config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter, warm: Sequence[str]
) -> None:
    global _shipped_to
    import ray

    address = ray_address(config)
    py_modules = module_paths(config.model.user_module)
    if address:
        logger.info("connecting to the Ray cluster at %s", address)
        # A cluster started elsewhere may lack trainflow, or hold another version of it:
        # its workers import this driver's copy, shipped with the job (py_modules come
        # first on a worker's sys.path). A local cluster imports the driver's own.
        py_modules = [trainflow_package(), *py_modules]
    else:
        for key, value in LOCAL_CLUSTER_ENV.items():
            os.environ.setdefault(key, value)
        quiet_token_auth_notice()
    # "local" starts a cluster for this run. Ray's own default (None) would attach to
    # whichever cluster `ray start` last left on this machine: a cluster is only ever
    # shared when the config or RAY_ADDRESS says so.
    ray.init(address=address or "local", **ray_init_kwargs(py_modules))
    _shipped_to = address
    if not address:
        _watch_the_local_cluster()
    configure_ray_data()
    if warm:
        warm_workers(warm)
    timeline("ray started")


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


def local_cluster_resources() -> dict[str, float] | None:
    """What a local cluster that ``ray.init()`` starts on this machine would have (CPUs,
    GPUs, memory), found the way Ray finds it (cgroup limits, CUDA_VISIBLE_DEVICES,
    RAY_OVERRIDE_RESOURCES) without starting anything; None if Ray's detection moved."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1")
        return {name: float(amount) for name, amount in spec.to_resource_dict().items()}
    except (ImportError, AttributeError, TypeError, ValueError):
        # A private API of Ray's: where it changed, the preflight after ray.init still checks.
        return None


def preflight_local(config: PipelineConfig, sweep: bool = False, gpus_per_actor: float = 0) -> None:
    """PreflightError now, before Prefect or Ray start, when the run will start a local
    Ray cluster that cannot hold its training workers (or one sweep trial, or, given
    ``gpus_per_actor``, one prediction actor): a GPU on a machine without one, more CPUs
    than it has. A run on a cluster elsewhere is checked by :func:`preflight` once
    connected."""
    import ray

    if ray.is_initialized() or ray_address(config):
        return
    total = local_cluster_resources()
    if total is None:
        return
    try:
        if gpus_per_actor:
            fit_gpu_actors(gpus_per_actor, total)
        elif sweep and config.sweep is not None:
            sweep_concurrency(config.sweep, total)
        else:
            fit_scaling(config.scaling, total)
    except PreflightError as e:
        raise PreflightError(
            str(e).replace("the Ray cluster has", "the local Ray cluster on this machine would have")
        ) from None


def check_cache(config: PipelineConfig) -> None:
    """A cache at a URI answers and takes writes (a marker written and removed), before
    anything starts: a wrong bucket, endpoint or credentials fail here, in one line,
    rather than in the first Ray task that writes a split."""
    import uuid

    location = cache_location(config)
    if not is_uri(location):
        return
    marker = join(location, f"{MARKERS}{uuid.uuid4().hex[:8]}")
    try:
        fs, path = filesystem(marker)
        fs.get_file_info(path)  # one request first: an endpoint that is not there fails once
        write_text(marker, "")
        fs.delete_file(path)
    except (OSError, ValueError) as e:  # pyarrow's errors for a store it cannot reach or parse
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(
            f"cache: cannot write to {redacted(location)}: {reason}; check the address and the "
            "credentials, or leave cache out for TRAINFLOW_HOME/cache"
        ) from None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """PreflightError when nothing answers at a cluster's ``host:port``: ``ray.init``
    itself retries such an address for minutes. Ray Client (``ray://``) and ``auto``
    addresses are left to Ray."""
    import socket

    if "://" in address or address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise PreflightError(
            f"Ray address {address!r} (ray.address or RAY_ADDRESS) is not host:port such as 10.0.0.5:6379"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise PreflightError(
            f"no Ray cluster answers at {address} (ray.address or RAY_ADDRESS): {e}; start one "
            "there with `ray start --head`, or unset both to run on a local cluster of the run's own"
        ) from None


def ray_init_kwargs(py_modules: Sequence[str] = ()) -> dict:
    """What every ``ray.init`` of trainflow passes: quiet workers, no dashboard, and
    ``py_modules`` (local paths, :func:`module_paths`) shipped to every worker of the job."""
    runtime_env: dict = {
        "env_vars": apply_quiet_env(),
        "worker_process_setup_hook": "trainflow.runtime.quiet_worker",
    }
    if py_modules:
        runtime_env["py_modules"] = list(py_modules)
    # No dashboard: trainflow reaches Ray through its Python API (Train, Tune, Data, and
    # Serve's serve.run, which needs no dashboard; only Serve's REST API and `serve deploy`
    # do). Off, it is one process fewer on a small machine and one port fewer listening.
    return dict(runtime_env=runtime_env, logging_level=logging.WARNING, include_dashboard=False)


def module_paths(module: str | None) -> list[str]:
    """Where the top-level package (a folder) or module (a ``.py`` file) of ``module``
    lives on this machine, for Ray's runtime_env ``py_modules``: a user's code that the
    driver imports from the current folder or PYTHONPATH, which a cluster's workers may
    not have. Empty for None, a module that does not import here, and an installed one
    (site-packages, the standard library), which every node installs for itself."""
    import importlib.util
    import sysconfig

    if not module:
        return []
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
    return str(Path(__file__).resolve().parent)


def worker_runtime_env(user_module: str | None) -> dict:
    """The runtime_env of Ray Train's workers (``RunConfig(worker_runtime_env=...)``): the
    user's model module uploaded, beside the job's own ``py_modules`` (trainflow, on a
    cluster the run did not start). Ray merges a runtime_env key by key, so a worker's
    ``py_modules`` replace the job's: both are listed. Empty when there is nothing to add."""
    import ray

    extra = uploaded_modules(module_paths(user_module))
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
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    return upload_py_modules_if_needed({"py_modules": list(paths)}, include_gitignore=True)


def configure_ray_data() -> None:
    """Ray Data settings for trainflow's driver: a cheap shuffle; progress bars on a
    terminal and plain logs elsewhere (CI, Prefect workers)."""
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    ctx = DataContext.get_current()
    # The default hash shuffle starts a pool of aggregator actors for every groupby,
    # unique and aggregate: seconds of start-up each, where the sort-based shuffle of a
    # small dataset takes a fraction of one.
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    interactive = sys.stderr.isatty()
    ctx.enable_progress_bars = interactive
    ctx.print_on_execution_start = interactive
    if not interactive:
        # One INFO line per Dataset execution, and a warning that the bars are off;
        # trainflow's step logs say what ran.
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


def worker_resources(scaling: ScalingSection) -> tuple[float, float]:
    """(CPUs, GPUs) that one training worker asks for, as Ray Train reads ScalingConfig."""
    res = scaling.resources_per_worker
    cpu = float(res.get("CPU", 1.0))
    gpu = float(res.get("GPU", 1.0 if scaling.use_gpu else 0.0))
    return cpu, gpu


def fit_gpu_actors(gpus_per_actor: float, total: dict[str, float]) -> None:
    """PreflightError when a cluster with ``total`` resources has no room for one actor
    of ``gpus_per_actor`` GPUs (batch prediction's ``--gpu``): Ray Data would wait for a
    GPU forever instead of failing. Fewer GPUs than actors is fine: the pool runs on the
    actors that start."""
    gpus = total.get("GPU", 0.0)
    if gpus_per_actor and gpus < gpus_per_actor:
        raise PreflightError(
            f"use_gpu (--gpu) asks for {gpus_per_actor:g} GPU per actor, the Ray cluster has {gpus:g}: "
            "predict without --gpu, or run on a cluster with GPUs"
        )


def fit_scaling(scaling: ScalingSection, total: dict[str, float]) -> ScalingSection:
    """The scaling to run on a cluster with ``total`` resources, or PreflightError saying
    what was asked, what the cluster has and what to change.

    With ``on_cpu_shortage: shrink``, workers that leave Ray Data no CPU get a smaller
    CPU share each instead (returned; the caller logs it).
    """
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    n = scaling.num_workers
    cpu_each, gpu_each = worker_resources(scaling)
    if gpu_each and n * gpu_each > gpus:
        raise PreflightError(
            f"scaling asks for {n} workers x {gpu_each:g} GPU = {n * gpu_each:g} GPUs, "
            f"the Ray cluster has {gpus:g}: set scaling.use_gpu=false, or run on a cluster with GPUs"
        )
    for name, amount in scaling.resources_per_worker.items():
        if name in ("CPU", "GPU"):
            continue
        if n * amount > total.get(name, 0.0):
            raise PreflightError(
                f"scaling.resources_per_worker.{name}: {n} workers x {amount:g} = {n * amount:g}, "
                f"the Ray cluster has {total.get(name, 0.0):g}"
            )
    needed = n * cpu_each + DATA_CPU_RESERVE
    if needed <= cpus:
        return scaling
    fit = int(max(cpus - DATA_CPU_RESERVE, 0.0) / n * 100) / 100  # rounded down to 0.01
    if scaling.on_cpu_shortage == "shrink" and fit >= 0.01:
        return scaling.model_copy(
            update={"resources_per_worker": {**scaling.resources_per_worker, "CPU": fit}}
        )
    raise PreflightError(
        f"scaling asks for {n} workers x {cpu_each:g} CPU plus {DATA_CPU_RESERVE:g} CPU for "
        f"Ray Data = {needed:g} CPUs, the Ray cluster has {cpus:g}: set "
        f"scaling.resources_per_worker.CPU to at most {fit:g}, lower scaling.num_workers, "
        "or set scaling.on_cpu_shortage=shrink"
    )


def _worker_bundles(scaling: ScalingSection) -> list[dict[str, float]]:
    cpu, gpu = worker_resources(scaling)
    bundle = {**scaling.resources_per_worker, "CPU": cpu, **({"GPU": gpu} if gpu else {})}
    return [bundle] * scaling.num_workers + [{"CPU": DATA_CPU_RESERVE}]


def preflight(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> PipelineConfig:
    """Fail now, with what to change, when the cluster cannot run the training workers;
    return the config to run (its scaling shrunk when the config allows it).

    Ray's own behaviour is to wait: for GPUs that do not exist, or for CPUs that the
    training workers and Ray Data both need. A wait without end is worse than an error.
    On an autoscaling cluster, ``scaling.wait_for_resources_s`` asks the autoscaler for
    the workers' resources and waits that long for them to appear.
    """
    import ray

    scaling = config.scaling
    deadline = time.monotonic() + scaling.wait_for_resources_s
    requested = False
    try:
        while True:
            try:
                fitted = fit_scaling(scaling, ray.cluster_resources())
                break
            except PreflightError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    if requested:
                        raise PreflightError(f"{e} (waited {scaling.wait_for_resources_s:g} s)") from None
                    raise
                if not requested:
                    from ray.autoscaler.sdk import request_resources

                    logger.info("waiting up to %.0f s for the cluster to scale up: %s", left, e)
                    request_resources(bundles=_worker_bundles(scaling))
                    requested = True
                time.sleep(min(1.0, left))
    finally:
        if requested:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[])  # the trainer's own placement group holds them now
    if fitted is not scaling:
        logger.warning(
            "scaling.resources_per_worker.CPU %g leaves Ray Data no CPU on this cluster (%g CPUs): "
            "running %d workers with %g CPU each (scaling.on_cpu_shortage=shrink)",
            worker_resources(scaling)[0],
            ray.cluster_resources().get("CPU", 0.0),
            scaling.num_workers,
            fitted.resources_per_worker["CPU"],
        )
    check_cluster(config, logger)
    return config.model_copy(update={"scaling": fitted})


def check_cluster(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> None:
    """What a cluster needs beyond resources: on one the run did not start, the same
    Python, Ray and torch as this driver (:func:`check_versions`); on several nodes, the
    run's storage and the prepared-split cache shared by all of them (:func:`check_shared`)."""
    check_shipped(logger, module=config.model.user_module)
    nodes = alive_nodes()
    if len(nodes) > 1:
        check_shared(shared_folders(config), nodes)


def check_shipped(logger: logging.Logger | logging.LoggerAdapter = log, module: str | None = None) -> None:
    """On a cluster the session did not start (trainflow shipped to it), the versions and
    ``module`` checked there (:func:`check_versions`); nothing on a local cluster."""
    if _shipped_to:
        check_versions(_shipped_to, logger, module=module)


def alive_nodes() -> dict[str, str]:
    """The cluster's alive nodes: node id and address."""
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if n.get("Alive")}


def _versions(module: str | None = None) -> dict[str, str | None]:
    """This process's Python (major.minor), Ray and torch versions, where it imports
    trainflow from, and the error importing ``module`` raised (None: it imported, or no
    module). torch's version is its installed distribution's, read without importing torch
    (seconds of a worker's time): the version pip installed, which torch reports too."""
    from importlib import metadata

    import ray

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    module_error = None
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - whatever the import raised is the answer
            module_error = f"{type(e).__name__}: {_first_line(e)}"
    return {
        "Python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "Ray": ray.__version__,
        "torch": torch,
        "trainflow": trainflow_package(),
        "module_error": module_error,
    }


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def check_versions(
    address: str,
    logger: logging.Logger | logging.LoggerAdapter = log,
    timeout_s: float = 120.0,
    module: str | None = None,
) -> dict[str, str | None]:
    """PreflightError unless a worker of the cluster at ``address``, started with the job's
    runtime_env (trainflow shipped), runs this driver's Python (major.minor), Ray and
    torch: a model pickled by one torch and loaded by another, or a Ray worker of another
    release, fails mid-run or worse. With ``module`` (the user's model module, shipped
    with the job), also unless that worker imports it: what the module imports in turn
    must be installed on the cluster, and Train's workers would each fail on it. Returns
    what the worker reported."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    try:
        theirs = ray.get(ray.remote(num_cpus=0)(_versions).remote(module), timeout=timeout_s)
    except GetTimeoutError:
        raise PreflightError(
            f"no worker of the Ray cluster at {address} started within {timeout_s:g} s to report its "
            "versions: is the cluster overloaded, or its runtime_env setup stuck (see the raylet's logs)?"
        ) from None
    except RayError as e:
        raise PreflightError(
            f"a worker of the Ray cluster at {address} failed to start with trainflow shipped to it: "
            f"{_first_line(e)}"
        ) from None
    ours = _versions()
    for name in ("Python", "Ray", "torch"):
        if theirs[name] != ours[name]:
            raise PreflightError(
                f"the Ray cluster at {address} runs {name} {theirs[name] or '(not installed)'}, this driver "
                f"{ours[name]}: install the same versions on both"
            )
    if theirs["module_error"]:
        raise PreflightError(
            f"model.kind: a worker of the Ray cluster at {address} cannot import {module}, which the "
            f"job ships: {theirs['module_error']}; install what it imports on the cluster's nodes"
        )
    logger.info(
        "the Ray cluster at %s runs Python %s, Ray %s and torch %s as this driver does; its workers "
        "import trainflow from %s",
        address,
        theirs["Python"],
        theirs["Ray"],
        theirs["torch"],
        theirs["trainflow"],
    )
    return theirs


def shared_folders(config: PipelineConfig) -> dict[str, str]:
    """The folders every node of a cluster writes and this driver reads, by the name a
    user sets them with: Ray Train's runs (``storage``) and the prepared splits (the cache)."""
    storage = config.storage or str(workspace().runs)
    return {
        "storage": storage if is_uri(storage) else os.path.abspath(storage),
        "cache": cache_location(config),
    }


# Where a user sets each shared folder, for the message when one is not shared.
_FOLDER_SETTINGS = {
    "storage": "set storage to",
    "cache": "set cache to",
}
MARKERS = ".trainflow-preflight-"


def _write_markers(folders: dict[str, str], token: str) -> dict[str, str]:
    """Runs on one node: writes a marker holding the node's id into each folder's marker
    folder, which the driver made; returns the error per folder it could not write in.
    The marker folder is not created here: a node without the shared mount would
    create a folder of its own and write there, unseen."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    errors = {}
    for name, folder in folders.items():
        try:
            fs, path = filesystem(folder)
            with fs.open_output_stream(f"{path}/{MARKERS}{token}/{node}") as out:
                out.write(node.encode())
        except Exception as e:  # noqa: BLE001 - any failure to write is the answer
            errors[name] = f"{type(e).__name__}: {_first_line(e)}"
    return errors


def check_shared(
    folders: dict[str, str], nodes: dict[str, str] | None = None, timeout_s: float = 120.0
) -> None:
    """PreflightError, naming the folder and the node, unless a task pinned on each alive
    node of the cluster writes a marker into each of ``folders`` (name: path or URI) that
    this driver then reads back. Ray Train writes checkpoints from the node of worker rank
    0 and reads them wherever the next worker group lands; preparing writes the cache from
    any node and training reads it from others; this driver reads both. Nothing is
    checked on a single node, which shares its own disk. ``nodes``: node id to address,
    the alive nodes (:func:`alive_nodes`) when not given."""
    import secrets

    import ray
    from ray.exceptions import GetTimeoutError, RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes() if nodes is None else nodes
    if len(nodes) < 2:
        return
    token = secrets.token_hex(6)
    made = []
    try:
        for name, folder in folders.items():
            fs, path = filesystem(folder)
            try:
                fs.create_dir(f"{path}/{MARKERS}{token}")
            except OSError as e:
                raise PreflightError(
                    f"{name} {folder} is not writable from this driver: {_first_line(e)}"
                ) from None
            made.append((fs, f"{path}/{MARKERS}{token}"))
        task = ray.remote(num_cpus=0, max_retries=0)(_write_markers)
        refs = {
            node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                folders, token
            )
            for node in nodes
        }
        for node, ref in refs.items():
            where = f"Ray node {node} ({nodes[node]})"
            try:
                errors = ray.get(ref, timeout=timeout_s)
            except GetTimeoutError:
                raise PreflightError(
                    f"{where} did not answer within {timeout_s:g} s when asked to write into "
                    f"{', '.join(folders.values())}"
                ) from None
            except RayError as e:
                raise PreflightError(
                    f"{where} could not run the shared storage check: {_first_line(e)}"
                ) from None
            for name, folder in folders.items():
                if name in errors:
                    raise PreflightError(
                        f"{name} {folder} is not reachable from {where}: {errors[name]}; "
                        f"{_FOLDER_SETTINGS.get(name, 'set it to')} a folder every node and this driver "
                        "mount at the same path, or shared storage"
                    )
                fs, path = filesystem(folder)
                try:
                    with fs.open_input_stream(f"{path}/{MARKERS}{token}/{node}") as marker:
                        seen = marker.read().decode() == node
                except (OSError, FileNotFoundError):
                    seen = False
                if not seen:
                    raise PreflightError(
                        f"{name} {folder} is not shared: {where} wrote a marker there that this driver "
                        f"does not see; {_FOLDER_SETTINGS.get(name, 'set it to')} a folder every node and "
                        "this driver mount at the same path, or shared storage"
                    )
    finally:
        for fs, marker_folder in made:
            try:
                fs.delete_dir(marker_folder)
            except OSError:
                pass


def sweep_concurrency(sweep: SweepConfig, total: dict[str, float]) -> int:
    """How many trials run at once: each trial's workers (``sweep.scaling``) side by side,
    with one CPU left for Ray Data, capped by ``sweep.max_concurrent``. PreflightError
    when not even one trial fits, saying what to change."""
    scaling = sweep.scaling
    try:
        fit_scaling(scaling.model_copy(update={"on_cpu_shortage": "fail"}), total)
    except PreflightError as e:
        reason = (
            str(e)
            .replace("scaling.", "sweep.scaling.")
            .replace(", or set sweep.scaling.on_cpu_shortage=shrink", "")
        )
        raise PreflightError(f"one sweep trial does not fit: {reason}") from None
    n = scaling.num_workers
    cpu_each, gpu_each = worker_resources(scaling)
    fits = [
        math.floor((total.get("CPU", 0.0) - DATA_CPU_RESERVE) / (n * cpu_each) + 1e-9)
        if cpu_each
        else sweep.trials
    ]
    if gpu_each:
        fits.append(math.floor(total.get("GPU", 0.0) / (n * gpu_each) + 1e-9))
    for name, amount in scaling.resources_per_worker.items():
        if name not in ("CPU", "GPU") and amount:
            fits.append(math.floor(total.get(name, 0.0) / (n * amount) + 1e-9))
    return max(1, min([*fits, sweep.max_concurrent or math.inf]))


def preflight_sweep(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> int:
    """Fail now when one trial cannot run on the cluster; return how many run at once."""
    import ray

    sweep = config.sweep
    total = ray.cluster_resources()
    concurrency = sweep_concurrency(sweep, total)
    fit_all = sweep_concurrency(sweep.model_copy(update={"max_concurrent": None}), total)
    if sweep.max_concurrent and sweep.max_concurrent > fit_all:
        logger.warning(
            "sweep.max_concurrent %d: the Ray cluster (%g CPUs) fits %d trials of %d workers x %s "
            "at once, with a CPU for Ray Data; running %d at a time",
            sweep.max_concurrent,
            total.get("CPU", 0.0),
            fit_all,
            sweep.scaling.num_workers,
            sweep.scaling.resources_per_worker,
            fit_all,
        )
    check_cluster(config, logger)
    return concurrency
