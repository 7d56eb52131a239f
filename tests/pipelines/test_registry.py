import contextlib
import getpass
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pytest

from trainflow.config import ModelConfig, PipelineConfig, RegistryConfig
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.models.build import build_model, model_spec
from trainflow.pipelines.models.checkpoint import load_checkpoint, save_checkpoint
from trainflow.pipelines.registry import gate, lineage, registration, store, versions
from trainflow.workspace import workspace

FRAME = pd.DataFrame({"a": [0.1, -2.0, 3.0], "b": [1.0, 0.0, -1.0]})


def make_checkpoint(folder, seed=0, pre=None, model=None):
    """A checkpoint of an untrained model (an MLP unless ``model`` says otherwise); by
    default of two numeric columns a and b, two classes."""
    import torch

    torch.manual_seed(seed)
    pre = pre or Preprocessor(["a", "b"], "label", [0, 1], scaler="none")
    model = model or ModelConfig(kind="mlp", hidden_sizes=[4])
    spec = model_spec(model, pre.num_features, pre.num_outputs)
    save_checkpoint(
        folder,
        model=build_model(spec),
        spec=spec,
        preprocessor=pre.to_dict(),
        config=PipelineConfig().model_dump(mode="json"),
        metrics={"epoch": 1},
    )
    return str(folder)


def register(ws, folder, accuracy, gate=None, fingerprint="test-a", reevaluate=None, name="toy", tags=None):
    return registration.register_checkpoint(
        ws,
        name=name,
        checkpoint_dir=folder,
        params={"train": {"lr": 0.1}},
        metrics={"accuracy": accuracy, "macro_f1": accuracy},
        history=[{"epoch": 1, "train_loss": 0.9}, {"epoch": 2, "train_loss": 0.5}],
        tags={lineage.TEST_FINGERPRINT_TAG: fingerprint, **(tags or {})},
        gate=gate or RegistryConfig(min_value=0.5),
        reevaluate=reevaluate,
    )


def alias_version(c, alias, name="toy"):
    return str(c.get_model_version_by_alias(name, alias).version)


def test_gate_promotes_a_better_model_and_a_worse_one_becomes_challenger(trainflow_home, tmp_path):
    ws = workspace()
    first = register(ws, make_checkpoint(tmp_path / "c1"), 0.80)
    assert first.version == "1" and first.champion and first.aliases == ["champion"]
    worse = register(ws, make_checkpoint(tmp_path / "c2"), 0.70)
    assert worse.version == "2" and not worse.champion and worse.aliases == ["challenger"]
    assert "improvement -0.1000 < 0.0" in worse.decision.reason
    better = register(ws, make_checkpoint(tmp_path / "c3"), 0.90)
    assert better.champion and better.decision.champion_version == "1"
    assert better.decision.same_test_data is True and not better.decision.champion_reevaluated
    c = store.client(ws)
    assert alias_version(c, "champion") == "3" and alias_version(c, "challenger") == "2"
    v2 = c.get_model_version("toy", "2")
    assert v2.tags["gate.passed"] == "False" and v2.tags["gate.candidate"] == "0.7"
    assert v2.tags["gate.champion"] == "0.8" and v2.tags["gate.champion_version"] == "1"
    # The version's page in MLflow's UI says the gate's decision, the metrics and who registered it.
    assert v2.description == (
        "Gate failed: challenger. accuracy 0.7000 vs champion v1 0.8000: improvement -0.1000 < 0.0"
        f"\n\nTest metrics: accuracy 0.7000, macro_f1 0.7000\n\nRegistered by {getpass.getuser()}."
    )
    assert c.get_model_version("toy", "3").description.startswith("Gate passed: champion. accuracy")
    run = c.get_run(better.run_id)
    assert run.data.params["train.lr"] == "0.1" and run.data.metrics["test_accuracy"] == 0.9
    assert [m.step for m in c.get_metric_history(better.run_id, "train_loss")] == [1, 2]
    assert [(m["alias"], m["version"], m["previous"]) for m in gate.moves(c, "toy")] == [
        ("champion", "1", None),
        ("challenger", "2", None),
        ("champion", "3", "1"),
    ]


