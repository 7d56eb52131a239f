"""`trainflow ui`: its refusals and the Prefect UI's address in-process (fast), and MLflow's
UI over a registry with versions and aliases, looked at in headless Chromium (slow).

The slow test uses the UI's environment where the command keeps it (the user's cache
folder), so the suite installs MLflow's UI once, not per run."""

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from typer.testing import CliRunner

from tests.pipelines.test_registry import make_checkpoint, register
from trainflow.cli import app, ui
from trainflow.pipelines.registry import store
from trainflow.stack import mlflow_env
from trainflow.workspace import workspace

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLOW_RUN = {
    "prefect.flow_run_id": "7f0c3a52-9d1e-4b8a-a3f4-0c2d5e6f7a81",
    "prefect.flow_run_name": "quiet-lemur",
    "prefect.flow_name": "training-pipeline",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_prefect_profile(tmp_path, monkeypatch):
    """Prefect's settings from the environment alone, not the machine's profiles."""
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(tmp_path / "no-profiles.toml"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)


def test_a_port_in_use_and_a_host_that_is_not_here_are_refused_in_one_line(trainflow_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(app, ["ui", "--port", str(port)])
    assert out.exit_code == 2
    assert (
        out.stderr
        == f"error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port\n"
    )
    out = CliRunner().invoke(app, ["ui", "--host", "nowhere.invalid"])
    assert out.exit_code == 2 and out.stderr.startswith(
        "error: --host nowhere.invalid: not an address of this"
    )
    assert len(out.stderr.splitlines()) == 1


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


def test_the_prefect_ui_address_is_the_api_url_less_api(trainflow_home, no_prefect_profile, monkeypatch):
    # An MLflow server's registry: its own UI, printed with Prefect's, and nothing started.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000/")
    out = CliRunner().invoke(app, ["ui"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == [
        "MLflow UI: http://mlflow.example:5000 (the MLflow server MLFLOW_TRACKING_URI names)",
        "Prefect UI: no server configured (each run starts a temporary one that ends with it); "
        "`prefect server start` and PREFECT_API_URL=http://127.0.0.1:4200/api keep one",
    ]

    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{server.server_port}/api")
        assert ui.prefect_line() == f"Prefect UI: http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
    nobody = free_port()
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{nobody}/api/")
    assert ui.prefect_ui() == (f"http://127.0.0.1:{nobody}", False)
    assert ui.prefect_line() == f"Prefect UI: http://127.0.0.1:{nobody} (its server does not answer now)"


@pytest.mark.skipif(
    mlflow_env.full_mlflow_here(),
    reason="the full mlflow is installed beside trainflow: the UI needs no environment of its own",
)
def test_no_package_index_is_one_line_saying_what_to_do(trainflow_home, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # none of this machine's indexes or wheel folders
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    out = CliRunner().invoke(app, ["ui", "--port", str(free_port())])
    release, env = mlflow_env.mlflow_release(), mlflow_env.ui_env()
    assert out.exit_code == 1, out.output
    assert out.stdout.startswith(f"preparing MLflow's UI, once: installing mlflow=={release} into {env}")
    assert out.stderr == (
        f"error: could not install mlflow=={release} for MLflow's UI (ERROR: No matching distribution "
        f"found for mlflow=={release}); it needs a package index that pip reaches (pip's config or "
        f"PIP_INDEX_URL); pip's log: {env / 'install.log'}\n"
    )
    assert not (env / mlflow_env.READY_MARK).exists()  # the next run tries again


@pytest.fixture(scope="session")
def ui_python() -> str:
    """MLflow's UI environment, where `trainflow ui` keeps it: made once, reused by every
    later run of the suite."""
    try:
        return str(mlflow_env.ui_python(print))
    except mlflow_env.UIError as e:
        pytest.skip(f"MLflow's UI environment cannot be prepared here: {e}")


def page_text(url: str, profile, expected: list[str]) -> str:
    """The text of ``url`` as headless Chromium renders it (MLflow's UI is a JS app: the DOM
    after its scripts ran), tried again while some of ``expected`` is missing."""
    for _ in range(3):
        dom = subprocess.run(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True, text=True, timeout=300,
        ).stdout  # fmt: skip
        dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())
        if all(e in text for e in expected):
            break
    return text


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium on this machine (apt-get install -y chromium)"
)
def test_mlflow_ui_shows_the_models_versions_aliases_and_who_registered_them(
    ui_python, trainflow_home, tmp_path, no_prefect_profile
):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8, tags=FLOW_RUN)
    second = register(ws, make_checkpoint(tmp_path / "c2", seed=2), 0.7)
    run = store.client(ws).get_run(store.client(ws).get_model_version("toy", "1").run_id)

    port = free_port()
    command = subprocess.Popen(
        [sys.executable, "-m", "trainflow.cli", "ui", "--port", str(port)],
        env={**os.environ, "TRAINFLOW_HOME": str(trainflow_home)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = []
        deadline = time.monotonic() + 300
        while not any(line.startswith("MLflow UI:") for line in lines) and time.monotonic() < deadline:
            line = command.stdout.readline()
            assert line, f"trainflow ui ended: {command.wait()} {command.stderr.read()}"
            lines.append(line.strip())
        url = f"http://127.0.0.1:{port}"
        assert f"MLflow UI: {url} (models: {url}/#/models); Ctrl-C stops" in lines
        assert command.stdout.readline().startswith("Prefect UI: no server configured")

        profile = tmp_path / "chromium"
        model = page_text(f"{url}/#/models/toy", profile, ["Version 2", "Gate failed"])
        assert "Registered Models" in model and "toy" in model
        assert "Version 1" in model and "Version 2" in model
        assert "@ champion" in model and "@ challenger" in model
        # Each version's description starts with the gate's decision.
        assert "Gate passed: champion" in model and "Gate failed: challenger" in model
        v1 = page_text(f"{url}/#/models/toy/versions/1", profile, ["Registered by"])
        assert "Gate passed: champion. no champion yet" in v1
        assert "Test metrics: accuracy 0.8000, macro_f1 0.8000" in v1
        assert f"flow training-pipeline, id {FLOW_RUN['prefect.flow_run_id']}" in v1
        v2 = page_text(f"{url}/#/models/toy/versions/{second.version}", profile, ["Registered by"])
        assert "Gate failed: challenger. accuracy 0.7000 vs champion v1 0.8000" in v2
        run_url = f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        run_page = page_text(run_url, profile, ["Created by"])
        assert "Created by Prefect flow run quiet-lemur" in run_page
        assert f"Source training-pipeline flow run {FLOW_RUN['prefect.flow_run_id']}" in run_page
    finally:
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=60)
    assert command.returncode == 0, err
    assert out.splitlines()[-1] == "stopped" and "Traceback" not in err, err
