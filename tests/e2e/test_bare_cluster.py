"""A Ray cluster started elsewhere, from a Python environment that has Ray and torch but
not trainflow: `trainflow run` through RAY_ADDRESS ships trainflow with the job, and a
torch of another version on the cluster is refused in one line before training.

The environment is a new venv whose site-packages holds a ``.pth`` file naming this
venv's site-packages: Ray, torch and the rest without installing them again. Python
does not process ``.pth`` files inside a folder that a ``.pth`` file adds, so trainflow's
editable install (a ``.pth`` hook in that folder) is not active there: checked below.
"""

import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import session_services
from tests.e2e.test_cluster import free_port, ray_node, wait_for
from trainflow.testing import small_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


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


def test_a_cluster_without_trainflow_runs_the_job_from_shipped_modules(prefect_harness, tmp_path):
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

    # A cluster with token authentication, as `ray start` makes by default. Its own temp
    # folder (short: Ray's socket paths live under it) holds what workers unpacked.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0")
    temp = Path(tempfile.mkdtemp(prefix="tf-ray-", dir="/tmp"))
    port = free_port()
    head = ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}"]
    driver_env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")},
        **session_services(ray_address=False),
        "RAY_ADDRESS": f"127.0.0.1:{port}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"],
    }

    # A user's model module that only the driver has (the example's, under its own name).
    code = tmp_path / "code"
    code.mkdir()
    (code / "bare_cluster_net.py").write_text((REPO / "examples" / "custom_model" / "resmlp.py").read_text())

    def run(name: str, model: dict | None = None) -> subprocess.CompletedProcess:
        # The cache in a folder of its own (`cache:`), as a cluster puts it on a shared mount.
        config = small_config(name=name, data={"limit": 400}, cache=str(tmp_path / "shared-cache"))
        config["model"] = model or config["model"]
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        path = os.pathsep.join(filter(None, [str(code), driver_env.get("PYTHONPATH")]))
        return subprocess.run(
            [sys.executable, "-m", "trainflow.cli", "run", str(tmp_path / f"{name}.yaml")],
            cwd=REPO,
            env={**driver_env, "PYTHONPATH": path, "TRAINFLOW_HOME": str(tmp_path / f"home-{name}")},
            capture_output=True,
            text=True,
            # A worker that cannot import what it needs leaves Ray Train waiting, not failing.
            timeout=300,
        )

    try:
        ray = [str(python), "-m", "ray.scripts.scripts"]
        with ray_node(head, env, tmp_path / "head.log", ray=ray, cwd=outside) as node:
            wait_for(tmp_path / "head.log", "will now block forever", node, timeout=180)
            # One job with a user's model module that only the driver has: Train's workers
            # need it and trainflow together (Ray merges runtime_envs key by key, so their
            # py_modules must list the job's as well).
            own = {"kind": "bare_cluster_net:build", "args": {"width": 12, "depth": 1, "dropout": 0.0}}
            done = run("bare-cluster", model=own)
            output = done.stdout + done.stderr
            assert done.returncode == 0, output[-5000:]
            assert "Traceback" not in output
            # The check's worker imported trainflow from the job's py_modules, unpacked by
            # the cluster; the training workers had no other copy to import.
            assert f"its workers import trainflow from {temp}/session_" in output, output[-5000:]
            assert "/runtime_resources/py_modules_files/" in output
            assert list(temp.glob("session_*/runtime_resources/py_modules_files/*/trainflow/runtime.py"))
            assert "bare-cluster version 1 -> champion" in output
            assert list((tmp_path / "shared-cache").glob("*/counts.json"))  # the prepared splits
            assert not (tmp_path / "home-bare-cluster" / "cache").exists() or not any(
                (tmp_path / "home-bare-cluster" / "cache").glob("*/counts.json")
            )

            # The cluster's environment now declares torch 2.13.0: a distribution's
            # metadata, which is what the check reads (importlib.metadata, first on the
            # workers' sys.path), so this proves the check, not a real second torch.
            dist = site / "torch-2.13.0.dist-info"
            dist.mkdir()
            (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
            done = run("torch-mismatch")
            output = done.stdout + done.stderr
            assert done.returncode != 0, output[-5000:]
            line = (
                f"the Ray cluster at 127.0.0.1:{port} runs torch 2.13.0, this driver "
                f"{metadata.version('torch')}: install the same versions on both"
            )
            assert line in output, output[-5000:]
            assert "Traceback" not in output
            assert "epoch" not in output.lower()  # refused before training
    finally:
        shutil.rmtree(temp, ignore_errors=True)
