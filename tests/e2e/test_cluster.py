"""A Ray cluster that trainflow did not start: `ray start` processes, as on real machines,
from a Python environment that has Ray and torch but not trainflow.

The head starts first; `trainflow run` connects through RAY_ADDRESS, ships trainflow (and
a user's model module that only the driver has) with the job, and its preflight waits
for the training workers' resources, which only appear when a second node joins (what an
autoscaler does). The workers then train on both nodes, importing the shipped copies. A
cluster whose torch differs from the driver's is then refused in one line before
training.

The environment is a new venv whose site-packages holds a ``.pth`` file naming this
venv's site-packages: Ray, torch and the rest without installing them again. Python
does not process ``.pth`` files inside a folder that a ``.pth`` file adds, so trainflow's
editable install (a ``.pth`` hook in that folder) is not active there: checked below.

The runs report to the session's Prefect server (``prefect_harness``) rather than starting
a temporary one: how a run starts Prefect is tests/e2e/test_front_door.py's.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.commands import session_services
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


# Ray gives a starting node 30 s to register with the GCS (a constant of
# ray/_private/node.py); beside the rest of the suite on a loaded machine it can take
# longer, and `ray start` exits with this line. Such a start is tried again.
STARTUP_TIMED_OUT = "The current node timed out during startup"
STARTS = 3


@contextmanager
def ray_node(args: list[str], env: dict[str, str], log: Path, ray: list[str] | None = None, cwd=None):
    """`ray start --block` in a process group of its own, stopped with only its processes
    (never `ray stop`, which would stop every Ray on the machine). ``ray``: the command
    that is `ray` (another Python environment's: ``[python, "-m", "ray.scripts.scripts"]``).
    Entered when the node has started, or its start failed for another reason than Ray's
    registration timeout (:data:`STARTUP_TIMED_OUT`), which is tried again."""
    start = ["start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    command = [*(ray or [RAY]), *start, *args]
    log.write_text("")
    for attempt in range(1, STARTS + 1):
        with log.open("a") as out:
            proc = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if attempt == STARTS or not _timed_out(proc, log):
            break
        _stop(proc)
    try:
        yield proc
    finally:
        _stop(proc)


def _timed_out(proc: subprocess.Popen, log: Path, timeout: float = 300) -> bool:
    """Whether the node's start ended in Ray's registration timeout; False once it has
    started, or ended otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            return STARTUP_TIMED_OUT in log.read_text(errors="replace")
        time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen) -> None:
    """The node's processes, its `ray start` first (SIGTERM), then its whole group."""
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


