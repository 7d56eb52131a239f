"""Every use trainflow and its tests make of Ray's private modules, attributes and internal
switches, in one place.

Nothing else in trainflow or its tests names a private module of Ray's (``ray._private``,
``ray.*._internal``), a private function or attribute, or a switch Ray does not document.
Each use has a test in ``tests/test_ray_internals.py`` that fails when Ray changes what it
relies on, and degrades, where Ray moved it, to Ray's own behaviour: slower or noisier,
never wrong. Checked against Ray 2.60.0, the pinned release. Each use: what it does;
Ray's names; why no public API does it; what happens where Ray moves it.

1. The GCS key-value store, for a training's progress rows and a sweep's placement groups
   (:func:`kv_put` ...). ``ray.experimental.internal_kv._internal_kv_*``. The store every
   process already talks to, with no actor to start. Moved: a warning; epochs are not logged
   as they end, and a stopped trial's placement group is left to Ray's own cleaner.
2. An actor's state from the GCS (:func:`actor_alive`). ``ray._private.state.actors``.
   The state API asks the dashboard, which trainflow's clusters do not start. Moved: the
   cleaner keeps Ray's own check.
3. Train's placement-group cleaner answered by the GCS (:func:`answer_cleaner_from_gcs`).
   The module :data:`PG_CLEANER` and its ``is_actor_alive``. Ray's check needs the
   dashboard, else asks whichever cluster holds port 8265. Moved: Ray's own check.
4. The processes and logs of the local cluster this driver started
   (:func:`local_cluster_processes`, :func:`session_logs`). ``ray._private.worker._global_node``.
   Nothing public says whether this process started its cluster, or which processes are its.
   Moved: no watch, and a cluster killed under a run makes Ray wait 60 s.
5. The workers' output on the driver's console, hidden and shown (:func:`worker_output_shown`),
   Ray's noise dropped (:func:`drop_worker_noise`). ``ray._private.ray_logging``'s stdstream
   dispatcher. ``log_to_driver``, set at ``ray.init``, filters nothing. Moved: Ray's output.
6. The resources a local cluster would have, before it starts
   (:func:`local_cluster_resources`). ``ray._private.resource_and_label_spec``.
   ``ray.cluster_resources()`` needs a running cluster. Moved: the check waits for
   ``ray.init``.
7. A user's module uploaded for an actor's runtime_env (:func:`upload_py_modules`).
   ``ray._private.runtime_env.py_modules.upload_py_modules_if_needed``. An actor's runtime_env
   takes only URIs, and only ``ray.init`` uploads local paths. Moved: the job's runtime_env
   ships it where trainflow opened the session; elsewhere the workers' check names it.
8. Loggers of Ray's private modules kept quiet (:data:`ERRORS_ONLY_LOGGERS` ...): their
   module names. Their records are Ray's own INFO lines or tracebacks Ray calls expected.
   Moved: the records show again.
9. Ray Train's controller without the autoscaling coordinator on a local cluster, and
   without the dataset manager when no split streams (:func:`trainer_class`,
   ``FixedClusterPolicy``). ``FixedScalingPolicy`` and its ``_*_resource_request``,
   ``DatasetsCallback``, ``TorchTrainer._create_default_callbacks`` and
   ``_initialize_and_run_controller``. Ray Train starts both helper processes for every
   run. Moved: every run starts both.
10. Ray's ``TorchConfig`` from a module without torch, for the controller
    (:func:`torch_config`). ``ray.train._internal.utils.get_address_and_port``,
    ``ray.train.v2._internal.util.TrainingFramework``, ``ray.train.torch.config._*``,
    ``ray._private.ray_constants``. Ray's own module imports torch at its top. Moved:
    Ray's own TorchConfig, and a controller that imports torch.
11-12. A driver reaching a cluster it did not start: in :mod:`.client`.
13-15. Ray's internal switches (environment variables, a Ray Data flag): in :mod:`.switches`.
16. A worker's own exception inside Ray Train's wrapper: in :mod:`.errors`.
17-20. What only trainflow's tests make or read of Ray's internals: in :mod:`.probes`.
21. A local node that missed its start-up wait: in :mod:`.errors`.
22. Serve's replica answering HTTP itself, without its proxy: in :mod:`.switches`.
23. A local cluster's dashboard agent on a port of the system's choosing: in :mod:`.switches`.
24. A local node's start-up waits stretched to trainflow's bound: in :mod:`.switches`.
25. Serve's first deadline for a replica's queue length, in trainflow's tests: in :mod:`.switches`.

Nothing here runs on import, and every Ray import is inside a function: every Ray worker
of a run imports this module (:func:`trainflow.cluster.quiet.quiet_worker`). Uses 9 and
10's classes, which Ray Train's controller unpickles, are in :mod:`.training`, imported
where a training starts: their bases' modules are slow to import."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Sequence

from trainflow.ray_internals.output import IGNORED, WORKER_ABORT, WORKER_NOISE, without_noise  # noqa: F401 - use 5

log = logging.getLogger("trainflow")

# 1. The GCS key-value store.

_kv_moved: list[str] = []  # the functions found moved, each warned of once


def _kv(name: str) -> Callable | None:
    """One of Ray's ``_internal_kv_*`` functions; None, with a warning once, where Ray moved them."""
    import ray
    from ray.experimental import internal_kv

    function = getattr(internal_kv, f"_internal_kv_{name}", None)
    if function is None and not _kv_moved:
        _kv_moved.append(name)
        log.warning(
            "Ray %s has no ray.experimental.internal_kv._internal_kv_%s: training progress is not "
            "logged per epoch, and a sweep leaves stopped trials' placement groups to Ray's cleaner",
            ray.__version__,
            name,
        )
    return function


