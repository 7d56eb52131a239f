"""Running a deployment from the tests the way `prefect deployment run` does, awaited
through the server's API.

`prefect deployment run ... --watch` follows the server's event stream until it sees the
run's terminal state event, and waits on when it misses that event, which happens on a
loaded host (PrefectHQ/prefect#19989). A test whose subject is what the run does, not the
CLI's watch, creates the run without ``--watch`` and reads its state until it is final;
tests/e2e/test_deployments.py's first test runs deployments with ``--watch``, as the
guides do."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.web import http

BIN = Path(sys.executable).parent
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def run_deployment(deployment: str, params: str, env: dict[str, str], log: Path, timeout: float = 600):
    """A flow run of ``deployment`` with ``params`` (JSON), once final: the run as the
    API returns it. A run that ends otherwise than completed, or not within ``timeout``
    seconds, fails the test with its state and the end of ``log`` (the worker's)."""
    created = subprocess.run(
        [BIN / "prefect", "deployment", "run", deployment, "--params", params],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout[-3000:] + created.stderr[-3000:]
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", created.stdout).group(1)
    deadline = time.monotonic() + timeout
    while True:
        flow_run = http.get(f"{env['PREFECT_API_URL']}/flow_runs/{run_id}").json()
        if flow_run["state"]["type"] in FINAL:
            break
        assert time.monotonic() < deadline, (flow_run["state"], log.read_text()[-3000:])
        time.sleep(1)
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], log.read_text()[-3000:])
    return flow_run
