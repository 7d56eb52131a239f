"""`trainflow` as the tests run it: as a subprocess, as a user types it (:func:`trainflow`),
or in this process through the same command-line app (:func:`trainflow_in_process`)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINFLOW = [sys.executable, "-m", "trainflow.cli"]


def trainflow(
    *args, home: Path, timeout=600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`trainflow ARGS` as a subprocess, as a user types it: its own imports, Prefect's
    temporary server and Ray cluster, each a few seconds of start-up. ``env``: more
    environment variables (:func:`session_services` to use the session's instead)."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")
    }
    env = {**inherited, **(env or {}), "TRAINFLOW_HOME": str(home)}
    return subprocess.run(
        [*TRAINFLOW, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def session_services(ray_address: bool = True, prefect_api: bool = True) -> dict[str, str]:
    """The environment by which a subprocess finds the session's Ray cluster and Prefect
    server (the ``ray_cluster`` and ``prefect_harness`` fixtures, which the test must ask
    for) instead of starting its own: for subprocess tests about something else than how
    a run starts them (tests/e2e/test_front_door.py's first run starts both itself)."""
    env = {}
    if ray_address:
        import ray

        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        if "RAY_AUTH_MODE" in os.environ:  # the session cluster's token auth, for its clients
            env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
    if prefect_api:
        from prefect.settings import PREFECT_API_URL

        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return env


def trainflow_in_process(*args):
    """`trainflow ARGS` through the same command-line app, in this process: the session's
    Ray cluster and Prefect server (the ``ray_cluster`` and ``prefect_harness`` fixtures)
    serve it, and TRAINFLOW_HOME comes from the environment (``trainflow_home``). For
    tests about what a run does rather than how the command starts."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    result.returncode = result.exit_code
    return result
