"""The front door as a new user meets it: the first `trainflow run` on a machine with an
empty PREFECT_HOME, a quiet console, and expected failures in one line, fast.

The command runs as a subprocess, as a user types it; a data failure inside the flow, one
line on the console and in the run's logs, is tests/e2e/test_data_configs.py's."""

import re

import pytest

from tests.e2e.test_cli import trainflow
from trainflow.prefect_server import PrefectServerError, TemporaryServer
from trainflow.runtime import local_cluster_resources

# A Prefect log line, as its console handler writes one: "04:22:49.465 | INFO    | ...".
PREFECT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| (\w+) +\| ")


@pytest.mark.slow
def test_first_run_on_a_new_machine_succeeds_quietly(tmp_path):
    """An empty PREFECT_HOME: Prefect's server creates its database while Ray and torch
    start beside it, the moment the first `make run` used to fail."""
    home, prefect_home = tmp_path / "home", tmp_path / "prefect-home"
    out = trainflow(
        "run", "configs/digits.yaml", "--smoke", home=home, env={"PREFECT_HOME": str(prefect_home)}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (prefect_home / "prefect.db").is_file()  # the run's own, new Prefect database

    # The summary; a smoke run registers under its own name.
    summary = out.stdout[out.stdout.index("model       digits-smoke") :]
    assert "digits-smoke version 1 -> champion" in summary
    assert re.search(r"test        accuracy 0\.\d+, macro_f1 0\.\d+", summary)
    assert "steps       ingest" in summary

    # Nothing on the console a user cannot act on: Prefect's INFO lines of the flow and
    # its tasks, and nothing else (no traceback, no native log line, no warning).
    others = [
        line
        for line in out.stderr.splitlines()
        if line.strip() and not (PREFECT_LINE.match(line) and PREFECT_LINE.match(line).group(1) == "INFO")
    ]
    assert others == [], out.stderr[-3000:]
    assert "Starting temporary server" not in out.stderr

    show = trainflow("models", "show", "digits-smoke@champion", home=home)
    assert show.returncode == 0, show.stderr
    assert '"gate.passed": "True"' in show.stdout


def more_than_this_machine_has() -> list[tuple[list[str], str]]:
    """Scalings a local cluster on this machine cannot hold, whatever the machine."""
    total = local_cluster_resources()
    gpus, cpus = int(total.get("GPU", 0)), int(total["CPU"])
    return [
        (
            ["--set", "scaling.use_gpu=true", "--set", f"scaling.num_workers={gpus + 1}"],
            rf"{gpus + 1} workers x 1 GPU = {gpus + 1} GPUs, the local Ray cluster on this machine "
            rf"would have {gpus}: set scaling.use_gpu=false",
        ),
        (
            ["--set", f"scaling.num_workers={4 * cpus + 64}"],
            rf"the local Ray cluster on this machine would have {cpus}: set "
            r"scaling.resources_per_worker.CPU to at most",
        ),
    ]


@pytest.mark.parametrize("args, message", more_than_this_machine_has())
def test_a_run_the_machine_cannot_hold_fails_in_one_line_before_anything_starts(tmp_path, args, message):
    home = tmp_path / "home"
    out = trainflow("run", *args, home=home)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), out.stderr
    # Neither Prefect's server, Ray nor the registry started.
    assert not (home / "prefect-server.log").exists() and not (home / "mlflow.db").exists()


def test_the_temporary_server_that_exits_says_so_in_one_line(tmp_path):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    # A database the server cannot open: its start-up fails, and the wait says so at once.
    bad = f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db"
    with temporary_settings(updates={PREFECT_API_DATABASE_CONNECTION_URL: bad}):
        with pytest.raises(
            PrefectServerError,
            match=r"^Prefect's temporary server exited with code \d+ before it answered: .*unable to open",
        ):
            with TemporaryServer(tmp_path / "server.log", timeout_s=120) as server:
                server.wait()


def test_the_temporary_server_that_does_not_answer_in_time_says_what_to_do(tmp_path):
    with pytest.raises(
        PrefectServerError, match=r"did not answer within 0\.01 s .*PREFECT_SERVER_EPHEMERAL_STARTUP"
    ):
        with TemporaryServer(tmp_path / "server.log", timeout_s=0.01) as server:
            server.wait()


def test_a_cluster_address_where_nothing_answers_fails_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    out = trainflow("run", "--set", f"ray.address=127.0.0.1:{port}", home=home)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no Ray cluster answers at 127.0.0.1:{port}")
    assert not (home / "prefect-server.log").exists()