def test_a_version_and_its_run_name_the_flow_run_that_registered_them(trainflow_home, tmp_path):
    flow_run = {
        "prefect.flow_run_id": "7f0c3a52-9d1e-4b8a-a3f4-0c2d5e6f7a81",
        "prefect.flow_run_name": "quiet-lemur",
        "prefect.flow_name": "training-pipeline",
        "git.commit": "0123456789abcdef0123456789abcdef01234567",
    }
    ws = workspace()
    reg = register(ws, make_checkpoint(tmp_path / "c1"), 0.8, tags=flow_run)
    c = store.client(ws)
    assert c.get_model_version("toy", reg.version).description == (
        "Gate passed: champion. no champion yet; accuracy 0.8000 clears min_value 0.5\n\n"
        "Test metrics: accuracy 0.8000, macro_f1 0.8000\n\nRegistered by Prefect flow run quiet-lemur "
        "(flow training-pipeline, id 7f0c3a52-9d1e-4b8a-a3f4-0c2d5e6f7a81)."
    )
    # What MLflow's run page shows as "Created by", "Source" and the git commit.
    run = c.get_run(reg.run_id)
    assert run.info.user_id == run.data.tags["mlflow.user"] == "Prefect flow run quiet-lemur"
    assert run.data.tags["mlflow.source.name"] == (
        "training-pipeline flow run 7f0c3a52-9d1e-4b8a-a3f4-0c2d5e6f7a81"
    )
    assert run.data.tags["mlflow.source.type"] == "JOB"
    assert run.data.tags["mlflow.source.git.commit"] == flow_run["git.commit"]

    # Outside a flow run: this process's user, as MLflow's own fluent API records it.
    other = c.get_run(register(ws, make_checkpoint(tmp_path / "c2"), 0.7).run_id)
    assert other.info.user_id == other.data.tags["mlflow.user"] == getpass.getuser()
    assert other.data.tags["mlflow.source.type"] == "LOCAL"


def test_a_champion_from_other_test_data_is_reevaluated_before_the_comparison(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1", seed=1), 0.99, fingerprint="old-data")
    seen = []

    def reevaluate(folder):
        seen.append(folder)
        # The champion's own registered checkpoint, as the registry holds it.
        assert load_checkpoint(folder).predict_proba(FRAME).shape == (3, 2)
        return {"accuracy": 0.60, "macro_f1": 0.55}

    # Registered at 0.99 on old data, the champion scores 0.60 on the new test split:
    # a challenger at 0.80 is better on the same rows and takes over.
    reg = register(ws, make_checkpoint(tmp_path / "c2"), 0.80, fingerprint="new-data", reevaluate=reevaluate)
    assert len(seen) == 1
    d = reg.decision
    assert reg.champion and d.champion == 0.60 and d.champion_reevaluated and d.same_test_data is False
    assert "re-evaluated on this test data" in d.reason
    tags = store.client(ws).get_model_version("toy", "2").tags
    assert tags["gate.champion"] == "0.6" and tags["gate.champion_reevaluated"] == "True"

    # Same test data: the recorded number is used, nothing is re-scored.
    def must_not_run(folder):
        raise AssertionError("re-evaluated a champion measured on the same test data")

    worse = register(
        ws, make_checkpoint(tmp_path / "c3"), 0.70, fingerprint="new-data", reevaluate=must_not_run
    )
    assert not worse.champion and worse.decision.champion == 0.80


def test_a_champion_that_cannot_score_the_new_data_leaves_min_value_to_decide(trainflow_home, tmp_path):
    from trainflow.pipelines.data.schema import DataError

    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.95, fingerprint="old-data")

    def reevaluate(folder):
        raise DataError("input lacks feature columns b that the model was trained on")

    reg = register(ws, make_checkpoint(tmp_path / "c2"), 0.6, fingerprint="new-data", reevaluate=reevaluate)
    assert reg.champion and reg.decision.champion is None and reg.decision.champion_version == "1"
    assert reg.decision.reason.startswith(
        "champion v1 cannot score this test data (input lacks feature columns b"
    )
    assert reg.decision.reason.endswith("accuracy 0.6000 clears min_value 0.5")


