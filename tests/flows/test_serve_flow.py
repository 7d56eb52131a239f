"""Serving as a Prefect flow, for real: the flow run serves a registered model over HTTP
on Ray Serve (the session's cluster) while a client asks it, then stops on its own."""

import threading
import time

import httpx
import pandas as pd
import pytest

from tests.pipelines.test_registry import make_checkpoint, register
from tests.pipelines.test_serving import _free_port
from tests.web import POLL_TIMEOUT_S, TIMEOUT_S, http
from trainflow.flows.serving import serve_model
from trainflow.pipelines.data.preprocess import Preprocessor
from trainflow.pipelines.registry import versions
from trainflow.pipelines.serving import APP_NAME
from trainflow.workspace import workspace

pytestmark = pytest.mark.slow


def test_the_serving_flow_answers_while_it_runs_and_stops(
    ray_cluster, prefect_harness, trainflow_home, tmp_path
):
    from ray import serve

    # A Serve that a test before left on the session's cluster keeps its own port, and the
    # flow's would be ignored: start from none, as the serving tests do (tests/web.py).
    serve.shutdown()
    pre = Preprocessor(["a", "b"], "label", ["no", "yes"], scaler="none")
    register(workspace(), make_checkpoint(tmp_path / "c1", pre=pre), 0.8)  # toy v1, champion
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    answers: list[dict] = []

    def client() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if http.get(f"{url}/healthz", timeout=POLL_TIMEOUT_S).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        answers.append(http.post(f"{url}/predict", json={"rows": [{"a": 1.0, "b": 0.0}]}).json())

    asking = threading.Thread(target=client, daemon=True)
    asking.start()
    try:
        state = serve_model(model="toy@champion", port=port, replicas=1, cpus_per_replica=0.25,
                            stop_after_s=3.0, return_state=True)  # fmt: skip
        applications = serve.status().applications  # before the test's own shutdown below
    finally:
        serve.shutdown()  # the session's cluster keeps Serve otherwise; later modules start their own
    asking.join(TIMEOUT_S)
    assert state.is_completed(), state.message
    assert state.result() == url
    (answer,) = answers
    expected = versions.load_model("toy/1").predict(pd.DataFrame({"a": [1.0], "b": [0.0]}))
    assert (answer["model"], answer["version"], answer["predictions"]) == ("toy", "1", expected.tolist())
    assert APP_NAME not in applications  # stopped: the flow took its application down


def test_an_unknown_model_fails_the_flow_in_one_line_before_ray_serve_starts(prefect_harness, trainflow_home):
    state = serve_model(model="nosuch@champion", port=_free_port(), return_state=True)
    assert state.is_failed()
    assert "nosuch" in state.message and "\n" not in state.message.strip()
