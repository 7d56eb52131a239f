"""A command's start-up: what its flow run needs, started side by side.

A flow run needs a Prefect API, a Ray cluster, its own imports (torch) and, to
register, the MLflow store. One after the other, their start-ups add up. Here Prefect's
temporary server starts first, as a subprocess (so that its start-up, and on a new
machine its database migrations, do not wait behind Ray and torch for the CPU); then
the flow's module is imported and the MLflow store opened in threads while this thread
starts Ray. The flow run, called inside, finds Ray connected and uses the session as it
is, while the store may still be opening (the register step waits for it); the command
shuts Ray down when the flow returns. A command checks its run
(``trainflow.run_checks``) first, as Prefect's server and its Ray workers' forkserver start.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext

from trainflow import prefect_server
from trainflow.cluster.quiet import apply_quiet_env, command_logger
from trainflow.cluster.session import WORKER_PYTHON_ENV, ray_address, ray_session
from trainflow.config import PipelineConfig
from trainflow.signals import interrupts_deferred, raise_if_interrupted
from trainflow.start_wait import said_if_slow
from trainflow.timeline import timeline
from trainflow.workspace import workspace


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
    store, and the imports of the evaluation plots it publishes."""
    _open_registry()
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401


def _open_registry() -> None:
    """Open the registry's store once: MLflow's imports, and on a new TRAINFLOW_HOME the
    embedded database's tables, are then ready when the register step runs."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    from trainflow.pipelines import registry

    registry.client(workspace())
    timeline("mlflow store open")
