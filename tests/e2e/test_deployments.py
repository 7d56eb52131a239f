"""Deployments as users run them, with real components: `prefect server start` on a
free localhost port, a process work pool and worker, the deployments from
deployments/prefect.yaml, `prefect deployment run ... --watch`, and `trainflow schedule`
on an interval schedule that fires by itself.

One server serves the module; each flow run the worker or `trainflow schedule` starts is a
subprocess, as in production, connecting to the session's Ray cluster (``ray_cluster``)
through RAY_ADDRESS, as runs on a shared cluster do: what is proven here is Prefect's side
(deployments, pull steps, schedules, workers); a run starting a local Ray cluster of its
own is tests/e2e/test_front_door.py's.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.commands import session_services, trainflow_in_process
from tests.e2e.flow_runs import run_deployment
from tests.web import POLL_TIMEOUT_S, http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, env, log: Path) -> subprocess.Popen:
    # Its own process group, so teardown stops the flow runs it spawned too.
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run(args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefect")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(tmp / "prefect-home"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        # Short loops so that a schedule fires and workers pick runs up within seconds.
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="1",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_RUNNER_POLL_FREQUENCY="1",
        TRAINFLOW_HOME=str(tmp / "trainflow-home"),
        # The git pull step clones this checkout: a real clone, with no network.
        TRAINFLOW_GIT_URL=str(REPO),
    )
    proc = start([BIN / "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env,
                 tmp / "server.log")  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        try:
            if http.get(f"{env['PREFECT_API_URL']}/health", timeout=POLL_TIMEOUT_S).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp / "server.log").read_text()[-3000:]
        time.sleep(0.2)
    yield env, tmp
    stop(proc)


@pytest.fixture(scope="module")
def deployed(server):
    """The server with trainflow's work pool and every deployment of
    deployments/prefect.yaml, deployed once for the module's tests."""
    env, tmp = server
    assert (
        run([BIN / "prefect", "work-pool", "create", "trainflow", "--type", "process"], env).returncode == 0
    )
    deployed = run([BIN / "trainflow", "deploy"], env)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    trainings = [f"training-pipeline/{name}" for name in ("nightly", "on-demand", "on-demand-git")]
    for name in [*trainings, "watch-data/watch-data", "retrain-on-new-data/on-new-data"]:
        assert name in deployed.stdout, deployed.stdout
    return env, tmp


def flow_runs(env, deployment_name: str) -> list[dict]:
    api = env["PREFECT_API_URL"]
    deployments = http.post(
        f"{api}/deployments/filter", json={"deployments": {"name": {"any_": [deployment_name]}}}
    ).json()
    if not deployments:
        return []
    body = {"flow_runs": {"deployment_id": {"any_": [deployments[0]["id"]]}}}
    return http.post(f"{api}/flow_runs/filter", json=body).json()


def models_show(env, model: str):
    """`trainflow models show` on the runs' registry, in this process (tests/e2e/test_front_door.py
    runs it as a subprocess)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFLOW_HOME", env["TRAINFLOW_HOME"])
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        return trainflow_in_process("models", "show", model)


def test_deployments_run_on_a_worker_and_a_schedule_of_its_own_fires(deployed, ray_cluster):
    env, tmp = deployed
    runs_env = {**env, **session_services(prefect_api=False)}  # for the flow runs' processes

    # The nightly deployment carries its cron schedule.
    nightly = http.post(
        f"{env['PREFECT_API_URL']}/deployments/filter", json={"deployments": {"name": {"any_": ["nightly"]}}}
    ).json()[0]
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["0 2 * * *"]

    worker = start([BIN / "prefect", "worker", "start", "--pool", "trainflow"], runs_env, tmp / "worker.log")
    scheduled = None
    try:
        # `prefect deployment run ... --watch`: Prefect 3's way to run a deployment by hand.
        ran = run(
            [BIN / "prefect", "deployment", "run", "training-pipeline/on-demand",
             "--params", json.dumps({"config": "configs/digits.yaml", "smoke": True}), "--watch"],
            env,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout[-3000:] + (tmp / "worker.log").read_text()[-3000:]
        assert "Completed" in ran.stdout
        shown = models_show(env, "digits-smoke/1")
        assert shown.returncode == 0, shown.output
        assert json.loads(shown.stdout)["tags"]["gate.passed"] == "True"

        # `trainflow schedule`'s interval schedule creates and runs a flow run by itself.
        # Started now: while it imports and waits for its first scheduled time, the worker
        # runs the (cheap) bad-parameter run below; no two trainings overlap.
        scheduled = start(
            [BIN / "trainflow", "schedule", "configs/digits.yaml", "--smoke", "--set", "name=served",
             "--name", "every-5s", "--interval", "5"],
            runs_env, tmp / "schedule.log",
        )  # fmt: skip

        # The git deployment runs from a fresh clone of the repository: its pull step
        # clones, and the flow loaded from the clone checks its parameters. A bad one fails
        # the run, its state naming the field; the training itself is the same as
        # on-demand's above, so it is not run a second time.
        bad = run(
            [BIN / "prefect", "deployment", "run", "training-pipeline/on-demand-git",
             "--params", json.dumps({"config": {"train": {"epochs": "many"}}}), "--watch"],
            env,
        )  # fmt: skip
        assert bad.returncode != 0
        worker_log = (tmp / "worker.log").read_text()
        assert "Executing deployment step: git_clone" in worker_log, worker_log[-3000:]
        (failed,) = flow_runs(env, "on-demand-git")
        assert failed["state"]["type"] == "FAILED" and "train.epochs" in failed["state"]["message"], failed
        stop(worker)

        deadline = time.monotonic() + 400
        while not any(
            r["auto_scheduled"] and r["state"]["type"] == "COMPLETED" for r in flow_runs(env, "every-5s")
        ):
            assert scheduled.poll() is None, (tmp / "schedule.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp / "schedule.log").read_text()[-3000:]
            time.sleep(1)
        assert re.search(r"served-smoke-[0-9a-f]{8}", (tmp / "schedule.log").read_text())
    finally:
        if scheduled is not None:
            stop(scheduled)
        stop(worker)


def events(env, resource_id: str) -> list[dict]:
    """The server's trainflow.data.changed events of one resource."""
    body = {"filter": {"event": {"name": ["trainflow.data.changed"]}, "resource": {"id": [resource_id]}}}
    return http.post(f"{env['PREFECT_API_URL']}/events/filter", json=body).json()["events"]


