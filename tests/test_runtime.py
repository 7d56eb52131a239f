"""Preflight: what the config asks of the cluster is checked before fit(), not waited on."""

import logging
import shutil
import threading
import time

import pytest

from trainflow.cluster.checks import PreflightError
from trainflow.cluster.preflight import fit_scaling, preflight
from trainflow.config import PipelineConfig, ScalingSection


def config(**scaling) -> PipelineConfig:
    return PipelineConfig(scaling=ScalingSection(**scaling))


# What "at once" guards against is a wait without end (Ray's own behaviour): a check that
# has not answered in this long hangs. Timing it finer is the benchmarks' job.
HANG_S = 120


def answers(call):
    """What ``call()`` returns or raises, called in a thread; fails the test if it has not
    answered within HANG_S, instead of hanging the suite."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"no answer after {HANG_S} s: it waits instead of failing"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def test_more_gpus_than_the_cluster_has_fail_at_once(ray_cluster):
    # One worker more than the cluster has GPUs: 0 on a CPU machine, any number elsewhere.
    gpus = cluster_gpus()
    n = gpus + 1
    with pytest.raises(
        PreflightError,
        match=rf"{n} workers x 1 GPU = {n} GPUs, the Ray cluster has {gpus}: set scaling.use_gpu=false",
    ):
        answers(lambda: preflight(config(num_workers=n, use_gpu=True)))


def test_gpu_workers_fit_a_cluster_that_declares_gpus(ray_cluster):
    import ray

    total = {**ray.cluster_resources(), "GPU": 2.0}
    gpu = ScalingSection(num_workers=2, use_gpu=True)
    assert fit_scaling(gpu, total) is gpu
    with pytest.raises(PreflightError, match=r"3 workers x 1 GPU = 3 GPUs, the Ray cluster has 2"):
        fit_scaling(ScalingSection(num_workers=3, use_gpu=True), total)


def test_more_cpus_than_the_cluster_has_fail_with_what_fits(ray_cluster):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(PreflightError, match=r"set scaling.resources_per_worker.CPU to at most"):
        answers(lambda: preflight(config(num_workers=int(cpus) + 1, resources_per_worker={"CPU": 1})))
    # Workers that take every CPU leave none for Ray Data: the run would hang.
    with pytest.raises(PreflightError, match=r"plus 1 CPU for Ray Data"):
        preflight(config(num_workers=int(cpus), resources_per_worker={"CPU": 1}))


def test_shrink_gives_each_worker_what_fits_and_says_so(ray_cluster, caplog):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    asked = config(num_workers=int(cpus), resources_per_worker={"CPU": 1}, on_cpu_shortage="shrink")
    with caplog.at_level(logging.WARNING, logger="trainflow"):
        run = preflight(asked)
    each = run.scaling.resources_per_worker["CPU"]
    assert 0 < each <= (cpus - 1) / int(cpus)
    assert "leaves Ray Data no CPU" in caplog.text and f"with {each:g} CPU each" in caplog.text
    assert run.train == asked.train and asked.scaling.resources_per_worker == {"CPU": 1}


def test_an_autoscaling_wait_asks_for_the_resources_then_gives_up(ray_cluster):
    gpus = cluster_gpus()
    start = time.monotonic()
    with pytest.raises(PreflightError, match=rf"the Ray cluster has {gpus}: .*\(waited 2 s\)"):
        answers(lambda: preflight(config(num_workers=gpus + 1, use_gpu=True, wait_for_resources_s=2)))
    assert time.monotonic() - start >= 2  # it did wait for the scale-up it asked for


def test_unknown_custom_resources_fail(ray_cluster):
    with pytest.raises(
        PreflightError, match=r"resources_per_worker.TPU: 2 workers x 1 = 2, the Ray cluster has 0"
    ):
        preflight(config(num_workers=2, resources_per_worker={"CPU": 0.5, "TPU": 1}))


def test_the_default_scaling_fits_a_two_core_machine(ray_cluster):
    assert preflight(PipelineConfig()) == PipelineConfig()


def test_a_single_node_shares_its_own_disk_and_is_not_asked(ray_cluster, tmp_path):
    """The shared storage check (a marker task per node) costs nothing on one node: a
    folder no node could write into passes, since nothing is written."""
    from trainflow.cluster.checks import alive_nodes, check_shared

    assert len(alive_nodes()) == 1
    check_shared({"storage": str(tmp_path / "missing" / "runs")})
    assert not (tmp_path / "missing").exists()


def test_the_versions_check_reads_a_workers_python_ray_and_torch(ray_cluster):
    from importlib import metadata

    import ray

    from trainflow.cluster.checks import check_versions

    seen = check_versions(ray.get_runtime_context().gcs_address)
    assert seen["torch"] == metadata.version("torch") and seen["Ray"] == ray.__version__


def test_the_versions_check_refuses_a_model_module_the_clusters_workers_cannot_import(ray_cluster):
    import ray

    from trainflow.cluster.checks import check_versions

    address = ray.get_runtime_context().gcs_address
    assert check_versions(address, module="json")["module_error"] is None
    with pytest.raises(PreflightError) as refused:
        check_versions(address, module="trainflow_test_absent_net")
    assert str(refused.value) == (
        f"model.kind: a worker of the Ray cluster at {address} cannot import trainflow_test_absent_net, "
        "which the job ships: ModuleNotFoundError: No module named 'trainflow_test_absent_net'; install "
        "what it imports on the cluster's nodes"
    )


def test_a_workers_traceback_of_trainflows_own_errors_stays_in_its_log(caplog):
    """Ray Train logs each failed training function's traceback in the worker; the driver
    reports a ConfigError or DataError in one line, so the worker's hook drops those."""
    from ray.train.v2._internal.util import construct_user_exception_with_traceback

    from trainflow.cluster.quiet import _NoExpectedTrainErrors
    from trainflow.config import ConfigError

    logger = logging.getLogger("ray.train.v2._internal.util")
    logger.addFilter(only := _NoExpectedTrainErrors())
    try:
        for error in (ConfigError("model.kind x:y: importing x failed"), RuntimeError("a bug")):
            try:
                raise error
            except Exception as e:  # noqa: BLE001
                construct_user_exception_with_traceback(e)
    finally:
        logger.removeFilter(only)
    logged = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(logged) == 1 and logged[0].rstrip().endswith("RuntimeError: a bug"), logged