def test_min_value_blocks_even_the_first_model(trainflow_home, tmp_path):
    reg = register(workspace(), make_checkpoint(tmp_path / "c"), 0.4, gate=RegistryConfig(min_value=0.9))
    assert not reg.champion and "below min_value 0.9" in reg.decision.reason
    assert reg.aliases == ["challenger"]


def test_decide_with_a_required_improvement():
    thresholds = RegistryConfig(min_improvement=0.02, min_value=0.5)
    assert not gate.decide("accuracy", 0.91, 0.90, thresholds, champion_version="1").passed
    assert gate.decide("accuracy", 0.93, 0.90, thresholds, champion_version="1").passed


@pytest.mark.parametrize(
    "decision",
    [
        gate.decide("accuracy", 0.93, 0.90, RegistryConfig(min_value=0.5), champion_version="12"),
        gate.decide("rmse", 57.0, None, RegistryConfig(), champion_note="no champion yet"),
    ],
)
def test_a_gate_decision_reads_back_from_its_tags_as_it_was_decided(decision):
    """Every field of the decision, through MLflow's string tags and back, keeps its type:
    a field added to GateDecision that the registry reads back otherwise fails here."""
    from trainflow.pipelines.registry.gate import gate_tags
    from trainflow.pipelines.registry.versions import gate_values

    tags = gate_tags(decision.to_dict())
    assert all(isinstance(text, str) for text in tags.values())
    assert gate_values({**tags, "trainflow.config_hash": "1"}) == decision.to_dict()


def test_promote_and_rollback_keep_a_history_of_champions(trainflow_home, tmp_path):
    ws = workspace()
    for i, acc in enumerate([0.8, 0.9, 0.7], start=1):
        register(ws, make_checkpoint(tmp_path / f"c{i}"), acc)
    c = store.client(ws)
    assert alias_version(c, "champion") == "2" and alias_version(c, "challenger") == "3"

    assert versions.rollback(ws, "toy")["version"] == "1"
    assert alias_version(c, "champion") == "1"
    with pytest.raises(versions.RegistryError, match=r"toy has no previous champion .*champion: v1"):
        versions.rollback(ws, "toy")

    move = versions.promote(ws, "toy", "3")
    assert (move["version"], move["previous"], move["action"]) == ("3", "1", "promote")
    v3 = c.get_model_version("toy", "3")
    assert v3.aliases == ["champion"]  # no longer the challenger
    assert versions.rollback(ws, "toy")["version"] == "1"
    actions = [(m["action"], m["version"]) for m in gate.moves(c, "toy") if m["alias"] == "champion"]
    assert actions == [("gate", "1"), ("gate", "2"), ("rollback", "1"), ("promote", "3"), ("rollback", "1")]


