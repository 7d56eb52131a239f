"""A Ray worker of a run knows its own cluster, and keeps trainflow's own one-line errors
off the driver's console."""

import logging


def test_a_workers_traceback_of_trainflows_own_errors_stays_in_its_log(caplog):
    """Ray Train logs each failed training function's traceback in the worker; the driver
    reports a ConfigError or DataError in one line, a lost peer's collateral error as the
    group's restart, and a run whose controller was ended from above (a paused PBT trial)
    as what ended it, so the worker's hook drops those."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    from trainflow import ray_internals
    from trainflow.cluster.quiet import _NoExpectedTrainErrors
    from trainflow.config import ConfigError
    from trainflow.ray_internals.probes import train_function_failed

    logger = logging.getLogger(ray_internals.TRAIN_ERRORS_LOGGER)
    logger.addFilter(only := _NoExpectedTrainErrors())
    logger.addHandler(caplog.handler)  # Ray's loggers may not propagate to the root's
    try:
        lost_peer = RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
            "[127.0.0.1]:8942: Connection reset by peer. This is typically caused by a remote worker"
        )
        # What a worker's report raises when its run's controller, and so the run's
        # synchronization actor, was killed with the trial that owned it.
        controller_gone = ActorDiedError(
            ActorDiedErrorContext(
                class_name="SynchronizationActor", actor_id=bytes(16), pid=7540, node_ip_address="192.0.2.2",
                reason=ActorDiedErrorContext.OWNER_DIED,
                error_message="The actor is dead because its owner has died. Owner Id: a3 Owner Ip address: "
                "192.0.2.2 Owner worker exit type: INTENDED_SYSTEM_EXIT Worker exit detail: Owner's worker "
                "process has crashed.",
            )
        )  # fmt: skip
        # The same when Tune removed the trial's placement group first.
        group_gone = ActorDiedError(
            ActorDiedErrorContext(
                class_name="SynchronizationActor", actor_id=bytes(16), pid=7541, node_ip_address="192.0.2.2",
                reason=ActorDiedErrorContext.WORKER_DIED,
                error_message="The actor is dead because its worker process has died. Worker exit type: "
                "INTENDED_SYSTEM_EXIT Worker exit detail: Destroying worker since its placement group was "
                "removed. Placement group id: 5e07a3e2, bundle index: -1",
            )
        )  # fmt: skip
        errors = (
            ConfigError("model.kind x:y: importing x failed"),
            lost_peer,
            controller_gone,
            group_gone,
            RuntimeError("a bug"),
        )
        for error in errors:
            try:
                raise error
            except Exception as e:  # noqa: BLE001
                train_function_failed(e)
    finally:
        logger.removeFilter(only)
        logger.removeHandler(caplog.handler)
    logged = [r.getMessage() for r in {id(r): r for r in caplog.records if r.name == logger.name}.values()]
    assert len(logged) == 1 and logged[0].rstrip().endswith("RuntimeError: a bug"), logged


def test_a_worker_group_that_did_not_start_in_time_is_one_warning_line(caplog):
    """An elastic run that shrinks first tries the size it had: Ray Train's controller logs
    the timeout with a traceback and tries again; the hook keeps one line of it."""
    from trainflow import ray_internals
    from trainflow.cluster.quiet import _StartupTimeoutInOneLine
    from trainflow.ray_internals.probes import worker_group_startup_timeout

    logger = logging.getLogger(ray_internals.TRAIN_CONTROLLER_LOGGER)
    logger.addFilter(only := _StartupTimeoutInOneLine())
    logger.addHandler(caplog.handler)  # Ray's loggers may not propagate to the root's
    try:
        for error in (worker_group_startup_timeout(num_workers=2), RuntimeError("a bug")):
            try:
                raise error
            except Exception as e:  # noqa: BLE001
                logger.exception("Error in control loop iteration: %s", e)
    finally:
        logger.removeFilter(only)
        logger.removeHandler(caplog.handler)
    timeout, bug = {id(r): r for r in caplog.records if r.name == logger.name}.values()
    assert (timeout.levelname, timeout.exc_info) == ("WARNING", None)
    assert timeout.getMessage().startswith("The worker group startup timed out after ")
    assert timeout.getMessage().endswith("waiting for 2 workers; Ray Train tries again"), timeout.getMessage()
    assert (bug.levelname, bug.exc_info[0]) == ("ERROR", RuntimeError)


def test_workers_know_their_own_cluster_among_several_on_the_machine(ray_cluster):
    """Ray's helpers in a worker (Train's placement-group cleaner) resolve the cluster by
    RAY_ADDRESS, else by whichever cluster was started last on the machine."""
    import os

    import ray

    @ray.remote(num_cpus=0)
    def address() -> str | None:
        return os.environ.get("RAY_ADDRESS")

    assert ray.get(address.remote()) == ray.get_runtime_context().gcs_address


def test_no_usage_telemetry_of_mlflows_is_kept_or_sent_from_a_command(tmp_path):
    """MLflow records an installation id and sends usage events unless told not to;
    trainflow's commands tell it, as they tell Ray and Prefect. The command runs as a
    user's would: without the variables by which MLflow knows a test or CI (CI has one)."""
    import os
    import subprocess

    from tests.commands import REPO, TRAINFLOW

    testing = {"PYTEST_CURRENT_TEST", "CI", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "XDG_CONFIG_HOME"}
    env = {k: v for k, v in os.environ.items() if k not in testing}
    env.update(HOME=str(tmp_path), TRAINFLOW_HOME=str(tmp_path / "home"))
    out = subprocess.run([*TRAINFLOW, "models", "list"], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / ".config" / "mlflow").exists()
