"""The HTTP endpoint on Ray Serve, for real: the session's Ray cluster, Serve on loopback,
HTTP requests, models registered in a module's registry (checkpoints written directly,
no training). One Serve start for the module; each model an application of its own."""

import base64
import io
import json
import socket
import sys
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.pipelines.test_registry import make_checkpoint, register
from tests.web import TIMEOUT_S, http, start_serve
from trainflow.config import ModelConfig
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.registry import versions
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow  # Ray Serve's controller, proxy and replicas

POLL_S = 0.5  # the test apps' poll interval; the default is serving.POLL_INTERVAL_S
# How long a replica may take to follow a moved alias here: a poll, then loading the new
# version, on a busy host beside the test's own clients.
FOLLOW_S = 60.0
IMAGE = {"shape": [1, 8, 8], "mean": [0.5], "std": [0.25], "augment": False}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(ray_cluster, module_trainflow_home, tmp_path_factory):
    """Serve's URL with six applications: /toy follows toy's champion (a table of a
    numeric column a and a categorical column c), /pinned serves toy/1, /img an image
    model, /reg a regression, /own a user's model, /shadowed toy/1 with toy's challenger
    (v2) shadowing it."""
    from ray import serve

    from trainflow.pipelines.serving import QUIET_LOGS, ServeSettings, app

    ws = workspace()
    tmp = tmp_path_factory.mktemp("serving")
    toy = Preprocessor(["a"], "label", ["no", "yes"], scaler="none", categorical={"c": ["x", "y"]})
    register(ws, make_checkpoint(tmp / "t1", seed=1, pre=toy), 0.8)  # v1: champion
    register(ws, make_checkpoint(tmp / "t2", seed=2, pre=toy), 0.7)  # v2: challenger
    img = Preprocessor([], "label", ["circle", "square"], scaler="none", image=IMAGE)
    register(ws, make_checkpoint(tmp / "i1", seed=3, pre=img), 0.8, name="shapes")
    reg = Preprocessor(["a", "b"], "target", [], scaler="none", objective="regression", label_offset=150.0)
    register(ws, make_checkpoint(tmp / "r1", seed=4, pre=reg), 0.8, name="diabetes")
    # A user's model, whose module only this driver has (the session's workers do not).
    (tmp / "code").mkdir()
    (tmp / "code" / "serving_user_net.py").write_text(USER_NET)
    driver_path = pytest.MonkeyPatch()
    driver_path.syspath_prepend(str(tmp / "code"))
    own = ModelConfig(kind="serving_user_net:build")
    register(ws, make_checkpoint(tmp / "o1", seed=5, model=own), 0.8, name="own")

    port = _free_port()
    start_serve(port)
    small = ServeSettings(max_rows=100, max_body_bytes=64 << 10, poll_interval_s=POLL_S)
    # The regression app scales with the load (Serve's autoscaling), between 1 and 2 replicas.
    apps = [
        ("toy", "toy", None, None),
        ("pinned", "toy/1", None, None),
        ("img", "shapes", None, None),
        ("reg", "diabetes", 2, None),
        ("own", "own", None, None),
        ("shadowed", "toy/1", None, "challenger"),  # toy/1 answers; toy's challenger (v2) shadows it
    ]
    targets = [
        serve.RunTarget(
            app(model, max_replicas=most, cpus_per_replica=0.2, settings=small, shadow=shadow),
            name,
            f"/{name}",
            QUIET_LOGS,
        )
        for name, model, most, shadow in apps
    ]
    serve.run_many(targets)  # side by side: one deployment's start-up is seconds
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        driver_path.undo()
        sys.modules.pop("serving_user_net", None)


USER_NET = """
from torch import nn


def build(input_shape, num_outputs):
    return nn.Sequential(nn.Linear(input_shape[0], 6), nn.Tanh(), nn.Linear(6, num_outputs))
"""