def test_unknown_models_versions_and_aliases_are_named(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c"), 0.8)
    with pytest.raises(versions.RegistryError, match="use NAME@ALIAS"):
        versions.resolve(ws, "a/b/c")
    with pytest.raises(versions.RegistryError, match=r"unknown model 'nobody'; registered models: toy"):
        versions.resolve(ws, "nobody@champion")
    with pytest.raises(versions.RegistryError, match=r"toy has no version 7; its versions: 1"):
        versions.resolve(ws, "toy/7")
    with pytest.raises(versions.RegistryError, match=r"toy has no alias 'staging'; its aliases: champion"):
        versions.resolve(ws, "toy@staging")
    with pytest.raises(versions.RegistryError, match=r"toy has no version 9"):
        versions.promote(ws, "toy", "9")
    with pytest.raises(versions.RegistryError, match=r"unknown model 'nobody'"):
        versions.rollback(ws, "nobody")


def test_a_registered_model_loads_after_its_checkpoint_folder_is_gone(trainflow_home, tmp_path):
    ws = workspace()
    folder = make_checkpoint(tmp_path / "run" / "checkpoint", seed=3)
    register(ws, folder, 0.8)
    expected = load_checkpoint(folder).predict_proba(FRAME)
    shutil.rmtree(tmp_path / "run")
    for uri in ("toy", "toy@champion", "toy/1", "models:/toy@champion", "models:/toy/1"):
        model = versions.load_model(uri, ws)
        np.testing.assert_allclose(model.predict_proba(FRAME), expected, rtol=1e-6)
        assert model.version == "1"


def _registered_copy(ws, name="toy", version="1"):
    mv = store.client(ws).get_model_version(name, version)
    return versions.local_checkpoint(ws, mv), mv


def test_an_altered_or_missing_checkpoint_file_is_refused(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c"), 0.8)
    local, mv = _registered_copy(ws)
    recorded = json.loads((local / lineage.HASHES_FILE).read_text())
    assert set(recorded) >= {"model.pt", "model.json", "preprocessor.json", "config.json", "metrics.json"}
    assert json.loads(mv.tags[lineage.HASHES_TAG]) == recorded

    # The local copy altered: refused, naming the file.
    spec = json.loads((local / "model.json").read_text())
    (local / "model.json").write_text(json.dumps({**spec, "dropout": 0.5}))
    with pytest.raises(lineage.IntegrityError, match=r"toy version 1: model.json in .* differs"):
        versions.load_model("toy/1", ws)
    # The registry's own copy altered: a fresh download is refused too.
    shutil.rmtree(local)
    stored = Path(urlparse(mv.source).path)
    assert stored.is_relative_to(ws.artifacts)
    with open(stored / "model.pt", "ab") as f:
        f.write(b"\0")
    with pytest.raises(lineage.IntegrityError, match=r"model.pt in .* differs"):
        versions.load_model("toy@champion", ws)
    shutil.rmtree(ws.home / "models")
    (stored / "preprocessor.json").unlink()
    with pytest.raises(lineage.IntegrityError, match=r"preprocessor.json is missing"):
        versions.load_model("toy/1", ws)


def test_a_registry_that_mlflow_tracking_uri_names_keeps_artifacts_beside_its_database(
    trainflow_home, tmp_path, monkeypatch
):
    # A SQLite file of the user's own, named by MLFLOW_TRACKING_URI, and a run started from
    # another folder: MLflow's default would put the artifacts in that folder's ./mlruns.
    db = tmp_path / "registry" / "mlflow.db"
    db.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    reg = register(workspace(), make_checkpoint(tmp_path / "c1"), 0.8)
    assert reg.version == "1"
    assert list((db.parent / "mlartifacts").rglob("model.pt"))
    assert not (elsewhere / "mlruns").exists()
    assert versions.load_model("toy/1").version == "1"  # and loads from there


def test_weights_load_with_weights_only(tmp_path):
    import torch

    folder = make_checkpoint(tmp_path / "c")
    # A model.pt that pickles an arbitrary object (here a pandas frame) is refused.
    torch.save({"weights": FRAME}, tmp_path / "c" / "model.pt")
    with pytest.raises(pickle.UnpicklingError, match="[Ww]eights only load failed"):
        load_checkpoint(folder)


def _register_in_a_process(args):
    home, folder, accuracy = args
    import os

    os.environ["TRAINFLOW_HOME"] = home
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    reg = register(workspace(), folder, accuracy, name="par")
    return reg.version, reg.run_id


@pytest.mark.slow  # four processes, each importing torch and MLflow
def test_parallel_registrations_get_distinct_versions_and_none_is_lost(trainflow_home, tmp_path):
    # Four processes at once, each importing torch and MLflow first (seconds of CPU each):
    # enough to make registrations overlap on any machine; more only add start-up time.
    n = 4
    folders = [make_checkpoint(tmp_path / "runs" / f"c{i}", seed=i) for i in range(n)]
    accuracies = [0.6 + 0.04 * i for i in range(n)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(n) as pool:
        jobs = [(str(trainflow_home), f, a) for f, a in zip(folders, accuracies, strict=True)]
        got = pool.map(_register_in_a_process, jobs)
    made = sorted(int(v) for v, _ in got)
    assert made == list(range(1, n + 1)) and len({r for _, r in got}) == n

    ws = workspace()
    c = store.client(ws)
    assert all(mv.status == "READY" for mv in c.search_model_versions("name='par'"))
    assert len(gate.moves(c, "par")) == n
    # Every version loads from the registry's own copy after the run folders are gone.
    shutil.rmtree(tmp_path / "runs")
    for v in made:
        assert versions.load_model(f"par/{v}", ws).predict_proba(FRAME).shape == (3, 2)
    # The gate ran one registration at a time: the champion is the best of them all
    # whichever order they finished in (each later one compared against the best so far).
    best = max(zip(accuracies, got, strict=True))[1][0]
    assert alias_version(c, "champion", "par") == best


def test_a_locked_database_is_retried_and_other_errors_are_not():
    import sqlite3

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert store.retry_locked(flaky) == "done" and len(calls) == 3

    def broken():
        calls.append(1)
        raise sqlite3.OperationalError("no such table: runs")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        store.retry_locked(broken)
    assert len(calls) == 1


def test_decide_for_an_error_metric_wants_it_lower_and_min_value_is_its_ceiling():
    thresholds = RegistryConfig(gate_metric="rmse", min_improvement=1.0, min_value=None)
    lower = gate.decide("rmse", 52.0, 56.0, thresholds, champion_version="1")
    assert lower.passed and "improvement +4.0000 (lower is better) >= 1.0" in lower.reason
    higher = gate.decide("rmse", 57.0, 56.0, thresholds, champion_version="1")
    assert not higher.passed and "improvement -1.0000 (lower is better) < 1.0" in higher.reason
    assert not gate.decide("rmse", 55.5, 56.0, thresholds, champion_version="1").passed  # by less than 1.0
    # Without a bound, the first model is champion whatever its error.
    assert gate.decide("rmse", 1e6, None, thresholds).passed
    ceiling = RegistryConfig(gate_metric="rmse", min_value=60.0)
    refused = gate.decide("rmse", 61.0, None, ceiling)
    assert not refused.passed and refused.reason == "rmse 61.0000 is above the ceiling min_value 60.0"
    assert gate.decide("rmse", 59.0, None, ceiling).passed
    # r2 is better higher, as accuracy is.
    assert not gate.decide("r2", 0.3, 0.4, RegistryConfig(gate_metric="r2", min_value=None)).passed


def test_the_regression_gate_promotes_a_lower_rmse_and_refuses_a_higher_one(trainflow_home, tmp_path):
    ws = workspace()
    pre = Preprocessor(
        ["a", "b"], "y", [], scaler="none", objective="regression", label_offset=150.0, label_scale=70.0
    )
    thresholds = RegistryConfig(gate_metric="rmse", min_value=None)

    def register_rmse(rmse: float, seed: int) -> registration.Registration:
        return registration.register_checkpoint(
            ws,
            name="risk",
            checkpoint_dir=make_checkpoint(tmp_path / f"c{seed}", seed=seed, pre=pre),
            params={},
            metrics={"rmse": rmse, "mae": rmse * 0.8, "r2": 0.4},
            history=[{"epoch": 1, "train_loss": 0.9}],
            tags={lineage.TEST_FINGERPRINT_TAG: "test-a"},
            gate=thresholds,
        )

    assert register_rmse(60.0, 0).champion  # the first, whatever its error: no bound set
    higher = register_rmse(61.0, 1)
    assert not higher.champion and higher.aliases == ["challenger"]
    assert "improvement -1.0000 (lower is better) < 0.0" in higher.decision.reason
    lower = register_rmse(52.0, 2)
    assert lower.champion and "improvement +8.0000 (lower is better) >= 0.0" in lower.decision.reason
    # The champion loads as a regression, answering numbers in the label's units.
    model = versions.load_model("risk@champion", ws)
    assert model.version == "3" and model.objective == "regression"
    assert model.predict(pd.DataFrame({"a": [0.0, 1.0], "b": [1.0, 0.0]})).dtype == np.float64


# --- the gate's lease (store.model_lease): one holder at a time, a crashed holder's lease
# taken over after lease_s, a holder stalled past it told so before it moves an alias. Holders
# are real processes on the embedded registry; tests/e2e/test_team_gate.py races them on an
# MLflow server.


# Takes the lease on "toy", says so, then waits for a line on stdin before its fencing
# check, whose outcome it prints.
HOLDER = """\
import sys
from trainflow.pipelines.registry.store import LeaseLost, client, model_lease
from trainflow.workspace import workspace

ws = workspace()
with model_lease(client(ws), ws, "toy", lease_s=float(sys.argv[1])) as held:
    print("HOLDING", held.ticket, flush=True)
    sys.stdin.readline()
    try:
        held.verify()
        print("STILL HOLDING", flush=True)
    except LeaseLost as e:
        print("LOST", e, flush=True)
"""


def holder(lease_s: float) -> tuple[subprocess.Popen, str]:
    """A process holding the lease on "toy", and its ticket."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lease_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    assert line.startswith("HOLDING "), line + proc.stderr.read()
    return proc, line.split()[1]


@contextlib.contextmanager
def lease_taken(c, ws, lease_s: float, timeout: float = 120) -> Iterator[store.Lease]:
    """The lease on "toy", taken in a thread (a hung wait fails the test instead of
    hanging the suite) and held until the block ends."""
    held: list = []
    got, release = threading.Event(), threading.Event()

    def take() -> None:
        with store.model_lease(c, ws, "toy", lease_s) as mine:
            held.append(mine)
            got.set()
            release.wait(timeout)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert got.wait(timeout), "the lease was never handed over"
    try:
        yield held[0]
    finally:
        release.set()
        taker.join(60)


def ticket_state(c, ticket: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version("toy" + store.QUEUE_SUFFIX, ticket).tags[store.STATE]
    except MlflowException:
        return None  # cleared from the queue


def test_one_holder_at_a_time_and_a_live_holder_keeps_its_lease_past_lease_s(trainflow_home):
    ws = workspace()
    c = store.client(ws)
    inside: list[str] = []
    overlap = threading.Event()

    def hold(i: int) -> None:
        with store.model_lease(c, ws, "toy", lease_s=0.8):
            if inside:
                overlap.set()
            inside.append(str(i))
            threading.Event().wait(2.0)  # longer than lease_s: only the beat keeps it
            inside.remove(str(i))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not overlap.is_set(), "two holders at once"
    queue = c.get_registered_model("toy" + store.QUEUE_SUFFIX)
    assert store.is_queue(queue.tags)
    tickets = c.search_model_versions("name='toy.trainflow-gate'")
    assert {t.tags[store.STATE] for t in tickets} == {store.RELEASED}
    assert len(tickets) == 1, "done tickets below a holder's are cleared"


def test_a_crashed_holders_lease_is_taken_over_after_lease_s(trainflow_home, caplog):
    ws = workspace()
    c = store.client(ws)
    proc, crashed = holder(lease_s=1.0)
    proc.kill()
    proc.wait()
    with caplog.at_level(logging.WARNING, logger="trainflow"), lease_taken(c, ws, lease_s=1.0) as mine:
        assert int(mine.ticket) > int(crashed)
        assert ticket_state(c, crashed) == store.EXPIRED
    assert f"pid {proc.pid}) has not been renewed for 1 s: taken as crashed" in caplog.text


def test_a_holder_stalled_past_its_lease_learns_it_lost_it_before_it_moves_an_alias(trainflow_home):
    ws = workspace()
    c = store.client(ws)
    proc, stalled = holder(lease_s=1.0)
    os.kill(proc.pid, signal.SIGSTOP)  # a holder that stops beating without dying
    try:
        with lease_taken(c, ws, lease_s=1.0) as mine:
            mine.verify()  # the new holder holds
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    assert proc.returncode == 0, err
    assert (
        "LOST the gate's lease on toy was lost: this run stalled for longer than registry.lease_s (1 s)"
        in out
    )
    assert ticket_state(c, stalled) in (store.EXPIRED, store.RELEASED, None)


def test_promote_waits_for_the_lease_and_the_queue_is_no_model_of_the_users(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8)
    register(ws, make_checkpoint(tmp_path / "c2"), 0.7)
    c = store.client(ws)
    done = threading.Event()
    with lease_taken(c, ws, lease_s=30):
        threading.Thread(target=lambda: (versions.promote(ws, "toy", "2"), done.set()), daemon=True).start()
        assert not done.wait(1.5), "promote moved the champion while another process held the lease"
        assert str(c.get_model_version_by_alias("toy", "champion").version) == "1"
    assert done.wait(60)
    assert str(c.get_model_version_by_alias("toy", "champion").version) == "2"
    with pytest.raises(versions.RegistryError, match="unknown model 'nope'; registered models: toy$"):
        versions.rollback(ws, "nope")
