"""A team's stack as `trainflow stack up` brings it up: PostgreSQL, an MLflow server on it,
a Prefect server on it, a Ray head and one more node with token auth, and a Prefect worker
on trainflow's pool with deployments/prefect.yaml applied, whose runs reach Ray through
Ray Client (``ray://``), as from a machine off the cluster.

One walk, as a team lives it: new data is announced by the watch-data deployment; its
event starts on-new-data, which the worker trains through ``ray://`` and registers on the
PostgreSQL-backed server; serve-champion serves it; the endpoint is asked about rows unlike
those it was trained on, watch-served sees the drift and, under ``drift.action: retrain``,
its event trains a second version on the newer data in the source, which the endpoint then
follows; a teammate reproduces it from their own shell through the head's ``host:port``;
`trainflow stack down` leaves no process and no port behind, and keeps the data.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.flow_runs import run_deployment
from tests.e2e.team import free_port
from tests.web import POLL_TIMEOUT_S, http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STEP_TIMEOUT_S = 600


def trainflow(*args, env=None, timeout=STEP_TIMEOUT_S) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainflow.cli", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def shell_env(exports: str, home: Path) -> dict[str, str]:
    """A teammate's shell after ``eval "$(trainflow stack env)"``, with a TRAINFLOW_HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_"))}
    for line in exports.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value
    return {**env, "TRAINFLOW_HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def flow_runs(api: str, deployment: str) -> list[dict]:
    deployments = http.post(
        f"{api}/deployments/filter", json={"deployments": {"name": {"any_": [deployment]}}}
    )
    body = {"flow_runs": {"deployment_id": {"any_": [d["id"] for d in deployments.json()]}}}
    return http.post(f"{api}/flow_runs/filter", json=body).json()


def await_completed(api: str, deployment: str, count: int, log: Path) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        runs = flow_runs(api, deployment)
        assert not any(r["state"]["type"] in ("FAILED", "CRASHED") for r in runs), logs_of(log)
        if sum(r["state"]["type"] == "COMPLETED" for r in runs) >= count:
            return
        assert time.monotonic() < deadline, logs_of(log)
        time.sleep(1)


def logs_of(worker_log: Path) -> str:
    """The worker's log, and the errors of Ray Client's servers on the stack's cluster."""
    stack = stack_of(worker_log.parent.parent)
    client = sorted(stack.ray_temp.glob("session_latest/logs/ray_client_server*.err"))
    errors = [f"{f.name}: {f.read_text(errors='replace')[-1500:]}" for f in client if f.stat().st_size]
    return "\n".join([worker_log.read_text()[-4000:], *errors])


# Ray Data's detached helpers, one per cluster whatever the number of jobs.
RAY_DATA_SINGLETONS = {"AutoscalingCoordinator", "datasets_stats_actor", "ActorLocationTracker"}


def stack_of(folder: Path):
    from trainflow.stack import Stack

    return Stack.load(folder)


def ray_listed(what: str, env: dict[str, str], stack) -> list[dict]:
    """`ray list WHAT` on the stack's cluster (its dashboard), the live ones."""
    dashboard = f"http://127.0.0.1:{stack.ports['dashboard']}"
    command = [BIN / "ray", "list", what, "--address", dashboard, "--format", "json", "--limit", "1000"]
    if what == "actors":
        command += ["--filter", "state=ALIVE"]
    listed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    return json.loads(listed.stdout)


def served_version(url: str) -> str | None:
    try:
        return http.get(f"{url}/model", timeout=POLL_TIMEOUT_S).json()["version"]
    except Exception:  # noqa: BLE001 - not answering yet
        return None


def await_served(url: str, version: str, log: Path) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while served_version(url) != version:
        assert time.monotonic() < deadline, f"{url} serves {served_version(url)}: {log.read_text()[-4000:]}"
        time.sleep(1)


def await_sampled(folder: Path, rows: int, log: Path) -> None:
    """Until the endpoint's replicas have written samples drawn from ``rows`` served rows."""
    import pyarrow.parquet as pq

    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        files = folder.glob("requests-*.parquet")
        seen = sum(int((pq.read_schema(f).metadata or {}).get(b"trainflow.seen", b"0")) for f in files)
        if seen >= rows:
            return
        assert time.monotonic() < deadline, f"{seen} rows sampled under {folder}: {log.read_text()[-3000:]}"
        time.sleep(1)


def test_a_team_stack_trains_serves_follows_and_reproduces_then_stops_clean(tmp_path):
    from mlflow import MlflowClient
    from sklearn.datasets import load_digits

    from trainflow.config import load_config
    from trainflow.stack import Stack
    from trainflow.stack.services import members, port_open, postgres_bin

    if postgres_bin() is None:
        pytest.skip("no PostgreSQL server on this machine (apt-get install postgresql)")
    folder = tmp_path / "stack"
    up = trainflow("stack", "up", "--folder", folder)
    sweeping = None
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "worker    up" in up.stdout, up.stdout
        exports = trainflow("stack", "env", "--folder", folder).stdout
        env = shell_env(exports, tmp_path / "teammate")
        api, worker_log = env["PREFECT_API_URL"], folder / "logs" / "worker.log"
        prefect = [BIN / "prefect", "deployment", "run"]

        data = tmp_path / "incoming" / "digits.csv"
        data.parent.mkdir()
        frame = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
        frame.iloc[:300].to_csv(data, index=False)
        config = tmp_path / "team.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "name": "team-digits",
                    "data": {"source": str(data)},
                    "model": {"kind": "mlp", "hidden_sizes": [32]},
                    "train": {"epochs": 1, "lr": 0.01},
                    "scaling": {"num_workers": 1},
                    # Each new version goes in front: what is shown is that the endpoint follows.
                    "registry": {"min_value": None, "min_improvement": -1.0},
                    "drift": {"action": "retrain"},
                    # What every machine of the team reaches: runs' checkpoints, served samples.
                    "storage": str(tmp_path / "shared"),
                }
            )
        )

        # New data, announced: the event's deployment trains it on the worker, through ray://.
        run_deployment("watch-data/watch-data", json.dumps({"config": str(config)}), env, worker_log)
        await_completed(api, "on-new-data", 1, worker_log)
        registry = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        assert registry.get_model_version_by_alias("team-digits", "champion").version == "1"
        log = worker_log.read_text()
        assert f"connecting to the Ray cluster at {Stack.load(folder).ray_client}" in log, log[-3000:]
        # As quiet through Ray Client as on a local cluster.
        for noise in ("Reporting training result", "SIGTERM handler is not set", "Traceback"):
            assert noise not in log, log[-3000:]

        # The champion served by the serve-champion deployment, on a port of the stack's machine.
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        params = json.dumps({"model": "team-digits@champion", "port": port})
        served = [*prefect, "serve-model/serve-champion", "--params", params]
        started = subprocess.run(served, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        assert started.returncode == 0, started.stdout[-3000:]
        await_served(url, "1", worker_log)

        # Newer data lands unannounced, and the endpoint is asked about digits unlike those it
        # learnt (inverted pixels): watch-served sees the drift, its event trains on the data
        # as it is now, one more version, and the endpoint follows the champion.
        frame.iloc[:900].to_csv(data, index=False)
        inverted = (16 - frame.drop(columns="label").iloc[:300]).to_dict("records")
        for start in range(0, len(inverted), 100):
            asked = http.post(f"{url}/predict", json={"rows": inverted[start : start + 100]})
            assert asked.status_code == 200, asked.text
        await_sampled(tmp_path / "shared" / "serving" / "team-digits", len(inverted), worker_log)
        run_deployment("watch-served/watch-served", json.dumps({"model": "team-digits"}), env, worker_log)
        await_completed(api, "on-new-data", 2, worker_log)
        assert "emitted trainflow.model.drifted" in worker_log.read_text(), logs_of(worker_log)
        assert registry.get_model_version_by_alias("team-digits", "champion").version == "2"
        await_served(url, "2", worker_log)
        answer = http.post(
            f"{url}/predict", json={"rows": frame.drop(columns="label").iloc[:2].to_dict("records")}
        )
        assert answer.status_code == 200 and answer.json()["version"] == "2", answer.text

        # From a machine off the cluster, through Ray Client: a sweep (Tune's loop runs in an
        # actor on the cluster there), beside a batch prediction.
        off_cluster = {**env, "RAY_ADDRESS": Stack.load(folder).ray_client}
        sweep_config = tmp_path / "team-sweep.yaml"
        trials = {"space": {"train.lr": {"grid": [0.05, 0.01]}}, "trials": 1}
        trials["scaling"] = {"num_workers": 1, "resources_per_worker": {"CPU": 0.5}}
        sweep_config.write_text(
            yaml.safe_dump({**yaml.safe_load(config.read_text()), "name": "team-sweep", "sweep": trials})
        )
        sweep_log = tmp_path / "sweep.log"
        with sweep_log.open("w") as out:
            command = [sys.executable, "-m", "trainflow.cli", "sweep", sweep_config]
            sweeping = subprocess.Popen(
                command, cwd=REPO, env=off_cluster, stdout=out, stderr=subprocess.STDOUT
            )
        predicted = trainflow(
            "predict", "team-digits@champion", data, tmp_path / "predicted", env=off_cluster
        )
        assert predicted.returncode == 0, predicted.stdout[-3000:] + predicted.stderr[-3000:]
        assert "900 predictions of team-digits v2" in predicted.stdout, predicted.stdout
        assert "Traceback" not in predicted.stderr, predicted.stderr[-3000:]

        # A shell without the cluster's token: one line, through Ray Client as at the head.
        for address in (Stack.load(folder).ray_client, env["RAY_ADDRESS"]):
            no_token = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")} | {
                "RAY_ADDRESS": address
            }
            refused = trainflow("run", config, env=no_token)
            assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
            assert refused.stderr.startswith(f"error: the Ray cluster at {address} wants a token"), (
                refused.stderr
            )
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        # ... and each shows on the team's Prefect server as a failed run, with that line.
        body = {"flows": {"name": {"any_": ["training-pipeline"]}}}
        body["flow_runs"] = {"state": {"type": {"any_": ["FAILED"]}}}
        failed = http.post(f"{api}/flow_runs/filter", json=body).json()
        name = f"team-digits-{load_config(str(config)).config_hash()[:8]}"
        assert [r["name"] for r in failed] == [name, name], failed
        assert all("wants a token" in r["state"]["message"] for r in failed), failed

        assert sweeping.wait(STEP_TIMEOUT_S) == 0, sweep_log.read_text()[-3000:]
        swept = sweep_log.read_text()
        assert "2 trials: 2 completed" in swept and "registered team-sweep version 1" in swept, swept[-3000:]
        assert len(re.findall(r"trial \S+ epoch 1 ", swept)) == 2, swept[-3000:]  # relayed to this console
        # Nothing of Tune's own output, nor a Prefect server started where Tune's loop runs.
        for noise in ("TunerInternal", "Configuration for experiment", "temporary server", "Traceback"):
            assert noise not in swept, swept[-3000:]

        # What finished runs leave on the shared cluster: nothing of their own. The endpoint's
        # actors serve on; Ray Data keeps one of each of its cluster-wide helpers (detached,
        # shared by every job, made once).
        alive = ray_listed("actors", env, stack_of(folder))
        ours = [a for a in alive if a["ray_namespace"] != "serve" and a["name"] not in RAY_DATA_SINGLETONS]
        assert ours == [], ours
        groups = ray_listed("placement-groups", env, stack_of(folder))
        assert [g for g in groups if g["state"] != "REMOVED"] == [], groups

        # A teammate's shell reproduces version 2 through the head's host:port.
        assert not env["RAY_ADDRESS"].startswith("ray://")
        again = trainflow("models", "reproduce", "team-digits/2", env=env)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert registry.get_model_version("team-digits", "3").tags["reproduces"] == "2"
    finally:
        if sweeping is not None and sweeping.poll() is None:
            sweeping.kill()
        stack = Stack.load(folder)
        down = trainflow("stack", "down", "--folder", folder, timeout=300)
        left = members(folder)
        listening = [name for name, port in stack.ports.items() if port_open(port)]
        kept = stack.exists and stack.postgres.data.is_dir()
        deleted = trainflow("stack", "down", "--folder", folder, "--delete", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert left == [] and listening == []
    assert kept  # the data stays for the next `up`; --delete removes it
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert not folder.exists() and not stack.postgres.root.exists()