def bare_env(root: Path) -> tuple[Path, Path]:
    """A venv under ``root`` with this venv's packages but not trainflow: its python and
    its own site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "project-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, Path(site)


def test_a_cluster_without_trainflow_waits_for_its_second_node_then_trains_on_both_from_shipped_modules(
    prefect_harness, tmp_path
):
    python, site = bare_env(tmp_path / "bare")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "PYTHONPATH", "VIRTUAL_ENV", "TRAINFLOW_HOME")
    }
    outside = tmp_path / "elsewhere"  # not the repository, whose folder holds trainflow
    outside.mkdir()
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; import ray; print(u.find_spec('torch') is not None)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "True", probe.stderr[-2000:]
    probe = subprocess.run(
        [python, "-c", "import trainflow"], cwd=outside, env=env, capture_output=True, text=True
    )
    assert "No module named 'trainflow'" in probe.stderr, probe.stderr[-2000:]

    # A cluster with token authentication, as `ray start` makes by default; the token
    # reaches every node and the driver through the environment. The head's own temp
    # folder (short: Ray's socket paths live under it) holds what its workers unpacked.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0")
    temp = Path(tempfile.mkdtemp(prefix="tf-ray-", dir="/tmp"))
    port = free_port()
    trainer = '--resources={"trainer": 1}'  # one training worker fits on each node
    head_args = ["--head", f"--port={port}", "--num-cpus=2", trainer, "--include-dashboard=false",
                 f"--temp-dir={temp}"]  # fmt: skip
    driver_env = {
        # Each run's registry is its TRAINFLOW_HOME's, whatever the session's environment holds.
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
        },
        **session_services(ray_address=False),
        "RAY_ADDRESS": f"127.0.0.1:{port}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"],
    }

    # A user's model module that only the driver has (the example's, under its own name).
    code = tmp_path / "code"
    code.mkdir()
    (code / "bare_cluster_net.py").write_text((REPO / "examples" / "custom_model" / "resmlp.py").read_text())

    def start_run(name: str, log: Path, model: dict | None = None, **sections) -> subprocess.Popen:
        config = small_config(name=name, **sections)
        config["model"] = model or config["model"]
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        path = os.pathsep.join(filter(None, [str(code), driver_env.get("PYTHONPATH")]))
        with log.open("w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "trainflow.cli", "run", str(tmp_path / f"{name}.yaml")],
                cwd=REPO,
                env={**driver_env, "PYTHONPATH": path, "TRAINFLOW_HOME": str(tmp_path / f"home-{name}")},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    ray = [str(python), "-m", "ray.scripts.scripts"]
    run_log = tmp_path / "run.log"
    try:
        with ray_node(head_args, env, tmp_path / "head.log", ray=ray, cwd=outside) as head:
            wait_for(tmp_path / "head.log", "will now block forever", head, timeout=180)
            run = start_run(
                "bare-cluster",
                run_log,
                # The cache in a folder of its own (`cache:`), as a cluster puts it on a shared mount.
                cache=str(tmp_path / "shared-cache"),
                data={"limit": 400},
                train={"epochs": 1},  # where the workers run is the point, not how long they train
                # Train's workers need the user's module and trainflow together (Ray merges
                # runtime_envs key by key, so their py_modules must list the job's as well).
                model={"kind": "bare_cluster_net:build", "args": {"width": 12, "depth": 1, "dropout": 0.0}},
                scaling={
                    "num_workers": 2,
                    "resources_per_worker": {"CPU": 0.5, "trainer": 1},
                    "wait_for_resources_s": 300,
                },
            )
            try:
                # Only the head is up: one "trainer" of the two the workers need.
                wait_for(run_log, "waiting up to 300 s for the cluster to scale up", run, timeout=300)
                node_args = [f"--address=127.0.0.1:{port}", "--num-cpus=1", trainer]
                with ray_node(node_args, env, tmp_path / "node.log", ray=ray, cwd=outside):
                    # A worker that cannot import what it needs leaves Ray Train waiting, not failing.
                    run.wait(timeout=600)
            finally:
                if run.poll() is None:
                    run.kill()
            output = run_log.read_text(errors="replace")
            assert run.returncode == 0, output[-5000:]
            assert f"connecting to the Ray cluster at 127.0.0.1:{port}" in output
            assert "Traceback" not in output
            assert "2 workers trained on 2 Ray node(s)" in output
            assert "bare-cluster version 1 -> champion" in output
            # The check's worker (on the head, the only node then) imported trainflow from
            # the job's py_modules, unpacked by the cluster; the training workers had no
            # other copy to import, on either node.
            assert f"its workers import trainflow from {temp}/session_" in output, output[-5000:]
            assert "/runtime_resources/py_modules_files/" in output
            shipped = "session_*/runtime_resources/py_modules_files/*/trainflow/cluster/session.py"
            assert list(temp.glob(shipped))
            assert list((tmp_path / "shared-cache").glob("*/counts.json"))  # the prepared splits
            assert not any((tmp_path / "home-bare-cluster").glob("cache/*/counts.json"))

            # The cluster's environment now declares torch 2.13.0: a distribution's
            # metadata, which is what the check reads (importlib.metadata, first on the
            # workers' sys.path), so this proves the check, not a real second torch.
            dist = site / "torch-2.13.0.dist-info"
            dist.mkdir()
            (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
            mismatch = start_run("torch-mismatch", tmp_path / "mismatch.log", data={"limit": 400})
            mismatch.wait(timeout=300)
            output = (tmp_path / "mismatch.log").read_text(errors="replace")
            assert mismatch.returncode != 0, output[-5000:]
            line = (
                f"the Ray cluster at 127.0.0.1:{port} runs torch 2.13.0, this driver "
                f"{metadata.version('torch')}: install the same versions on both"
            )
            assert line in output, output[-5000:]
            assert "Traceback" not in output
            assert "epoch" not in output.lower()  # refused before training
    finally:
        shutil.rmtree(temp, ignore_errors=True)


# A `ray` whose first start ends in Ray's registration timeout and whose second starts.
FLAKY_RAY = """
import sys, time
from pathlib import Path

tries = Path(sys.argv[1])
tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
if tries.read_text() == "x":
    sys.exit("Exception: {timed_out}. This could happen because ...")
print("Ray runtime started.", flush=True)
time.sleep(600)
"""


def test_a_node_start_that_ray_timed_out_is_tried_again(tmp_path):
    tries = tmp_path / "tries"
    script = tmp_path / "ray.py"
    script.write_text(FLAKY_RAY.format(timed_out=STARTUP_TIMED_OUT))
    ray = [sys.executable, str(script), str(tries)]
    with ray_node([], dict(os.environ), tmp_path / "node.log", ray=ray) as node:
        assert node.poll() is None, (tmp_path / "node.log").read_text()
    assert tries.read_text() == "xx"
    log = (tmp_path / "node.log").read_text()
    assert STARTUP_TIMED_OUT in log and "Ray runtime started" in log  # both starts' output kept