def kv_put(key: str, value: str | bytes, namespace: str, overwrite: bool = True) -> bool:
    """Store ``value`` at ``key``; True when the key existed already (and ``overwrite`` kept it)."""
    put = _kv("put")
    return bool(put(key, value, overwrite=overwrite, namespace=namespace)) if put else False


def kv_get(key: bytes | str, namespace: str) -> bytes | None:
    return get(key, namespace=namespace) if (get := _kv("get")) else None


def kv_list(prefix: str, namespace: str) -> list[bytes]:
    """The keys that start with ``prefix``."""
    return list(keys(prefix, namespace=namespace)) if (keys := _kv("list")) else []


def kv_delete_prefix(prefix: str, namespace: str) -> None:
    """Delete every key that starts with ``prefix``."""
    if delete := _kv("del"):
        delete(prefix, del_by_prefix=True, namespace=namespace)


# 2 and 3. Train's placement-group cleaner, answered by the GCS, which knows its own actors: asked at
# 127.0.0.1:8265, another cluster's dashboard says a live controller is gone, and its group is removed.
PG_CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def actor_alive(actor_id: str, timeout: float | None = None) -> bool:
    """Whether the actor ``actor_id`` of this process's Ray cluster may still be alive:
    False only once the cluster's GCS records it DEAD. The cleaner's liveness check (same
    arguments; the GCS call keeps its own timeout). A GCS that does not answer raises the
    state API's error, which the cleaner logs and retries at its next check."""
    import ray._private.state
    from ray.util.state.exception import RayStateApiException

    try:
        info = ray._private.state.actors(actor_id=actor_id)
    except (ray.exceptions.RpcError, ray.exceptions.RaySystemError) as e:
        raise RayStateApiException(f"the GCS did not say whether actor {actor_id} lives: {e}") from e
    return info.get("State") != "DEAD"


class _CleanerFromGcs(importlib.abc.MetaPathFinder):
    """Gives the cleaner's module :func:`actor_alive` as its liveness check when a worker (the
    cleaner's own actor) imports it, without importing it into every worker (it brings Ray Data)."""

    def find_spec(self, name, path, target=None):
        if name != PG_CLEANER:
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
    if hasattr(module, "is_actor_alive"):  # else Ray renamed it: the cleaner keeps its own
        module.is_actor_alive = actor_alive