def await_log(env, flow_run_id: str, text: str) -> str:
    """The first line of a flow run's logs holding ``text``, once it reached the server
    (after the run's state)."""
    deadline = time.monotonic() + 120
    while True:
        logs = http.post(
            f"{env['PREFECT_API_URL']}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}}
        ).json()
        found = [log["message"] for log in logs if text in log["message"]]
        if found:
            return found[0]
        assert time.monotonic() < deadline, [log["message"] for log in logs]
        time.sleep(1)


def await_completed(env, deployment: str, count: int, log: Path) -> list[dict]:
    """The deployment's flow runs, once ``count`` of them have completed."""
    deadline = time.monotonic() + 600
    while True:
        runs = flow_runs(env, deployment)
        assert not any(r["state"]["type"] in ("FAILED", "CRASHED") for r in runs), log.read_text()[-3000:]
        if sum(r["state"]["type"] == "COMPLETED" for r in runs) >= count:
            return runs
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


def test_new_data_trains_once_through_the_event_trigger_and_data_trained_on_trains_nothing(
    deployed, ray_cluster, tmp_path
):
    from sklearn.datasets import load_digits

    env, tmp = deployed
    runs_env = {**env, **session_services(prefect_api=False)}

    data = tmp_path / "incoming" / "digits.csv"
    data.parent.mkdir()
    frame = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    frame.iloc[:300].to_csv(data, index=False)
    config = tmp_path / "incoming.yaml"
    params = json.dumps({"config": str(config)})
    config.write_text(
        f"name: incoming\ndata: {{source: {data}}}\ntrain: {{epochs: 1}}\n"
        "scaling: {num_workers: 1}\nregistry: {min_value: null}\n"
    )
    worker = start([BIN / "prefect", "worker", "start", "--pool", "trainflow"], runs_env, tmp / "worker2.log")
    try:
        # The data is new: two checks of it emit one event (its id is the data's), which
        # starts one training.
        for _ in range(2):
            run_deployment("watch-data/watch-data", params, env, tmp / "worker2.log")
        (trained,) = await_completed(env, "on-new-data", 1, tmp / "worker2.log")
        assert len(events(env, "trainflow.data.incoming")) == 1
        versions = models_show(env, "incoming/1")
        assert versions.returncode == 0, versions.output

        # Checked again, the data was trained on: no event.
        last_check = run_deployment("watch-data/watch-data", params, env, tmp / "worker2.log")
        assert "nothing to do" in await_log(env, last_check["id"], "version 1 was trained on this data")
        assert len(events(env, "trainflow.data.incoming")) == 1

        # The event posted by whoever writes the data, again: the run it starts trains nothing.
        posted = run(
            [BIN / "prefect", "event", "emit", "trainflow.data.changed", "--resource-id",
             "trainflow.data.incoming", "--payload", json.dumps({"config": str(config)})],
            env,
        )  # fmt: skip
        assert posted.returncode == 0, posted.stdout + posted.stderr
        runs = await_completed(env, "on-new-data", 2, tmp / "worker2.log")
        (again,) = [r for r in runs if r["id"] != trained["id"]]
        assert "not training again" in await_log(env, again["id"], "version 1 was trained on this data")

        # New rows: one check, one more training, a second version.
        frame.iloc[:360].to_csv(data, index=False)
        run_deployment("watch-data/watch-data", params, env, tmp / "worker2.log")
        await_completed(env, "on-new-data", 3, tmp / "worker2.log")
        second = models_show(env, "incoming/2")
        assert second.returncode == 0, second.output
        announced = [
            e for e in events(env, "trainflow.data.incoming") if "trainflow.data_fingerprint" in e["resource"]
        ]
        assert len(announced) == 2  # by the checks: the first data and the new rows; the third was posted
    finally:
        stop(worker)