ROWS = [{"a": 0.5, "c": "x"}, {"a": -3.0, "c": "y"}, {"a": 10.0, "c": "never seen"}, {"a": 2, "c": None}]


def test_rows_and_columns_answer_as_load_model_does(server):
    r = http.post(f"{server}/toy/predict", json={"rows": ROWS})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == "toy" and answer["classes"] == ["no", "yes"]
    model = versions.load_model(f"toy/{answer['version']}")
    frame = pd.DataFrame(ROWS)
    assert answer["predictions"] == model.predict(frame).tolist()
    np.testing.assert_allclose(answer["probabilities"], model.predict_proba(frame), rtol=1e-5)

    columns = {"a": [r["a"] for r in ROWS], "c": [r["c"] for r in ROWS]}
    by_columns = http.post(f"{server}/toy/predict", json={"columns": columns}).json()
    assert by_columns["predictions"] == answer["predictions"]


def test_a_users_model_is_served_by_replicas_that_get_its_module(server):
    rows = [{"a": 0.5, "b": 1.0}, {"a": -3.0, "b": 2.0}]
    r = http.post(f"{server}/own/predict", json={"rows": rows})
    assert r.status_code == 200, r.text
    model = versions.load_model("own/1")  # here, from the driver's path
    np.testing.assert_allclose(r.json()["probabilities"], model.predict_proba(pd.DataFrame(rows)), rtol=1e-5)


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(server):
    """Requests that arrive together go through the model in one pass; each answer holds
    the predictions for its own rows, in its own order."""
    model = versions.load_model("toy/1")
    rows = [{"a": float(i) - 20, "c": "xy"[i % 2]} for i in range(40)]
    expected = model.predict(pd.DataFrame(rows)).tolist()
    results = {}

    def ask(i):
        results[i] = http.post(f"{server}/pinned/predict", json={"rows": rows[i : i + 2]}).json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(0, 40, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p for i in sorted(results) for p in results[i]["predictions"]] == expected


def test_model_healthz_and_docs(server):
    info = http.get(f"{server}/toy/model").json()
    assert info["name"] == "toy" and info["alias"] == "champion" and info["objective"] == "classification"
    assert info["task"] == "classification"  # the old name, for clients of an earlier release
    assert info["input_columns"] == ["a", "c"] and info["classes"] == ["no", "yes"]
    assert info["gate"]["passed"] is True and info["metrics"]["test_accuracy"] == 0.8
    assert info["limits"] == {"max_rows": 100, "max_body_bytes": 64 << 10}
    assert info["poll_interval_s"] == POLL_S and info["follow_error"] is None
    pinned = http.get(f"{server}/pinned/model").json()
    assert pinned["alias"] is None and pinned["version"] == "1" and pinned["poll_interval_s"] is None
    assert http.get(f"{server}/img/model").json()["image"] == {"shape": [1, 8, 8], "input": "images"}
    assert http.get(f"{server}/toy/healthz").json()["status"] == "ok"
    assert http.get(f"{server}/toy/docs").status_code == 200
    assert "/predict" in http.get(f"{server}/toy/openapi.json").json()["paths"]


def test_a_regression_answers_numbers(server):
    rows = [{"a": 1.0, "b": 2.0}, {"a": -1.5, "b": 0.25}]
    answer = http.post(f"{server}/reg/predict", json={"rows": rows}).json()
    assert set(answer) == {"model", "version", "predictions"}
    assert all(isinstance(p, float) for p in answer["predictions"])
    expected = versions.load_model("diabetes/1").predict(pd.DataFrame(rows))
    np.testing.assert_allclose(answer["predictions"], expected, rtol=1e-5)


