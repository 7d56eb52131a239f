"""Preflight's shared storage check on a cluster of two nodes (``ray.cluster_utils.Cluster``),
one of which does not see the cache.

Both nodes run on this machine, so they share its disk. To give one node the view a
machine without the shared mount has, its workers start in a mount namespace of their
own (the node's ``setup_worker_path``, the script Ray runs to start each of the node's
workers, enters one with ``unshare`` before starting the worker) where an empty folder is
bind-mounted over the cache: a process there reads and writes that path as usual and
gets its own empty folder, as on a node where the shared filesystem is not mounted. The
driver and the other node see the real cache. trainflow's code is not told about any of it.

The Cluster runs in a subprocess: a process holds one Ray session, and the tests' session
cluster (``ray_cluster``) may be running in this one.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# A node's worker starter: Ray runs `python SETUP_WORKER WORKER ARGS...` for each worker;
# this one enters a mount namespace, mounts the node's own folder over the hidden one, and
# execs Ray's own setup_worker.py with the same arguments (same process, same pid).
SETUP_WORKER = """\
import os, sys
os.execvp("unshare", [
    "unshare", {unshare},
    "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
    {local!r}, {hidden!r}, sys.executable, {ray_setup!r}, *sys.argv[1:],
])
"""

SCRIPT = """\
import json, os, sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from trainflow.config import PipelineConfig
from trainflow.cluster import PreflightError, preflight
from trainflow.cluster.session import ray_init_kwargs

root, setup_worker = Path(sys.argv[1]), sys.argv[2]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
node = cluster.add_node(num_cpus=1, setup_worker_path=setup_worker)
ray.init(address=cluster.address, **ray_init_kwargs())
cluster.wait_for_nodes()
alive = [n for n in ray.nodes() if n["Alive"]]
answers = {"node": node.node_id, "ip": node.node_ip_address, "nodes": len(alive)}
os.environ["TRAINFLOW_HOME"] = str(root / "home")
# The default cache (TRAINFLOW_HOME/cache), then one set by the config's cache field.
for case, cache in (("shared", None), ("hidden", str(root / "hidden" / "cache"))):
    try:
        preflight(PipelineConfig(storage=str(root / "runs"), cache=cache))
        answers[case] = "passed"
    except PreflightError as e:
        answers[case] = str(e)
print("ANSWERS " + json.dumps(answers), flush=True)
ray.shutdown()
cluster.shutdown()
"""


def unshare_args() -> list[str] | None:
    """``unshare`` options that give a process its own mount namespace here (root: a
    mount namespace; else a user namespace too), or None where neither is allowed."""
    for args in (["--mount", "--propagation", "private"], ["--user", "--map-root-user", "--mount"]):
        probe = subprocess.run(
            ["unshare", *args, "sh", "-c", "mount --bind / /mnt"], capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return args
    return None


def test_a_node_that_does_not_see_the_cache_fails_preflight_naming_both(tmp_path):
    from trainflow.ray_internals.probes import setup_worker_script

    args = unshare_args()
    if args is None:
        pytest.skip("unshare cannot make a mount namespace here (needs root or user namespaces)")
    # The node's own folder, and the cache folder ("hidden") that it is mounted over.
    local = tmp_path / "node-local"
    hidden = tmp_path / "hidden" / "cache"
    for folder in (local, hidden, tmp_path / "runs"):
        folder.mkdir(parents=True)
    setup_worker = tmp_path / "setup_worker.py"
    setup_worker.write_text(
        SETUP_WORKER.format(
            unshare=", ".join(repr(a) for a in args),
            local=str(local),
            hidden=str(hidden),
            ray_setup=setup_worker_script(),
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TRAINFLOW_HOME")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(setup_worker)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    answers = json.loads(lines[0].removeprefix("ANSWERS "))
    assert answers["nodes"] == 2
    # Both nodes see storage and the cache: preflight passes, and leaves no markers.
    assert answers["shared"] == "passed"
    assert not any(p.name.startswith(".trainflow-preflight-") for p in tmp_path.rglob("*"))
    # The second node writes into its own folder, not the cache: one line naming both.
    error = answers["hidden"]
    assert "\n" not in error
    where = f"Ray node {answers['node']} ({answers['ip']})"
    assert error.startswith(f"cache {hidden} is not reachable from {where}: FileNotFoundError: "), error
    assert "No such file or directory" in error
    assert "set cache to a folder every node and this driver mount at the same path" in error
