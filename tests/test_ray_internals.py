"""Each use trainflow and its tests make of Ray's private modules, attributes and internal
switches, one test per use numbered as in :mod:`trainflow.ray_internals`' docstring: when a
Ray release changes what a use relies on (a module, attribute, function or switch gone, a
signature or behaviour changed), its test fails and names it. Each exercises the real
thing, on the session's Ray cluster where it needs one."""

import dataclasses
import importlib
import importlib.util
import inspect
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trainflow import ray_internals
from trainflow.ray_internals import errors, probes, switches

NAMESPACE = "trainflow-test-ray-internals"


# 1. The GCS key-value store.


def test_the_kv_store_keeps_lists_and_deletes_by_prefix_what_a_training_writes(ray_cluster):
    prefix = f"trainflow/test/{uuid.uuid4().hex[:8]}/"
    assert ray_internals.kv_put(f"{prefix}a", b"1", NAMESPACE) is False  # a new key
    assert ray_internals.kv_put(f"{prefix}a", b"2", NAMESPACE, overwrite=False) is True  # kept
    assert ray_internals.kv_get(f"{prefix}a", NAMESPACE) == b"1"
    assert ray_internals.kv_put(f"{prefix}b", "3", NAMESPACE) is False  # str is stored as bytes
    assert ray_internals.kv_get(f"{prefix}b".encode(), NAMESPACE) == b"3"
    assert sorted(ray_internals.kv_list(prefix, NAMESPACE)) == [f"{prefix}a".encode(), f"{prefix}b".encode()]
    ray_internals.kv_put("trainflow/test/elsewhere", b"", NAMESPACE)
    ray_internals.kv_delete_prefix(prefix, NAMESPACE)
    assert ray_internals.kv_list(prefix, NAMESPACE) == []
    assert ray_internals.kv_get(f"{prefix}a", NAMESPACE) is None
    assert ray_internals.kv_list("trainflow/test/elsewhere", NAMESPACE) == [b"trainflow/test/elsewhere"]
    ray_internals.kv_delete_prefix("trainflow/test/elsewhere", NAMESPACE)


def test_where_ray_moved_the_kv_store_each_call_answers_empty_after_one_warning(monkeypatch, caplog):
    """Ray without ``_internal_kv_*`` (taken away here, as a release that moved them would
    ship): no progress rows, no recorded placement groups, one warning that says so."""
    from ray.experimental import internal_kv

    monkeypatch.setattr(ray_internals, "_kv_moved", [])
    for name in ("put", "get", "list", "del"):
        monkeypatch.delattr(internal_kv, f"_internal_kv_{name}")
    with caplog.at_level(logging.WARNING, logger="trainflow"):
        assert ray_internals.kv_put("trainflow/test/key", b"", NAMESPACE) is False
        assert ray_internals.kv_get("trainflow/test/key", NAMESPACE) is None
        assert ray_internals.kv_list("trainflow/test/", NAMESPACE) == []
        ray_internals.kv_delete_prefix("trainflow/test/", NAMESPACE)
    warned = [r.getMessage() for r in caplog.records if r.name == "trainflow"]
    assert len(warned) == 1 and "ray.experimental.internal_kv._internal_kv_put" in warned[0], warned


# 2. An actor's state from the GCS.