def test_a_shipped_trainflow_comes_before_one_the_cluster_has(ray_cluster, tmp_path):
    """A cluster's own trainflow (here: an older copy first on the workers' PYTHONPATH, and
    the session's editable install) loses to the copy shipped as runtime_env py_modules:
    Ray puts py_modules ahead of the path the worker had."""
    import ray

    from trainflow import __version__
    from trainflow.cluster.shipping import trainflow_package, uploaded_modules

    # An older release of trainflow, as a cluster's image might hold (a copy, since every
    # worker of this job runs trainflow's setup hook from whichever copy it imports).
    stale = tmp_path / "site" / "trainflow"
    shutil.copytree(trainflow_package(), stale, ignore=shutil.ignore_patterns("__pycache__"))
    init = stale / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "0.0.1"'))
    older = {"env_vars": {"PYTHONPATH": str(stale.parent)}}

    @ray.remote(num_cpus=0)
    def imported() -> tuple[str, str]:
        import trainflow

        return trainflow.__file__, trainflow.__version__

    where, version = ray.get(
        imported.options(runtime_env={**uploaded_modules([trainflow_package()]), **older}).remote()
    )
    assert "runtime_resources" in where and version != "0.0.1", where
    # Without the shipped copy, the same worker environment imports the stale one: the
    # check above is about the order, not about a path that was never there.
    assert ray.get(imported.options(runtime_env=older).remote()) == (
        str(stale / "__init__.py"),
        "0.0.1",
    )


def test_workers_know_their_own_cluster_among_several_on_the_machine(ray_cluster):
    """Ray's helpers in a worker (Train's placement-group cleaner) resolve the cluster by
    RAY_ADDRESS, else by whichever cluster was started last on the machine."""
    import os

    import ray

    @ray.remote(num_cpus=0)
    def address() -> str | None:
        return os.environ.get("RAY_ADDRESS")

    assert ray.get(address.remote()) == ray.get_runtime_context().gcs_address


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


def test_an_address_where_no_cluster_answers_fails_at_once():
    """ray_session checks an address before ray.init, which would retry it for minutes."""
    import socket

    from trainflow.cluster.checks import check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        PreflightError, match=rf"no Ray cluster answers at 127\.0\.0\.1:{port} .*ray start --head"
    ):
        answers(lambda: check_reachable(f"127.0.0.1:{port}"))
    with pytest.raises(PreflightError, match=r"'head-node' .* is not host:port"):
        check_reachable("head-node")
    check_reachable("ray://head:10001")  # Ray Client addresses are left to Ray


def test_sweep_concurrency_fits_trials_beside_a_cpu_for_ray_data():
    from trainflow.cluster.preflight import sweep_concurrency
    from trainflow.config import SweepConfig

    one_worker = SweepConfig(space={"train.lr": {"choice": [0.1]}})  # 1 worker x 0.5 CPU
    assert sweep_concurrency(one_worker, {"CPU": 2.0}) == 2
    assert sweep_concurrency(one_worker, {"CPU": 8.0}) == 14
    assert sweep_concurrency(one_worker.model_copy(update={"max_concurrent": 3}), {"CPU": 8.0}) == 3
    gpus = one_worker.model_copy(
        update={"scaling": ScalingSection(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 1})}
    )
    assert sweep_concurrency(gpus, {"CPU": 16.0, "GPU": 4.0}) == 2
    too_big = one_worker.model_copy(update={"scaling": ScalingSection(num_workers=4)})
    with pytest.raises(
        PreflightError, match=r"one sweep trial does not fit: .*set sweep\.scaling\.resources_per_worker"
    ):
        sweep_concurrency(too_big, {"CPU": 2.0})