def _png(pixels: np.ndarray) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_images_as_png_and_as_arrays_answer_as_load_model_does(server):
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    larger = rng.integers(0, 256, (16, 12), dtype=np.uint8)  # resized as the folder's images were
    rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)  # converted to L as the folder's were
    images = [_png(gray), gray.tolist(), _png(larger), _png(rgb)]
    answer = http.post(f"{server}/img/predict", json={"images": images}).json()
    from PIL import Image

    as_read = [gray, gray, larger, np.asarray(Image.fromarray(rgb).convert("L"))]
    model = versions.load_model("shapes/1")
    frame = {"image": as_read}
    assert answer["predictions"] == model.predict(frame).tolist()
    np.testing.assert_allclose(answer["probabilities"], model.predict_proba(frame), rtol=1e-5)


GOOD = {"rows": [{"a": 1.0, "c": "x"}]}
BAD = [
    ("toy", b"", 400, "body"),
    ("toy", b"{not json", 400, "body"),
    ("toy", b"[1, 2]", 400, "body"),
    ("toy", b'{"rows": [{"a": NaN, "c": "x"}]}', 400, "body"),
    ("toy", {}, 422, "body"),
    ("toy", {"rows": [{"a": 1.0}]}, 422, "rows[0].c"),
    ("toy", {"rows": [{"a": 1.0, "c": "x"}, {"a": 1.0, "c": "x", "d": 3}]}, 422, "rows[1].d"),
    ("toy", {"rows": [{"a": "1.5", "c": "x"}]}, 422, "rows[0].a"),
    ("toy", {"rows": [{"a": True, "c": "x"}]}, 422, "rows[0].a"),
    ("toy", {"rows": [{"a": None, "c": "x"}]}, 422, "rows[0].a"),
    ("toy", {"rows": [{"a": 1.0, "c": "x"}, {"a": 10**400, "c": "x"}]}, 422, "rows[1].a"),
    ("toy", {"rows": [{"a": 1.0, "c": ["x"]}]}, 422, "rows[0].c"),
    ("toy", {"rows": ["a row"]}, 422, "rows[0]"),
    ("toy", {"rows": []}, 422, "rows"),
    ("toy", {"rows": {"a": 1}}, 422, "rows"),
    ("toy", {"columns": {"a": [1.0, 2.0], "c": ["x"]}}, 422, "columns.c"),
    ("toy", {"columns": {"a": [1.0, "two"], "c": ["x", "y"]}}, 422, "columns.a[1]"),
    ("toy", {"columns": {"a": [1.0]}}, 422, "columns.c"),
    ("toy", {**GOOD, "model": "other"}, 422, "model"),
    ("toy", {**GOOD, "columns": {"a": [1.0], "c": ["x"]}}, 422, "body"),
    ("toy", {"images": [[[0]]]}, 422, "images"),
    ("toy", {"rows": [{"a": 1.0, "c": "x"}] * 101}, 413, "rows"),
    ("toy", {"rows": [{"a": 1.0, "c": "x" * (70 << 10)}]}, 413, "body"),
    ("img", {"images": ["not base64!"]}, 422, "images[0]"),
    ("img", {"images": [base64.b64encode(b"no image here").decode()]}, 422, "images[0]"),
    ("img", {"images": [[[1, 2], [3]]]}, 422, "images[0]"),
    ("img", {"images": [[[300, 0], [0, 0]]]}, 422, "images[0]"),
    ("img", {"images": [[[1.5, 0], [0, 0]]]}, 422, "images[0]"),
    ("img", {"images": [np.zeros((2, 2, 3), dtype=int).tolist()]}, 422, "images[0]"),
    ("img", {"images": [42]}, 422, "images[0]"),
    ("img", GOOD, 422, "rows"),
    ("reg", {"rows": [{"a": 1.0, "b": float("inf")}]}, 400, "body"),  # Infinity is not JSON
]