def answer_cleaner_from_gcs() -> None:
    """Have Train's placement-group cleaner, in this process, learn whether a run's
    controller lives from the cluster's GCS. Idempotent."""
    if PG_CLEANER in sys.modules:
        _use_gcs_liveness(sys.modules[PG_CLEANER])
    elif not any(isinstance(finder, _CleanerFromGcs) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CleanerFromGcs())


# 4. The local cluster this driver started.


def local_cluster_processes(names: Sequence[str]) -> dict:
    """The ``subprocess.Popen`` of each of ``names`` (``gcs_server``, ``raylet``,
    ``log_monitor``...) of the local cluster this process started; none for a cluster
    started elsewhere, or where Ray moved its node's table."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker._global_node
        table = node.all_processes if node is not None else {}
        return {name: table[name][0].process for name in names if table.get(name)}
    except Exception:  # noqa: BLE001 - Ray's internals moved: no watch, Ray's own behaviour
        return {}


def session_logs() -> str:
    """The folder of this Ray session's logs (RAY_TMPDIR moves it)."""
    try:
        import ray._private.worker as ray_worker

        return ray_worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - Ray's internals moved: its default place
        return "/tmp/ray/session_latest/logs"


# 5. The workers' output on this driver's console; what it drops: .output.

_hidden_worker_output: list = []  # Ray's console handler, while taken away


def _dispatcher():
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except Exception:  # noqa: BLE001 - Ray's internals moved: the output stays as Ray prints it
        return None
    return dispatcher


def worker_output_shown(shown: bool) -> None:
    """Show or hide, on this driver's console, what the cluster's workers print (Ray's
    ``log_to_driver``, whose handler is taken away and put back)."""
    if (dispatcher := _dispatcher()) is None:
        return
    with dispatcher._lock:
        if shown and _hidden_worker_output:
            dispatcher.handlers.extend(_hidden_worker_output)
            _hidden_worker_output.clear()
        elif not shown:
            _hidden_worker_output.extend(pair for pair in dispatcher.handlers if pair[0] == "ray_print_logs")
            dispatcher.handlers = [pair for pair in dispatcher.handlers if pair[0] != "ray_print_logs"]


def drop_worker_noise() -> None:
    """Keep the lines of :data:`WORKER_NOISE` off this driver's console: Ray's printing
    handler (``log_to_driver``), wrapped. Idempotent."""
    if (dispatcher := _dispatcher()) is None:
        return
    with dispatcher._lock:
        dispatcher.handlers = [(name, without_noise(name, handler)) for name, handler in dispatcher.handlers]


# 6. A local cluster's resources, before it starts.


def local_cluster_resources() -> dict[str, float] | None:
    """What a local cluster that ``ray.init()`` starts on this machine would have (CPUs,
    GPUs, memory), found the way Ray finds it (cgroup limits, CUDA_VISIBLE_DEVICES,
    RAY_OVERRIDE_RESOURCES) without starting anything; None where Ray moved it."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1")
        return {name: float(amount) for name, amount in spec.to_resource_dict().items()}
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


# 7. A user's module, uploaded for an actor's runtime_env.


def upload_py_modules(paths: Sequence[str]) -> dict:
    """A runtime_env whose ``py_modules`` are the local ``paths`` uploaded to the
    connected cluster (``gcs://`` URIs); empty where Ray moved its upload."""
    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    except ImportError:  # the job's own runtime_env, where trainflow opened the session, ships them
        return {}
    return upload_py_modules_if_needed({"py_modules": list(paths)}, include_gitignore=True)


def setup_hook_variable() -> str | None:
    """The variable ``ray.init`` names a worker setup hook by (use 11); None where Ray moved it."""
    from ray._private import ray_constants  # use 10's module too

    return getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)


# 8. Loggers of Ray's private modules.

