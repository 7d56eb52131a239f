"""A Ray cluster that trainflow did not start: `ray start` processes, as on real machines.

The head starts first; `trainflow run` connects through RAY_ADDRESS and its preflight
waits for the training workers' resources, which only appear when a second node joins
(what an autoscaler does). The workers then train on both nodes.

The run reports to the session's Prefect server (``prefect_harness``) rather than starting
a temporary one: how a run starts Prefect is tests/e2e/test_front_door.py's.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import session_services
from trainflow.testing import small_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path.name}:\n{path.read_text(errors='replace')[-3000:]}")


@contextmanager
def ray_node(args: list[str], env: dict[str, str], log: Path, ray: list[str] | None = None, cwd=None):
    """`ray start --block` in a process group of its own, stopped with only its processes
    (never `ray stop`, which would stop every Ray on the machine). ``ray``: the command
    that is `ray` (another Python environment's: ``[python, "-m", "ray.scripts.scripts"]``)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *(ray or [RAY]),
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                *args,
            ],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_the_flow_waits_for_a_second_node_then_trains_on_both(prefect_harness, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    # A cluster with token authentication, as `ray start` makes by default; the token
    # reaches every node and the driver through the environment.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0")
    trainer = '--resources={"trainer": 1}'  # one training worker fits on each node
    config = small_config(
        train={"epochs": 1},  # where the workers run is the point, not how long they train
        data={"limit": 600},
        scaling={
            "num_workers": 2,
            "resources_per_worker": {"CPU": 0.5, "trainer": 1},
            "wait_for_resources_s": 300,
        },
    )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_log = tmp_path / "run.log"

    head_args = ["--head", f"--port={port}", "--num-cpus=2", trainer, "--include-dashboard=false"]
    with ray_node(head_args, env, tmp_path / "head.log") as head:
        wait_for(tmp_path / "head.log", "will now block forever", head, timeout=120)
        with run_log.open("w") as out:
            run = subprocess.Popen(
                [sys.executable, "-m", "trainflow.cli", "run", str(tmp_path / "config.yaml")],
                cwd=REPO,
                env={
                    **env,
                    **session_services(ray_address=False),
                    "RAY_ADDRESS": f"127.0.0.1:{port}",
                    "TRAINFLOW_HOME": str(tmp_path / "home"),
                },
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            # Only the head is up: one "trainer" of the two the workers need.
            wait_for(run_log, "waiting up to 300 s for the cluster to scale up", run, timeout=300)
            node_args = [f"--address=127.0.0.1:{port}", "--num-cpus=1", trainer]
            with ray_node(node_args, env, tmp_path / "node.log"):
                run.wait(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
    output = run_log.read_text(errors="replace")
    assert run.returncode == 0, output[-5000:]
    assert f"connecting to the Ray cluster at 127.0.0.1:{port}" in output
    assert "Traceback" not in output
    assert "2 workers trained on 2 Ray node(s)" in output
    assert "digits-test version 1 -> champion" in output
