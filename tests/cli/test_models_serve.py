"""`trainflow models serve`: refused in one line before Ray starts, or served until a signal.

The refusals run in-process (Click's runner); the served command runs as a subprocess,
the way a user runs it, with a Ray cluster of its own, and stops on SIGTERM."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from tests.pipelines.test_registry import FRAME, make_checkpoint, register
from tests.web import POLL_TIMEOUT_S, http
from trainflow.cli import app
from trainflow.pipelines.registry import versions
from trainflow.ray_internals import switches
from trainflow.workspace import workspace


@pytest.fixture
def toy(trainflow_home, tmp_path):
    register(workspace(), make_checkpoint(tmp_path / "c1"), 0.8)
    return trainflow_home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unknown_model_alias_or_version_is_one_line_before_ray_starts(toy):
    """The served model's, or the shadow's (--shadow)."""
    import ray

    initialized = ray.is_initialized()  # a session cluster of earlier tests may be up
    for args, message in [
        (["nobody"], "error: unknown model 'nobody'; registered models: toy"),
        (["toy@staging"], "error: toy has no alias 'staging'; its aliases: champion"),
        (["toy/7"], "error: toy has no version 7; its versions: 1"),
        (["toy", "--shadow", "challenger"], "error: toy has no alias 'challenger'; its aliases: champion"),
        (["toy", "--shadow", "3"], "error: toy has no version 3; its versions: 1"),
    ]:
        result = CliRunner().invoke(app, ["models", "serve", *args])
        assert result.exit_code == 2 and result.stderr.strip() == message, result.output
    assert ray.is_initialized() == initialized


def test_a_port_in_use_or_replicas_the_machine_cannot_hold_are_refused(toy):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["models", "serve", "toy", "--port", str(port)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port"
    )
    result = CliRunner().invoke(app, ["models", "serve", "toy", "--replicas", "500"])
    assert result.exit_code == 2 and "--replicas 500 x 1 CPU = 500 CPUs" in result.stderr
    result = CliRunner().invoke(app, ["models", "serve", "toy", "--max-replicas", "500"])
    assert result.exit_code == 2 and "--max-replicas 500 x 1 CPU = 500 CPUs" in result.stderr
    result = CliRunner().invoke(app, ["models", "serve", "toy", "--replicas", "2", "--max-replicas", "3"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: give --replicas or --max-replicas, not both"


@pytest.mark.slow
def test_serves_until_sigterm_and_stops_cleanly(toy):
    port = _free_port()
    # Serve's proxy asks the new replica its queue length and waits too little for the answer,
    # as on a busy machine: Serve asks again, and its warning stays off the console.
    env = {**os.environ, "PYTHONPATH": os.getcwd(), switches.SERVE_QUEUE_PROBE_DEADLINE: "0.000001"}
    cmd = [sys.executable, "-m", "trainflow.cli", "models", "serve", "toy", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if http.get(f"{url}/healthz", timeout=POLL_TIMEOUT_S).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the endpoint never answered"
            time.sleep(0.5)
        rows = FRAME.to_dict(orient="records")
        answer = http.post(f"{url}/predict", json={"rows": rows}).json()
        assert answer["version"] == "1"
        assert answer["predictions"] == versions.load_model("toy/1").predict(FRAME).tolist()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines() == [
        f"serving toy at {url} (POST {url}/predict, GET {url}/model, docs {url}/docs); Ctrl-C stops",
        "stopped",
    ]
    assert "Traceback" not in err and "SIGTERM" not in err, err
    assert not re.search(r"\((ProxyActor|ServeController|ServeReplica)\S* pid=", err), err  # no Ray line