def test_warm_workers_start_one_per_cpu_with_the_preprocessing_code_imported(ray_cluster):
    import ray

    from trainflow.cluster.session import warm_workers

    refs = warm_workers(["trainflow.pipelines.data.prepare"], most=8)
    assert len(refs) == min(int(ray.cluster_resources()["CPU"]), 8)
    ray.get(refs, timeout=60)  # a worker that cannot import trainflow.pipelines.data.prepare fails here
    assert len(warm_workers(["trainflow.pipelines.data.prepare"], most=1)) == 1


@pytest.mark.slow
def test_sigterm_ends_a_blocking_ray_call_inside_a_flow_run(ray_cluster, prefect_harness):
    """Prefect's SIGTERM handler raises its own exception, which ``ray.get`` swallows: a
    SIGTERM to a `trainflow run` alone (Kubernetes, a worker's cancellation) went unheard
    until training ended. Around ``fit()``, it ends the call as SystemExit(143)."""
    import os
    import signal

    import ray
    from prefect import flow

    from trainflow.signals import stop_on_signals

    @ray.remote(num_cpus=0)
    def slow() -> None:
        time.sleep(60)

    ref = slow.remote()

    @flow
    def waits() -> None:
        with stop_on_signals():
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            ray.get(ref)

    started = time.monotonic()
    try:
        with pytest.raises(SystemExit) as stopped:
            waits()
    finally:
        ray.cancel(ref, force=True)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_from_a_ctrl_c_on_the_workers_output_stays_off_the_console_until_the_next_call(
    ray_cluster, capfd, tmp_path
):
    """Ctrl-C during ``fit()``: what the run's workers print while Ray tears them down
    (once, a worker's traceback under the command's one line) stays off the console. The
    lines still reach the driver (a handler of the test's own sees them); the next call
    shows them again."""
    import os
    import signal

    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from trainflow.signals import stop_on_signals

    arrived: list[str] = []
    got = threading.Condition()

    def receive(data) -> None:  # after Ray's own handler, which prints
        with got:
            arrived.extend(data["lines"])
            got.notify_all()

    def wait_for(text: str) -> None:
        with got:
            assert got.wait_for(lambda: any(text in line for line in arrived), timeout=120), arrived

    @ray.remote(num_cpus=0)
    def prints(first: str, then: str, when: str) -> None:
        print(first, flush=True)
        while not os.path.exists(when):
            time.sleep(0.02)
        print(then, flush=True)

    def interrupt(signum, frame) -> None:  # as Ray Train's handler, which fit() installs
        raise KeyboardInterrupt

    stopped = tmp_path / "stopped"
    dispatcher.add_handler("test-receive", receive)
    try:
        task = prints.remote("worker line before the stop", "worker line after the stop", str(stopped))
        with pytest.raises(KeyboardInterrupt), stop_on_signals():
            signal.signal(signal.SIGINT, interrupt)
            wait_for("worker line before the stop")
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the handler runs between bytecodes
                time.sleep(0.01)
        stopped.touch()
        ray.get(task)
        wait_for("worker line after the stop")
        shown = capfd.readouterr()
        assert "worker line before the stop" in shown.out + shown.err
        assert "worker line after the stop" not in shown.out + shown.err

        with stop_on_signals():
            ray.get(prints.remote("worker line of the next call", "", str(stopped)))
            wait_for("worker line of the next call")
        shown = capfd.readouterr()
        assert "worker line of the next call" in shown.out + shown.err
    finally:
        dispatcher.remove_handler("test-receive")


def test_a_ctrl_c_during_start_up_is_raised_at_its_end_not_where_it_lands():
    """A KeyboardInterrupt raised inside an import beside other threads' imports can leave
    importlib's module lock taken (a start-up then waited forever, seen by hand): inside
    ``interrupts_deferred`` a Ctrl-C is only remembered, and raised once the block is done."""
    import os
    import signal

    from trainflow import signals

    before, reached = signal.getsignal(signal.SIGINT), False
    with signals.sigint_stops_the_run(), pytest.raises(KeyboardInterrupt):
        with signals.interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while not signals._interrupted.is_set():  # the handler runs between bytecodes
                assert time.monotonic() < deadline, "the SIGINT never reached its handler"
                time.sleep(0.01)
            reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is before  # put back
    # A later command starts with nothing remembered.
    with signals.sigint_stops_the_run():
        signals.raise_if_interrupted()