@pytest.mark.parametrize("app_name,body,status,field", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_request_gets_its_4xx_naming_the_field(server, app_name, body, status, field):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(
        f"{server}/{app_name}/predict", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == status, r.text
    error = r.json()
    assert error["field"] == field and error["error"].startswith(f"{field}: "), error
    # The replica lives on and answers.
    assert http.post(f"{server}/toy/predict", json=GOOD).status_code == 200


def test_the_app_follows_champion_as_it_moves_without_dropping_a_request(server):
    """A bounded client loop runs while toy's champion moves to v2 (promote) and back to
    v1 (rollback): every request answered, versions switching after a poll interval and a
    load of the new version, in order; the pinned app stays on v1."""
    ws = workspace()
    assert http.get(f"{server}/toy/model").json()["version"] == "1"
    # Each client's answers in the order it got them: a client sends its next request
    # once the last one is answered. Across clients, answers around a switch arrive in
    # any order (requests in flight, threads taking turns), so order holds per client.
    by_client: list[list[tuple[float, int, str | None]]] = [[] for _ in range(3)]  # (time, status, version)
    moved: dict[str, float] = {}

    def client(answers, n):
        with httpx.Client(timeout=TIMEOUT_S) as c:
            for _ in range(n):
                r = c.post(f"{server}/toy/predict", json=GOOD)
                answers.append((time.monotonic(), r.status_code, r.json().get("version")))

    threads = [threading.Thread(target=client, args=(answers, 100)) for answers in by_client]
    for t in threads:
        t.start()
    time.sleep(0.5)
    moved["promote"] = time.monotonic()
    versions.promote(ws, "toy", "2")
    deadline = time.monotonic() + FOLLOW_S
    while http.get(f"{server}/toy/model").json()["version"] != "2" and time.monotonic() < deadline:
        time.sleep(0.1)
    moved["rollback"] = time.monotonic()
    versions.rollback(ws, "toy")
    for t in threads:
        t.join()

    answers = [a for client_answers in by_client for a in client_answers]
    assert len(answers) == 300 and {status for _, status, _ in answers} == {200}
    for client_answers in by_client:
        # In order: v1, then v2, then v1 again if the rollback was followed before the loop's end.
        seen = [v for _, _, v in client_answers]
        runs = [v for i, v in enumerate(seen) if i == 0 or seen[i - 1] != v]
        assert runs in (["1"], ["1", "2"], ["1", "2", "1"]), runs
    assert any(v == "2" for _, _, v in answers)
    first_v2 = min(t for t, _, v in answers if v == "2")
    assert first_v2 - moved["promote"] < FOLLOW_S
    # The rollback's switch may come after the loop's last request: /model says it.
    deadline = time.monotonic() + FOLLOW_S
    while http.get(f"{server}/toy/model").json()["version"] != "1":
        assert time.monotonic() < deadline, "the rollback was not followed"
        time.sleep(0.1)
    assert http.post(f"{server}/pinned/predict", json=GOOD).json()["version"] == "1"
    predicted = http.post(f"{server}/toy/predict", json={"rows": ROWS}).json()
    assert predicted["predictions"] == versions.load_model("toy/1").predict(pd.DataFrame(ROWS)).tolist()


def test_an_alias_moved_to_a_model_from_another_module_keeps_the_served_version(
    server, tmp_path, monkeypatch
):
    """The replicas carry the module of the version served at start: a champion built
    from another module cannot load there, so they keep answering with the old version
    and /model says why and what to do."""
    (tmp_path / "serving_other_net.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))  # this driver has it; the replicas do not
    ws = workspace()
    other = ModelConfig(kind="serving_other_net:build")
    assert register(ws, make_checkpoint(tmp_path / "o2", seed=6, model=other), 0.9, name="own").champion
    deadline = time.monotonic() + FOLLOW_S
    while (info := http.get(f"{server}/own/model").json())["follow_error"] is None:
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    assert info["version"] == "1"
    assert info["follow_error"].startswith(
        "ConfigError: model.kind serving_other_net:build: module 'serving_other_net' is not importable"
    )
    assert info["follow_error"].endswith("restart the server to serve a version built from another module")
    r = http.post(f"{server}/own/predict", json={"rows": [{"a": 0.5, "b": 1.0}]})
    assert r.status_code == 200 and r.json()["version"] == "1"


def test_a_shadowed_challenger_answers_off_the_path_and_its_comparison_gates_a_promotion(
    server, prefect_harness, tmp_path
):
    """/shadowed answers with toy/1 while the challenger (v2) answers the same rows off the
    answer's path: GET /shadow counts both models' answers, POST /feedback scores them,
    the shadow-report flow publishes the comparison, and a promotion asking for more
    agreement than was shown is refused."""
    from tests.commands import trainflow_in_process
    from tests.flows.test_training_pipeline import read_artifacts
    from trainflow.flows.serving import shadow_report

    answers = [http.post(f"{server}/shadowed/predict", json={"rows": ROWS}).json() for _ in range(5)]
    assert {a["version"] for a in answers} == {"1"} and len({a["id"] for a in answers}) == 5
    assert http.get(f"{server}/shadowed/model").json()["shadow"] == {"uri": "toy@challenger"}
    frame = pd.DataFrame(ROWS)
    mine, theirs = (versions.load_model(f"toy/{v}").predict(frame) for v in ("1", "2"))
    agreement = float(np.mean(mine == theirs))

    # The challenger answers on a thread of its own: awaited.
    deadline = time.monotonic() + FOLLOW_S
    while not (pairs := http.get(f"{server}/shadowed/shadow").json()["pairs"]) or pairs[0]["requests"] < 5:
        assert time.monotonic() < deadline, pairs
        time.sleep(0.1)
    pair = pairs[0]
    assert (pair["champion"], pair["challenger"], pair["rows"]) == ("1", "2", 5 * len(ROWS))
    assert pair["agreement"] == pytest.approx(agreement) and pair["errors"] == 0
    assert pair["latency_ms"]["champion"]["p50"] > 0 and pair["latency_ms"]["challenger"]["p50"] > 0

    scored = http.post(
        f"{server}/shadowed/feedback", json={"id": answers[0]["id"], "labels": theirs.tolist()}
    )
    assert scored.status_code == 200, scored.text
    assert scored.json()["feedback"] == {
        "rows": len(ROWS), "metric": "accuracy", "champion": pytest.approx(agreement), "challenger": 1.0,
        "challenger_wins": agreement < 1.0,
    }  # fmt: skip
    unknown = http.post(f"{server}/shadowed/feedback", json={"id": "nope", "labels": ["yes"]})
    assert unknown.status_code == 422 and unknown.json()["field"] == "id"
    unshadowed = http.get(f"{server}/pinned/shadow")
    assert unshadowed.status_code == 404 and "--shadow" in unshadowed.json()["error"]

    # Saved every couple of seconds for the report and for promotions: awaited.
    deadline = time.monotonic() + FOLLOW_S
    while (saved := _saved_pair()) is None or saved["feedback"]["rows"] < len(ROWS):
        assert time.monotonic() < deadline, saved
        time.sleep(0.2)
    assert shadow_report("toy")["pairs"][0]["rows"] == 5 * len(ROWS)
    table = next(a.data for a in read_artifacts() if a.key == "toy-shadow")
    assert f"| 1 | 2 | 5 | {5 * len(ROWS)} | {agreement:.1%} |" in table

    # A promotion that asks for what the comparison did not show is refused; toy's
    # champion stays.
    asks = ["--min-agreement", f"{agreement + 0.01:.4f}"] if agreement < 1.0 else ["--feedback-win"]
    refused = trainflow_in_process("models", "promote", "toy", "2", *asks)
    assert refused.returncode == 2, refused.output
    assert ("below --min-agreement" if agreement < 1.0 else "did not beat champion 1") in refused.output
    assert str(versions.resolve(workspace(), "toy@champion").version) == "1"


def _saved_pair() -> dict | None:
    """The latest pair of toy's saved shadow comparison, once it is saved."""
    path = workspace().home / "serving" / "toy" / "shadow.json"
    return json.loads(path.read_text())["pairs"][0] if path.is_file() else None