def test_an_actor_lives_until_the_gcs_records_it_dead(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Controller:
        def ready(self) -> bool:
            return True

    controller = Controller.remote()
    ray.get(controller.ready.remote())
    actor_id = controller._actor_id.hex()
    assert ray_internals.actor_alive(actor_id, timeout=10) is True
    ray.kill(controller)
    deadline = time.monotonic() + 30
    while ray_internals.actor_alive(actor_id):
        assert time.monotonic() < deadline, "a killed actor still lives for the GCS"
        time.sleep(0.2)


# 3. Train's placement-group cleaner, answered by the GCS.


def test_the_cleaner_module_checks_liveness_through_is_actor_alive_with_its_arguments():
    """The cleaner calls ``is_actor_alive(actor_id=..., timeout=...)``, which
    :func:`~trainflow.ray_internals.actor_alive` replaces and must answer the same way."""
    spec = importlib.util.find_spec(ray_internals.PG_CLEANER)
    assert spec is not None and spec.loader is not None, f"Ray has no module {ray_internals.PG_CLEANER}"
    cleaner = importlib.import_module(ray_internals.PG_CLEANER)
    assert callable(getattr(cleaner, "is_actor_alive", None)), "the cleaner has no is_actor_alive"
    assert {"actor_id", "timeout"} <= set(inspect.signature(cleaner.is_actor_alive).parameters)
    assert {"actor_id", "timeout"} <= set(inspect.signature(ray_internals.actor_alive).parameters)


@pytest.mark.slow
def test_the_cleaner_module_imported_after_the_hook_asks_the_gcs():
    """In a fresh process (as the cleaner's own worker, whose setup hook runs first), the
    module finder gives the cleaner's module trainflow's check as it is imported."""
    code = (
        "import sys\n"
        "from trainflow import ray_internals\n"
        "assert ray_internals.PG_CLEANER not in sys.modules\n"
        "ray_internals.answer_cleaner_from_gcs()\n"
        "ray_internals.answer_cleaner_from_gcs()  # idempotent: one finder\n"
        "finders = [f for f in sys.meta_path if type(f).__name__ == '_CleanerFromGcs']\n"
        "assert len(finders) == 1, sys.meta_path\n"
        "import ray.train.v2._internal.execution.controller.placement_group_cleaner as cleaner\n"
        "assert cleaner.is_actor_alive is ray_internals.actor_alive, cleaner.is_actor_alive\n"
        "assert callable(cleaner.PlacementGroupCleaner)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_trains_placement_group_cleaner_asks_the_runs_own_cluster_whether_its_controller_lives(ray_cluster):
    """The cleaner removes a run's placement group once it believes the controller dead.
    Ray asks the state API, which a cluster without the dashboard (trainflow's) does not
    serve: the answer came from another cluster on the machine, or not at all. In
    trainflow's workers it comes from the cluster's own GCS: a live actor lives, and one
    that was killed is dead."""
    import time

    import ray

    @ray.remote(num_cpus=0)
    class Controller:
        def ready(self) -> bool:
            return True

    @ray.remote(num_cpus=0)
    def cleaner_says_alive(actor_id: str) -> bool:
        from ray.train.v2._internal.execution.controller import placement_group_cleaner

        return bool(placement_group_cleaner.is_actor_alive(actor_id=actor_id, timeout=10))

    controller = Controller.remote()
    ray.get(controller.ready.remote())
    actor_id = controller._actor_id.hex()
    assert ray.get(cleaner_says_alive.remote(actor_id)) is True
    ray.kill(controller)
    deadline = time.monotonic() + 30
    while ray.get(cleaner_says_alive.remote(actor_id)):
        assert time.monotonic() < deadline, "the cleaner still takes a killed controller for alive"
        time.sleep(0.2)


# 4. The local cluster this driver started.

LOCAL_CLUSTER = """\
import json, os
import ray
from trainflow import ray_internals
from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV
from trainflow.cluster.session import ray_init_kwargs

names = ["gcs_server", "raylet", "log_monitor", "monitor"]
before = ray_internals.local_cluster_processes(names)
os.environ.update(LOCAL_CLUSTER_ENV)
ray.init(address="local", num_cpus=1, **ray_init_kwargs())
processes = ray_internals.local_cluster_processes(names)
logs = ray_internals.session_logs()
print("ANSWER " + json.dumps({
    "before": sorted(before),
    "running": {name: p.poll() is None for name, p in processes.items()},
    "commands": {name: open(f"/proc/{p.pid}/cmdline", "rb").read().decode() for name, p in processes.items()},
    "logs": logs,
    "log_files": sorted(os.listdir(logs)) if os.path.isdir(logs) else None,
}), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
def test_a_driver_that_started_its_local_cluster_finds_its_processes_and_logs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_CLUSTER],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    answer = json.loads(lines[0].removeprefix("ANSWER "))
    assert answer["before"] == []  # no cluster yet: nothing to watch
    # The autoscaler's monitor too: a session's shutdown ends it first (cluster.session).
    assert answer["running"] == {"gcs_server": True, "raylet": True, "log_monitor": True, "monitor": True}
    for name, command in answer["commands"].items():
        assert name in command, (name, command)
    # The watch's one line names the log of the process that ended: {logs}/{process}.out.
    assert answer["log_files"] is not None, answer["logs"]
    assert {"gcs_server.out", "raylet.out"} <= set(answer["log_files"]), answer["log_files"]


# 5. The workers' output on this driver's console.


def test_workers_output_leaves_the_console_and_comes_back(ray_cluster):
    """Ray's ``log_to_driver`` handler, ``ray_print_logs``, is taken off the dispatcher
    that hands the driver its workers' lines, and put back (the same handler, once)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    def printing() -> list:
        return [handler for name, handler in dispatcher.handlers if name == "ray_print_logs"]

    shown = printing()
    assert len(shown) == 1, dispatcher.handlers
    try:
        ray_internals.worker_output_shown(False)
        assert printing() == []
        ray_internals.worker_output_shown(False)
        assert printing() == []
    finally:
        ray_internals.worker_output_shown(True)
    assert printing() == shown
    ray_internals.worker_output_shown(True)  # shown already: nothing added
    assert printing() == shown


def test_rays_noise_from_a_worker_stays_off_the_console_and_its_other_lines_reach_it(ray_cluster, capfd):
    """Ray's printing handler, wrapped once, drops a worker's :data:`WORKER_NOISE` lines,
    and every line of a worker from its :data:`WORKER_ABORT` on, and prints the rest; the
    handler's data still carries its lines as a list."""
    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    ray_internals.drop_worker_noise()
    ray_internals.drop_worker_noise()  # once is enough
    printing = [handler for name, handler in dispatcher.handlers if name == "ray_print_logs"]
    assert len(printing) == 1 and callable(printing[0].unfiltered), dispatcher.handlers

    marker = uuid.uuid4().hex

    def ignored(last_frame: str, error: str) -> str:  # as Python prints an exception in a callback
        return (
            f"{ray_internals.IGNORED} <function WeakSet.__init__.<locals>._remove at 0x7f97> {marker}\n"
            'Traceback (most recent call last):\n  File "_weakrefset.py", line 39, in _remove\n'
            f'\n  File "ray/_private/worker.py", line 1063, in {last_frame}\n{error}\n'
        )

    @ray.remote(num_cpus=0)
    def say() -> None:
        for noise in ray_internals.WORKER_NOISE:
            print(f"[E core_worker.cc:2465] Actor {noise} {marker}", file=sys.stderr)
        # Ray's SIGTERM landing in a weakref callback: dropped; another error there: kept.
        print(ignored("sigterm_handler", "SystemExit: 1"), file=sys.stderr, end="")
        print(ignored("user_callback", f"ValueError: kept {marker}"), file=sys.stderr, end="")
        print(f"worker line {marker}", file=sys.stderr, flush=True)

    @ray.remote(num_cpus=0)
    class Aborting:  # a process of its own: its pid's lines end at the abort
        def abort(self) -> int:
            print(
                f"[C core_worker.cc:3345] {ray_internals.WORKER_ABORT} Status not OK {marker}",
                file=sys.stderr,
            )
            print(f"*** StackTrace Information *** {marker}", file=sys.stderr)
            print(f"ray::IDLE(_start+0x21) {marker}", file=sys.stderr, flush=True)
            return os.getpid()

    aborting = Aborting.remote()
    assert ray.get(aborting.abort.remote()) != ray.get(say.remote())
    ray.kill(aborting)
    console = ""
    deadline = time.monotonic() + 120
    while f"worker line {marker}" not in console and time.monotonic() < deadline:
        console += "".join(capfd.readouterr())
        time.sleep(0.1)
    assert f"worker line {marker}" in console
    assert not any(noise in console for noise in ray_internals.WORKER_NOISE), console
    assert "sigterm_handler" not in console and "SystemExit" not in console, console
    assert f"ValueError: kept {marker}" in console and "in user_callback" in console, console
    kept = (f"worker line {marker}", f"ValueError: kept {marker}", f"_remove at 0x7f97> {marker}")
    assert console.count(f"_remove at 0x7f97> {marker}") == 1, console
    for line in kept:
        console = console.replace(line, "")
    assert marker not in console, console


def test_rays_worker_stops_on_sigterm_by_a_handler_that_raises_systemexit():
    """What :data:`RAYS_SIGTERM_HANDLER` recognises: a worker's handler of that name that
    raises SystemExit, the block Python prints when it lands in a weakref callback."""
    import inspect

    from ray._private.worker import Worker

    loop = inspect.getsource(Worker.main_loop)
    assert "def sigterm_handler(" in loop and "raise_sys_exit_with_custom_error_message" in loop


# 6. A local cluster's resources, before it starts.


def cgroup_cpus() -> set[float]:
    """The whole CPUs this process may use, as Ray counts them in a container: a cgroup's
    CPU quota (v2's cpu.max, v1's CFS quota) and the CPUs it may run on."""
    counts = {float(len(os.sched_getaffinity(0)))}
    for quota_file, period_file in (
        ("/sys/fs/cgroup/cpu.max", None),
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    ):
        try:
            if period_file is None:
                quota, period = open(quota_file).read().split()
            else:
                quota, period = open(quota_file).read().strip(), open(period_file).read().strip()
        except OSError:
            continue
        if quota.isnumeric() and int(quota) > 0:
            counts.add(float(max(1, int(int(quota) / int(period)))))
    return counts


def test_a_local_cluster_would_have_this_machines_cpus_before_it_starts():
    if "RAY_OVERRIDE_RESOURCES" in os.environ or "RAY_USE_MULTIPROCESSING_CPU_COUNT" in os.environ:
        pytest.skip("the environment overrides how Ray counts CPUs")
    total = ray_internals.local_cluster_resources()
    assert total is not None, "Ray moved ResourceAndLabelSpec: the CPU check waits for ray.init"
    assert total["CPU"] in {float(os.cpu_count()), *cgroup_cpus()}, total
    assert total["memory"] > 0 and total["object_store_memory"] > 0, total
    assert total.get("GPU", 0) >= 0


# 7. A user's module, uploaded for an actor's runtime_env.


def test_a_local_module_is_uploaded_to_the_cluster_as_a_gcs_uri(ray_cluster, tmp_path):
    """Where the upload works, a worker imports what it names
    (tests/cluster/test_session.py)."""
    package = tmp_path / "trainflow_test_uploaded"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 7\n")
    env = ray_internals.upload_py_modules([str(package)])
    assert list(env) == ["py_modules"] and len(env["py_modules"]) == 1, env
    assert env["py_modules"][0].startswith("gcs://"), env


# 8. Loggers of Ray's private modules.


@pytest.mark.parametrize(
    "name",
    [
        ray_internals.TOKEN_AUTH_LOGGER,
        ray_internals.DATA_PROGRESS_LOGGER,
        ray_internals.STREAMING_EXECUTOR_LOGGER,
        ray_internals.TRAIN_ERRORS_LOGGER,
        ray_internals.TRAIN_CONTROLLER_LOGGER,
        ray_internals.CHECKPOINT_SCORE_LOGGER,
        *ray_internals.ERRORS_ONLY_LOGGERS,
    ],
)
def test_each_quieted_logger_is_a_module_of_rays_logging_under_its_own_name(name):
    module = importlib.import_module(name)
    loggers = [value.name for value in vars(module).values() if isinstance(value, logging.Logger)]
    assert name in loggers, f"{name} logs through {loggers or 'no module-level logger'}"


def test_trains_worker_context_logs_under_its_files_path():
    from ray.train.v2._internal.execution import context

    assert context.logger.name == ray_internals.train_report_logger()


# 9. What Ray Train's controller runs of a trainflow training.


def test_the_trainer_and_scaling_policy_override_methods_ray_still_has():
    """Each method trainflow overrides is one Ray's classes still have (a renamed one
    would leave the override unused), and the trainer drops the dataset manager's
    callback when it has no Datasets."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.execution.controller import TrainController
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy, create_scaling_policy

    from trainflow.ray_internals import training

    trainer_class = ray_internals.trainer_class(fixed_cluster=lambda: True)
    assert trainer_class is not TorchTrainer and issubclass(trainer_class, TorchTrainer)
    policy_class = training.FixedClusterPolicy
    assert issubclass(policy_class, FixedScalingPolicy)
    for cls, base in ((trainer_class, TorchTrainer), (policy_class, FixedScalingPolicy)):
        overridden = [name for name, value in vars(cls).items() if inspect.isfunction(value)]
        assert overridden and all(hasattr(base, name) for name in overridden), (base, overridden)

    # The policy Ray hands the controller for a fixed number of workers, which trainflow swaps.
    scaling = ScalingConfig(num_workers=1)
    assert type(create_scaling_policy(scaling)) is FixedScalingPolicy
    assert policy_class(scaling).scaling_config is scaling
    assert "scaling_policy" in inspect.signature(TrainController.__init__).parameters

    def callbacks(cls) -> list[type]:
        return [type(c) for c in cls(lambda: None, scaling_config=scaling)._create_default_callbacks()]

    assert DatasetsCallback in callbacks(TorchTrainer)
    assert DatasetsCallback not in callbacks(trainer_class)


# 10. Ray's TorchConfig, from a module without torch.
#
# That the controller unpickles it without importing torch:
# tests/test_layers.py::test_what_ray_trains_controller_unpickles_of_a_run_imports_no_torch.


def test_the_controllers_torch_config_is_rays_with_the_same_fields_and_worker_steps():
    from ray._private import ray_constants
    from ray.train import constants
    from ray.train._internal.utils import get_address_and_port
    from ray.train.backend import Backend
    from ray.train.torch import TorchConfig as RaysTorchConfig
    from ray.train.torch import config as rays
    from ray.train.v2._internal.util import TrainingFramework

    from trainflow.ray_internals import training

    config = ray_internals.torch_config()
    assert type(config) is training.TorchConfig  # not Ray's own, the fallback
    fields = {f.name: f.default for f in dataclasses.fields(config)}
    assert fields == {f.name: f.default for f in dataclasses.fields(RaysTorchConfig)}
    assert config.to_dict() == dataclasses.asdict(RaysTorchConfig())
    assert config.framework is TrainingFramework.TORCH
    assert RaysTorchConfig().framework is TrainingFramework.TORCH
    assert config.train_func_context is rays.TorchConfigContextManager
    assert RaysTorchConfig().train_func_context is rays.TorchConfigContextManager
    assert issubclass(config.backend_cls, Backend)
    assert config.backend_cls.share_cuda_visible_devices == rays._TorchBackend.share_cuda_visible_devices
    # What the backend's steps call, on the workers and in the controller.
    assert callable(get_address_and_port) and callable(rays._set_torch_distributed_env_vars)
    setup = inspect.signature(rays._setup_torch_process_group).parameters
    assert {"backend", "world_rank", "world_size", "init_method", "timeout_s"} <= set(setup)
    assert "destroy_process_group" in inspect.signature(rays._shutdown_torch).parameters
    assert isinstance(
        ray_constants.env_integer(
            constants.TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            constants.DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        ),
        int,
    )


def test_the_controllers_torch_backend_picks_the_process_group_backend_as_ray_does():
    # A GPU worker group cannot run here; the choice it makes can be checked on any machine.
    from trainflow.ray_internals import process_group_backend

    assert process_group_backend(None, {"CPU": 1}) == "gloo"
    assert process_group_backend(None, {"CPU": 1, "GPU": 1}) == "nccl"
    assert process_group_backend(None, {"GPU": 0.5}) == "nccl"
    assert process_group_backend("gloo", {"GPU": 1}) == "gloo"


# 11. A worker setup hook through Ray Client.


def test_a_setup_hook_through_ray_client_is_the_variable_ray_init_sets_on_the_cluster():
    from ray._private.runtime_env.setup_hook import upload_worker_process_setup_hook_if_needed

    from trainflow.ray_internals.client import with_setup_hook

    env = {"env_vars": {"A": "1"}, "worker_process_setup_hook": "trainflow.cluster.quiet.quiet_worker"}
    # What ray.init does with it in a driver on the cluster (a string hook needs no worker).
    on_cluster = upload_worker_process_setup_hook_if_needed(json.loads(json.dumps(env)), worker=None)
    assert with_setup_hook(env) == on_cluster
    assert on_cluster["env_vars"]["A"] == "1"
    assert with_setup_hook({"env_vars": {}}) == {"env_vars": {}}  # no hook: unchanged


# 12. Whether a cluster's GCS wants a token.


def test_the_gcs_of_a_cluster_with_token_auth_refuses_a_call_without_one(ray_cluster):
    import socket

    import ray

    from trainflow.ray_internals.client import wants_token

    assert wants_token(ray.get_runtime_context().gcs_address) is True
    with socket.socket() as s:  # something that is not a GCS: not known
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert wants_token(f"127.0.0.1:{s.getsockname()[1]}", timeout_s=1) is None
        assert wants_token(f"ray://127.0.0.1:{s.getsockname()[1]}", timeout_s=1) is None


# 13. Ray core's switches.


def _raylet_binary() -> str:
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "core", "src", "ray", "raylet", "raylet")


@pytest.mark.parametrize("name", switches.RAYLET_FLAGS)
def test_each_raylet_switch_is_a_system_config_flag_the_raylet_reads_from_the_environment(name):
    """The raylet reads each of its system-config flags from ``RAY_<flag>``; the name is in
    its binary as it reads it."""
    import mmap

    with open(_raylet_binary(), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as raylet:
        assert raylet.find(name.encode() + b"\0") >= 0, f"Ray's raylet no longer reads {name}"


def test_the_worker_niceness_switch_is_the_one_rays_job_manager_sets():
    from ray._private import ray_constants

    assert ray_constants.RAY_WORKER_NICENESS == switches.WORKER_NICENESS


def test_a_node_reads_its_drain_time_on_sigterm_from_the_switch():
    from ray._private import node, ray_constants

    assert "ray_constants.RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S" in inspect.getsource(node.Node)
    assert f'"{switches.SHUTDOWN_DRAIN_TIMEOUT}"' in inspect.getsource(ray_constants)


def test_a_local_cluster_has_the_resources_the_override_switch_names(monkeypatch):
    monkeypatch.setenv(switches.OVERRIDE_RESOURCES, '{"CPU": 3, "GPU": 0}')
    total = ray_internals.local_cluster_resources()
    assert total is not None and total["CPU"] == 3 and total.get("GPU", 0) == 0, total


# 14. Ray Train's and Tune's switches.


def test_ray_train_reads_each_switch_and_hands_the_workers_those_it_must():
    from ray.train.v2._internal import constants

    names = {value for name, value in vars(constants).items() if name.endswith("_ENV_VAR")}
    train = {
        switches.TRAIN_HEALTH_CHECK_INTERVAL,
        switches.TRAIN_PREEMPTION_WATCHER,
        switches.TRAIN_PREEMPTION_POLL_INTERVAL,
        switches.TRAIN_WORKER_GROUP_START_TIMEOUT,
    }
    assert train <= names, train - names
    assert train <= constants.ENV_VARS_TO_PROPAGATE, train - constants.ENV_VARS_TO_PROPAGATE


def test_tunes_new_output_engine_is_off_under_its_switch(monkeypatch):
    from ray.tune.experimental.output import AirVerbosity, get_air_verbosity

    monkeypatch.setenv(switches.TUNE_NEW_OUTPUT, "1")
    assert get_air_verbosity(0) is AirVerbosity.SILENT
    monkeypatch.setenv(switches.TUNE_NEW_OUTPUT, "0")
    assert get_air_verbosity(0) is None  # Tune's legacy reporter, silent at verbose=0


# 22. Ray Serve's direct ingress.


def test_serve_reads_the_direct_ingress_switches_as_direct_ingress_env_sets_them():
    """Serve's constants, read at import in a process started with the environment (as a
    local cluster's processes are): direct ingress on, the HTTP range the one port, the drain."""
    import subprocess
    import sys

    code = (
        "from ray.serve._private import constants as c; print(c.RAY_SERVE_ENABLE_DIRECT_INGRESS, "
        "c.RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT, c.RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT, "
        "c.RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S)"
    )
    env = {**os.environ, **switches.direct_ingress_env(18123, 0.5)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "18123", "18124", "0.5"], out.stdout + out.stderr


# 15. Ray Data's first Parquet datasource.


def test_the_first_parquet_datasource_reads_without_listing_and_the_flag_is_put_back(ray_cluster, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.data

    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "part.parquet")
    context = ray.data.DataContext.get_current()
    before = getattr(context, switches.DATASOURCE_V2)
    with switches.parquet_datasource_v1():
        assert getattr(context, switches.DATASOURCE_V2) is False
        dataset = ray.data.read_parquet(str(tmp_path))
    assert getattr(context, switches.DATASOURCE_V2) == before
    stats = dataset.materialize().stats()
    assert "ReadParquet" in stats and "ListFiles" not in stats, stats


# 16. A worker's own exception.


def test_a_workers_exception_is_unwrapped_from_what_ray_train_hands_the_driver():
    error = ValueError("on a worker")
    try:
        raise error
    except ValueError as e:
        wrapped = probes.train_function_failed(e)
    assert wrapped is not error and errors.worker_error(wrapped) is error
    assert errors.worker_error(error) is error


# 17. Ray Train's errors, as its controller and workers make them.


def test_ray_trains_errors_are_made_as_ray_makes_them():
    timeout = probes.worker_group_startup_timeout(num_workers=2)
    assert type(timeout).__name__ == "WorkerGroupStartupTimeoutError", type(timeout)
    assert "2 workers" in str(timeout), timeout


# 18. Every actor a cluster has recorded.


def test_the_actors_of_a_cluster_include_the_ended_ones(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class TrainflowProbeActor:
        def ready(self) -> bool:
            return True

    def probes_recorded() -> int:  # a class's qualified name: <locals> for this one
        return sum(name.rpartition(".")[2] == "TrainflowProbeActor" for name in probes.actor_class_names())

    before = probes_recorded()
    actor = TrainflowProbeActor.remote()
    ray.get(actor.ready.remote())
    ray.kill(actor)
    assert probes_recorded() == before + 1


# 19. The workers' lines as they reach the driver.


def test_a_handler_receives_the_workers_lines_within_its_block(ray_cluster):
    import threading

    import ray

    marker, arrived, got = uuid.uuid4().hex, [], threading.Event()

    def receive(data: dict) -> None:
        arrived.extend(data["lines"])
        if any(marker in line for line in data["lines"]):
            got.set()

    @ray.remote(num_cpus=0)
    def say(text: str) -> None:
        print(text, flush=True)

    with probes.worker_output_handler("trainflow-test", receive):
        ray.get(say.remote(marker))
        assert got.wait(120), arrived
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    assert "trainflow-test" not in [name for name, _ in dispatcher.handlers]


# 20. Ray's worker setup script.


def test_rays_worker_setup_script_is_the_one_a_nodes_setup_worker_path_replaces():
    from ray._private import ray_constants
    from ray._private.parameter import RayParams

    script = probes.setup_worker_script()
    default_worker = importlib.util.find_spec("ray._private.workers.default_worker").origin
    assert os.path.isfile(script) and os.path.basename(script) == ray_constants.SETUP_WORKER_FILENAME
    assert os.path.dirname(script) == os.path.dirname(default_worker)
    assert "setup_worker_path" in inspect.signature(RayParams).parameters


# 21. A local node's start-up wait.


def test_a_local_node_that_misses_its_start_up_wait_raises_what_trainflow_reads():
    """The message trainflow turns into its one line (cluster.session) is still the one
    Ray's node raises when its raylet does not register in time."""
    import inspect

    from ray._private import node

    source = " ".join(inspect.getsource(node.Node).split()).replace('" "', "")  # its string's parts joined
    assert errors.NODE_START_TIMEOUT in source


# 23. A local cluster's dashboard agent port.


def test_a_local_cluster_beside_another_ray_node_gives_its_agent_a_port_of_the_systems_choosing(tmp_path):
    """Ray's RayParams still defaults the agent's port to 52365, which ``ray.init`` cannot
    change; after the use, a local cluster started while another process holds that port
    binds its agent's HTTP server elsewhere at once, and a caller's own port stays."""
    import socket

    from ray._private.parameter import RayParams

    assert inspect.signature(RayParams.__init__).parameters["dashboard_agent_listen_port"].default == 52365
    script = (
        "import json, logging, ray\n"
        "from ray._private.parameter import RayParams\n"
        "from trainflow.ray_internals import session_logs, switches\n"
        "switches.agent_port_of_the_systems_choosing()\n"
        "switches.agent_port_of_the_systems_choosing()  # once is enough: not wrapped twice\n"
        "own = RayParams(dashboard_agent_listen_port=4321).dashboard_agent_listen_port\n"
        "ray.init(address='local', num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)\n"
        "logs = session_logs()\n"
        "ray.shutdown()\n"
        "print(json.dumps({'own': own, 'logs': logs, 'default': RayParams().dashboard_agent_listen_port}))\n"
    )
    with socket.socket() as holder:  # another node's agent, as far as this cluster can tell
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("", 52365))
        except OSError:
            pass  # held already, by a Ray node running on this machine
        holder.listen()
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["own"] == 4321 and seen["default"] == 0
    agent_log = (Path(seen["logs"]) / "dashboard_agent.log").read_text()
    assert "Dashboard agent http address" in agent_log and "Failed to bind" not in agent_log, agent_log[
        -2000:
    ]


# 24. A local node's start-up waits.


def test_the_wait_for_a_nodes_registration_is_the_flag_a_local_start_sets(tmp_path):
    """A process asking for a node that has not registered waits as long as the flag says
    (Ray's node polls for its raylet that way as it starts), read when the cluster starts,
    an environment's own value first; the node still reads the GCS's wait by its name;
    the block sets both to the bound, at least Ray's 30 s, and takes them back after."""
    from ray._private import node

    assert switches.GCS_PORT_WAIT in inspect.getsource(node.Node)
    script = (
        "import json, logging, time, ray\n"
        "from ray._private import services\n"
        "from trainflow.ray_internals import switches\n"
        "with switches.node_start_waits(3) as waited:\n"
        "    ray.init(address='local', num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)\n"
        "gcs = ray.get_runtime_context().gcs_address\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    services.get_node(gcs, 'ab' * 28)\n"
        "except RuntimeError:\n"
        "    pass\n"
        "took = time.monotonic() - start\n"
        "seen = {'waited': waited, 'took': took, 'left': switches.RAYLET_START_WAIT in os.environ}\n"
        "ray.shutdown()\n"
        "print(json.dumps(seen))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", *switches.NODE_START_WAITS)}
    env[switches.RAYLET_START_WAIT] = "4"  # the environment's own value wins over the block's
    out = subprocess.run(
        [sys.executable, "-c", "import os\n" + script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["waited"] == 30 and seen["left"]  # at least Ray's own 30 s; the environment's value stays
    assert 3.5 <= seen["took"] < 20, seen
    with switches.node_start_waits(75.2) as waited:
        assert waited == 76 and os.environ[switches.GCS_PORT_WAIT] == "76"
    assert switches.GCS_PORT_WAIT not in os.environ


# 25. Serve's first deadline for a replica's queue length.


def test_serve_reads_its_first_queue_length_deadline_by_the_switchs_name():
    from ray.serve._private import constants

    assert f'"{switches.SERVE_QUEUE_PROBE_DEADLINE}"' in inspect.getsource(constants)
    assert constants.RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S == 0.1
