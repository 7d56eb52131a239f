"""One command's runtime: what `trainflow run`, `sweep`, `predict` and `models reproduce`
do before and around their flow, entered the same way by each (:class:`Command`).

Entering it attaches to the services of ``trainflow up`` where they run, and starts the
process of Prefect's temporary server and the forkserver of Ray's workers, whose start-ups
overlap the command's checks. :meth:`Command.check` runs the checks before Ray and the flow
start. :meth:`Command.call` then brings up what a flow run needs side by side
(:func:`started`): Prefect's API, the flow's module (torch), the MLflow store in threads,
and Ray in this one; it calls the flow inside, finding Ray connected, and shuts Ray down
after. Whatever ends a command early, a failed check, a failed flow, Ctrl-C or a stop
signal, is :class:`Ended`: the one line to print and the exit code.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import TypeVar

from trainflow import prefect_server
from trainflow.cluster.quiet import apply_quiet_env, command_logger
from trainflow.cluster.session import WORKER_PYTHON_ENV, ray_address, ray_session
from trainflow.config import ConfigError, PipelineConfig
from trainflow.signals import interrupts_deferred, raise_if_interrupted, sigint_stops_the_run
from trainflow.start_wait import said_if_slow
from trainflow.timeline import timeline
from trainflow.workspace import workspace

T = TypeVar("T")


class Ended(Exception):
    """A command ended early: ``line`` for the console, ``code`` for the shell. ``error``:
    a failure (printed as ``error: <line>``), not a stop."""

    def __init__(self, line: str, code: int = 2, *, error: bool = True) -> None:
        super().__init__(line)
        self.line = line
        self.code = code
        self.error = error


def check_errors() -> tuple[type[Exception], ...]:
    """The failures of a run's checks that its one line explains (the user fixes the
    config, the data, the model reference or the cluster): exit code 2."""
    from mlflow.exceptions import MlflowException

    from trainflow.cluster.session import PreflightError
    from trainflow.pipelines.data.schema import DataError
    from trainflow.pipelines.registry.lineage import IntegrityError
    from trainflow.pipelines.registry.versions import RegistryError

    return (ConfigError, DataError, PreflightError, RegistryError, IntegrityError, MlflowException)


class Command:
    """The runtime of one command that runs the flow ``flow`` as the run ``run`` (with
    ``parameters``, shown on a check's failed run). ``imports``: the flow's module;
    ``cluster``: the config whose Ray cluster it uses, where known before its checks;
    ``torch_processes``: the Ray workers that import PyTorch (trials, prediction actors;
    default: the cluster config's most training workers), which a forkserver starts when
    they are many."""

    def __init__(
        self,
        flow: str,
        run: str,
        *,
        imports: str,
        cluster: PipelineConfig | None = None,
        torch_processes: int | None = None,
        **parameters,
    ) -> None:
        self.flow = flow
        self.run = run
        self.imports = imports
        self.cluster = cluster
        self.torch_processes = torch_processes
        self.parameters = parameters
        self.early: prefect_server.TemporaryServer | None = None
        self.workers = None

    def __enter__(self) -> Command:
        address = self.cluster.ray.address if self.cluster else None
        use_warm_services(address)
        self.early = api_early()  # Prefect's server comes up beside the checks
        if self.cluster is not None:  # and the imports of Ray's workers
            self.workers = self._worker_forks(self.cluster)
        return self

    def _worker_forks(self, cluster: PipelineConfig):
        processes = self.torch_processes
        if processes is None:
            processes = cluster.scaling.max_workers
        return own_worker_forks(cluster.ray.address, processes)

    def __exit__(self, *exc) -> None:
        # Handed to started(), which stops them; left here when the command ended before.
        if self.early is not None:
            self.early.stop()
        if self.workers is not None:
            self.workers.stop()

    def check(self, check: Callable[[], T]) -> T:
        """What ``check()`` (a ``run_checks.before_*``) found, before Ray and the flow
        start; a failed check is :class:`Ended` with its one line, and a failed run of the
        flow on a Prefect server the environment names."""
        try:
            found = check()
            raise_if_interrupted()
        except KeyboardInterrupt as e:
            raise stopped(e) from None
        except check_errors() as e:
            message = _one_line(e)
            prefect_server.record_failed_run(self.flow, self.run, message, self.parameters)
            raise Ended(message) from None
        return found

    def call(
        self,
        call: Callable[[], T],
        *,
        cluster: PipelineConfig | None = None,
        warm: tuple[str, ...] = (),
        open_registry: bool = True,
    ) -> T:
        """``call()`` the flow once its start-up (:func:`started`) is ready, on the Ray cluster
        of ``cluster`` (default: the command's). ``warm``: modules for Ray's first workers to
        import; ``open_registry``: open the MLflow store beside the flow. An expected failure
        (``tasks.logs``) is :class:`Ended` in its one line, exit code 2; any other names the
        flow, exit code 1 (the flow's logs above hold the traceback)."""
        from trainflow.tasks.logs import EXPECTED_ERRORS, drop_expected_errors_on_console

        cluster = cluster or self.cluster
        if self.cluster is None:  # known from the checks
            self.workers = self._worker_forks(cluster)
        starting = started(
            cluster,
            imports=self.imports,
            warm=warm,
            open_registry=open_registry,
            early=self.early,
            workers=self.workers,
        )
        self.early = None  # started() stops them
        self.workers = None
        try:
            # Ctrl-C ends the run in one line (stopped), wherever it lands.
            with sigint_stops_the_run(), starting:
                # On the console, a flow's expected failure is this command's one ``error:``
                # line: Prefect's own records of it stay in the run's logs, one line each.
                drop_expected_errors_on_console()
                result = call()
                timeline("flow returned")
        except prefect_server.PrefectServerError as e:
            raise Ended(str(e), code=1) from None
        except (KeyboardInterrupt, SystemExit) as e:
            raise stopped(e) from None
        except EXPECTED_ERRORS as e:
            raise Ended(str(e)) from None
        except Exception as e:
            what = self.flow.removesuffix("-pipeline")
            raise Ended(f"the {what} flow failed: {type(e).__name__}: {e}", code=1) from None
        return result


def _one_line(error: Exception) -> str:
    """An error's message; MLflow's first line alone (the rest is its server's detail)."""
    return str(error).splitlines()[0] if type(error).__module__.startswith("mlflow") else str(error)


def stopped(e: KeyboardInterrupt | SystemExit) -> Ended:
    """A run stopped by Ctrl-C or a stop signal (``signals.stop_on_signals``): one line,
    the shell's exit code for the signal. Prefect's records of the crash stay in the
    run's logs (the flow run ends Crashed) and off this console (``tasks.logs``)."""
    code = 128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.code
    try:
        stop = signal.Signals(code - 128)
    except (TypeError, ValueError):  # sys.exit() inside the flow, not a signal
        return Ended(f"the flow ended with sys.exit({code!r})", code=1)
    return Ended(f"stopped ({stop.name})", code, error=False)


def use_warm_services(ray_address: str | None) -> None:
    """Point this command at the services `trainflow up` keeps for its workspace, where
    they run (``ray_address``: the cluster the config names, which wins)."""
    from trainflow.stack import forkserver, warm

    if ray_address and forkserver.forked():  # the forkserver imported Ray for the warm cluster
        forkserver.run_plainly()
    services = warm.attach(workspace().home, ray_address)
    if services is None:
        return
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()  # PREFECT_API_URL, when attach set it
    command_logger().info("using the services of trainflow up (%s)", services.folder)


def own_worker_forks(ray_address: str | None, torch_processes: int):
    """The worker forkserver of a command that starts a local Ray cluster of its own
    (``stack.worker_forks.RunForks``), started now; None where the command uses another
    cluster (``ray_address``, RAY_ADDRESS, the warm one, one this process is connected to
    already), starts fewer than ``worker_forks.WORTH_IT`` Ray workers that import PyTorch
    (``torch_processes``), runs off Linux, or TRAINFLOW_WORKER_FORKS=0 says so."""
    from trainflow.stack import worker_forks

    if ray_address or os.environ.get("RAY_ADDRESS") or os.environ.get(worker_forks.OFF) == "0":
        return None
    if torch_processes < worker_forks.WORTH_IT or not sys.platform.startswith("linux"):
        return None
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return None
    try:
        return worker_forks.RunForks(workspace().home / "worker-forks.log")
    except OSError:  # no folder or log it can write: Ray starts the workers itself
        return None


@contextmanager
def started(
    ray_config: PipelineConfig,
    *,
    imports: str,
    warm: tuple[str, ...] = (),
    open_registry: bool = True,
    early: prefect_server.TemporaryServer | None = None,
    workers=None,
) -> Iterator[None]:
    """Prefect's API, the flow's module (``imports``), the MLflow store
    (``open_registry``) and Ray for ``ray_config``, started side by side; ready when this
    yields, but for the store, which goes on opening beside the flow. Raises
    ``prefect_server.PrefectServerError`` when Prefect's temporary server does not come
    up. ``warm``: modules for Ray's first worker processes to import
    (``cluster.session.warm_workers``); ``early``: the server :func:`api_early` started;
    ``workers``: the command's worker forkserver (``stack.worker_forks.RunForks``), which
    starts Ray's workers when Ray runs on a local cluster of this command's own."""
    apply_quiet_env()
    # MLflow hides this pydantic warning in warnings.catch_warnings(), which is not
    # thread-safe: imported beside other threads, it leaks through now and then.
    warnings.filterwarnings("ignore", message=r'Field name "schema" in "JsonSchemaSpec" shadows')
    with _prefect_api(early) as server, ExitStack() as ray:
        timeline("prefect server started" if server else "prefect server configured")
        if workers is not None:
            ray.enter_context(_forked_workers(ray_config, workers))
        # Imports in three threads: a Ctrl-C waits for a safe point (raised by wait()).
        with interrupts_deferred():
            flow = _Background("import-flow", lambda: importlib.import_module(imports))
            store = _Background("mlflow-store", _before_register) if open_registry else None
            # this thread, which outlives the run; the flow's logs follow the line with Ray's address
            ray.enter_context(ray_session(ray_config, command_logger(), warm))
            flow.wait()
            timeline("flow imported")
            collect_from_here()
            if server is not None:
                with said_if_slow("Prefect's temporary server to answer", command_logger()):
                    server.wait(check=raise_if_interrupted)
                timeline("prefect server answered")
        try:
            yield
        finally:
            # The flow runs beside the store's opening, which only its register step
            # needs (and then waits for); the command never exits in the middle of it.
            if store is not None:
                store.thread.join()
    timeline("prefect server stopped")


def collect_from_here() -> None:
    """Turn the garbage collector back on where a command's start-up turned it off (``cli/main.py``,
    for ``run``, ``sweep`` and ``predict``), its imports frozen first (:func:`gc.freeze`): half a
    million objects of PyTorch, Ray, Prefect and MLflow, which each full collection walked
    again (9 of them, 2 s of a cold run's start) and none walks now."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def _forked_workers(ray_config: PipelineConfig, workers) -> Iterator[None]:
    """Ray's workers forked from ``workers`` for the block, when the command starts a local
    cluster; the forkserver stopped after it (after Ray's shutdown: they are its children)."""
    try:
        if ray_address(ray_config) is None:
            os.environ[WORKER_PYTHON_ENV] = workers.use()
        yield
    finally:
        os.environ.pop(WORKER_PYTHON_ENV, None)
        workers.stop()
        timeline("worker forkserver stopped")


def api_early() -> prefect_server.TemporaryServer | None:
    """Prefect's temporary server for a command, its process started before the command's
    checks, on the CPU they leave idle (it leaves at once should Prefect's settings name a
    server); None where the environment names one. Hand it to :func:`started`."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    return prefect_server.TemporaryServer(workspace().home / "prefect-server.log").start_early()


def _prefect_api(early: prefect_server.TemporaryServer | None = None):
    """Prefect's temporary server for this command (``early``, or one started now) when no
    server is configured (PREFECT_API_URL or a profile); the context yields it (None: a
    configured server)."""
    if prefect_server.configured_api_url() is not None:
        if early is not None:
            early.stop()  # gone already: it read the same settings
        return nullcontext(None)
    return early or prefect_server.TemporaryServer(workspace().home / "prefect-server.log")


class _Background:
    """A start-up step in a thread of its own; ``wait()`` joins it and raises its error."""

    def __init__(self, name: str, fn: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as e:  # handed to the caller by wait()
            self.error = e

    def wait(self) -> None:
        while self.thread.is_alive():
            self.thread.join(0.1)
            raise_if_interrupted()
        if self.error is not None:
            raise self.error


def _before_register() -> None:
    """What a flow that registers needs by its end, made ready beside it: the registry's
    store, the register step's modules, and the imports of the evaluation plots it publishes."""
    _open_registry()
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    import trainflow.pipelines.registry.card  # noqa: F401
    import trainflow.pipelines.registry.registration  # noqa: F401


def _open_registry() -> None:
    """Open the registry's store once: MLflow's imports, and on a new TRAINFLOW_HOME the
    embedded database's tables, are then ready when the register step runs."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    from trainflow.pipelines.registry.store import client

    client(workspace())
    timeline("mlflow store open")
