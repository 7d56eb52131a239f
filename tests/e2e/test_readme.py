"""The README's commands, run as it writes them: its front door must stay true.

`make test` and `make docs` are what CI runs (.ci/run), and `make run` after them; every
other command in the README's shell blocks runs here, with the summary and the one-line
error the README shows.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.commands import session_services
from tests.pipelines.test_serving import _free_port
from tests.web import POLL_TIMEOUT_S, http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IN_CI = ["make run", "make test"]  # .ci/run runs them, and `make docs`


def readme_commands() -> list[str]:
    """Every command of the README's ``bash`` blocks, without its comment."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def _env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")
    }
    return {**env, **session_services(), "TRAINFLOW_HOME": str(home)}


def _run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    args = command.split()
    args[0] = str(BIN / Path(args[0]).name)  # .venv/bin/trainflow: this venv's
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_runs_as_written(ray_cluster, prefect_harness, tmp_path):
    commands = readme_commands()
    assert commands[: len(IN_CI)] == IN_CI
    train, validate, serve = commands[len(IN_CI) :]
    env = _env(tmp_path / "home")

    trained = _run(train, env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = trained.stdout.strip().splitlines()
    assert summary[0].startswith("model       digits version 1 -> ")
    assert summary[-1].startswith('load it     trainflow.load_model("digits')
    checked = _run(validate, env)
    assert checked.returncode == 0 and checked.stdout.startswith("ok: churn "), checked.stderr

    port = _free_port()
    args = [str(BIN / "trainflow"), *serve.split()[1:], "--port", str(port)]
    server = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.communicate()
            try:
                if http.get(f"http://127.0.0.1:{port}/docs", timeout=POLL_TIMEOUT_S).status_code == 200:
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            assert time.monotonic() < deadline, "the endpoint never answered"
            time.sleep(0.5)
        answer = http.post(
            f"http://127.0.0.1:{port}/predict", json={"rows": [{f"pixel_{i}": 0.0 for i in range(64)}]}
        )
        assert answer.status_code == 200 and answer.json()["version"] == "1", answer.text
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=120)
    assert server.returncode == 0 and out.strip().splitlines()[-1] == "stopped", err[-3000:]


def test_the_readmes_error_is_what_a_typo_prints(tmp_path):
    shown = re.search(
        r"^error: invalid config: train\.learning_rate: .*$", (REPO / "README.md").read_text(), re.M
    )
    assert shown is not None
    out = _run(
        ".venv/bin/trainflow run --set train.learning_rate=0.1",
        {**os.environ, "TRAINFLOW_HOME": str(tmp_path)},
    )
    assert out.returncode == 2
    printed = out.stderr.strip()
    assert printed.startswith(shown.group(0).removesuffix("...").rstrip()), printed