# Ray's notice, on every start of a local cluster, that it keeps token auth on.
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
# A Dataset execution's warning that progress bars are off (off on purpose away from a terminal).
DATA_PROGRESS_LOGGER = "ray.data._internal.progress"
# A streamed split's coordinator: "Dataset ... execution finished in N seconds", each epoch.
STREAMING_EXECUTOR_LOGGER = "ray.data._internal.execution.streaming_executor"
# Train's "Error in training function" record, with the worker's traceback.
TRAIN_ERRORS_LOGGER = "ray.train.v2._internal.util"
# Train's controller: a traceback when a worker group is late to start (an elastic shrink).
TRAIN_CONTROLLER_LOGGER = "ray.train.v2._internal.execution.controller.controller"
# Train's checkpoint manager: an error line for each checkpoint reported without the score attribute.
CHECKPOINT_SCORE_LOGGER = "ray.train._internal.checkpoint_manager"
# Loggers whose records below ERROR a run keeps off the console: the cleaner's warning when it removes a
# dead controller's group (a trial a sweep stopped); the autoscaling coordinator client's traceback when a
# call misses its timeout on a busy machine, and the backend's when a sweep stops a trial whose workers are
# gone (Ray calls both safe); a PBT trial's line for each checkpoint it hands Tune or is restored from.
ERRORS_ONLY_LOGGERS = (
    PG_CLEANER,
    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client",
    "ray.train.v2._internal.callbacks.backend_setup",
    "ray.train._internal.storage",
    "ray.tune.trainable.trainable",
)


def train_report_logger() -> str:
    """The logger of Train's worker context, which logs every report at INFO: named by
    its file's path, outside ``ray.train``, where RunConfig's LoggingConfig misses it."""
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution", "context.py")


# 9 and 10. What Ray Train's controller runs and unpickles of a trainflow training (its
# classes: .training).


def trainer_class(fixed_cluster: Callable[[], bool]) -> type:
    """TorchTrainer, less two helper processes Ray Train starts for every run: the dataset
    manager (an actor that imports Ray Data, pandas and pyarrow to shard Datasets), for a
    run whose splits all sit in the workers' memory; and, when ``fixed_cluster()`` (a local
    cluster this process started, which no autoscaler grows) and no Datasets share it, the
    autoscaling coordinator (:class:`~.training.FixedClusterPolicy`). Where Ray moved either,
    TorchTrainer itself."""
    from ray.train.torch import TorchTrainer

    try:
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
        from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy

        from trainflow.ray_internals.training import FixedClusterPolicy
    except ImportError:
        return TorchTrainer

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            if self.datasets:
                return callbacks
            return [c for c in callbacks if not isinstance(c, DatasetsCallback)]

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            policy = controller_init_kwargs.get("scaling_policy")
            if type(policy) is FixedScalingPolicy and not self.datasets and fixed_cluster():
                controller_init_kwargs["scaling_policy"] = FixedClusterPolicy(policy.scaling_config)
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    return Trainer


def torch_config():
    """The backend config of a CPU or CUDA run's TorchTrainer: :class:`~.training.TorchConfig`, whose
    module imports no torch, where Ray's private names are still there; else Ray's own
    ``TorchConfig`` (its controller then imports torch: slower, same result)."""
    try:
        from trainflow.ray_internals.training import TorchConfig
    except ImportError:
        from ray.train.torch import TorchConfig
    return TorchConfig()


def process_group_backend(backend: str | None, resources_per_worker: dict[str, float]) -> str:
    """torch.distributed's backend for workers with these resources, as Ray picks it:
    ``backend`` when set, else nccl for workers with GPUs and gloo for CPU workers."""
    if backend:
        return backend
    return "nccl" if resources_per_worker.get("GPU", 0) > 0 else "gloo"


# Run on the workers (TorchBackend's steps): each imports Ray's torch module there, not in
# the controller.
def _set_master(address: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)


def _torch(name: str, **kwargs) -> None:
    """``ray.train.torch.config.<name>(**kwargs)``: one of Ray's torch backend steps."""
    import ray.train.torch.config

    getattr(ray.train.torch.config, name)(**kwargs)
