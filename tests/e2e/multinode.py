"""A local multi-node Ray cluster for tests that move nodes under a run: a head started by
``ray.cluster_utils.Cluster`` in a process of its own (so the test process keeps the
session's cluster), with token auth, and `trainflow` commands pointed at it."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.commands import session_services
from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV
from trainflow.testing import small_config

REPO = Path(__file__).resolve().parents[2]
# Not inherited from this process: what trainflow gives its own local clusters (the
# session's sets them here), which a cluster started elsewhere does not have.
NOT_INHERITED = ("RAY_ADDRESS", "PYTHONPATH", "MLFLOW_TRACKING_URI", *LOCAL_CLUSTER_ENV)

# Prints the head's address, then runs until its stdin closes.
HEAD = """
import json
import sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args=json.loads(sys.argv[1]))
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@dataclass
class LocalCluster:
    address: str
    env: dict[str, str]  # for `ray start` on a node that joins: the cluster's token included
    auth: dict[str, str]

    def node_args(self, num_cpus: int, resources: dict[str, float]) -> list[str]:
        """`ray start` arguments for a node that joins this cluster."""
        return [f"--address={self.address}", f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}"]


@contextmanager
def local_cluster(num_cpus: int, resources: dict[str, float], **env: str) -> Iterator[LocalCluster]:
    """A head node of ``num_cpus`` CPUs and ``resources``, with token auth on; ``env``: more
    variables for the cluster's processes (those Ray reads on the cluster)."""
    auth = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    cluster_env = {
        **{k: v for k, v in os.environ.items() if k not in NOT_INHERITED},
        **auth,
        **env,
    }
    head_args = json.dumps({"num_cpus": num_cpus, "resources": resources})
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD, head_args],
        env=cluster_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the cluster's head did not start"
        yield LocalCluster(address, cluster_env, auth)
    finally:
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()


def trainflow_command(
    cluster: LocalCluster,
    tmp_path: Path,
    command: str,
    name: str,
    log: Path,
    code: Path | None = None,
    **sections,
) -> subprocess.Popen:
    """`trainflow COMMAND` on a small config named ``name`` (``sections`` over
    ``trainflow.testing.small_config``, 400 rows) against ``cluster`` and the session's
    Prefect server, its output in ``log``; ``code``: a folder of the user's own modules."""
    sections.setdefault("data", {"limit": 400})
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(small_config(name=name, **sections)))
    env = {
        **{k: v for k, v in os.environ.items() if k not in NOT_INHERITED},
        **session_services(ray_address=False),
        **cluster.auth,
        "RAY_ADDRESS": cluster.address,
        "TRAINFLOW_HOME": str(tmp_path / "home"),
    }
    if path := os.pathsep.join(filter(None, [code and str(code), os.environ.get("PYTHONPATH")])):
        env["PYTHONPATH"] = path
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainflow.cli", command, str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``pattern`` is in ``log``; fails with the log's end if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in the run's log:\n{_story(log.read_text(errors='replace'))}")


def _story(output: str) -> str:
    """The end of a run's output without its epoch and step rows: what happened to it."""
    events = [line for line in output.splitlines() if not re.search(r"\bepoch \d+(/| step)", line)]
    return "\n".join(events)[-5000:]


def wait_for_node(log: Path, node: subprocess.Popen, timeout: float = 300) -> None:
    """Until the `ray start` node whose output is ``log`` has joined the cluster."""
    wait_for_line(log, r"Ray runtime started", node, timeout)
