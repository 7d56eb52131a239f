"""The shadow comparison's ledger and what reads it, on its own (no Serve):
tests/pipelines/test_serving.py shadows a challenger behind a real endpoint."""

import json

import pytest

from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.registry.versions import RegistryError
from trainflow.pipelines.serving import shadow
from trainflow.workspace import Workspace


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path)


def ledger(ws, model="toy"):
    return shadow.ShadowLedger(model, str(shadow.shadow_file(ws, model)))


def test_agreement_latency_and_feedback_of_a_classifier(ws):
    book = ledger(ws)
    book.record(("1", "2"), "classification", [("a", ["yes", "no"], ["yes", "yes"])], ([0.004], 0.006))
    both = [("b", ["no"], ["no"]), ("c", ["yes"], ["yes"])]
    book.record(("1", "2"), "classification", both, ([0.001, 0.001], 0.003))
    (pair,) = book.summary()["pairs"]
    assert (pair["requests"], pair["rows"], pair["agreement"]) == (3, 4, 0.75)
    # Per request: the champion's 4, 1 and 1 ms; the challenger's 6, then 3 and 3.
    assert pair["latency_ms"]["champion"] == {"p50": 1.0, "p95": 3.7, "requests": 3}
    assert pair["latency_ms"]["challenger"] == {"p50": 3.0, "p95": 5.7, "requests": 3}

    # "a" was answered yes/no by the champion and yes/yes by the challenger; truth: yes/yes.
    scored = book.feedback("a", ["yes", "yes"])
    assert scored["feedback"] == {
        "rows": 2, "metric": "accuracy", "champion": 0.5, "challenger": 1.0, "challenger_wins": True
    }  # fmt: skip
    assert "one per row" in book.feedback("b", ["no", "no"])
    assert "no shadowed answer 'zzz'" in book.feedback("zzz", ["no"])


def test_a_regression_differs_by_numbers_and_feedback_is_its_error(ws):
    book = ledger(ws)
    book.record(("3", "4"), "regression", [("r", [1.0, 2.0], [1.5, 2.0])], ([0.001], 0.001))
    (pair,) = book.summary()["pairs"]
    assert pair["mean_abs_difference"] == 0.25 and pair["max_abs_difference"] == 0.5
    assert "agreement" not in pair
    fb = book.feedback("r", [1.0, 2.5])["feedback"]
    assert (fb["metric"], fb["champion"], fb["challenger"], fb["challenger_wins"]) == (
        "mae",
        0.25,
        0.5,
        False,
    )
    assert "are numbers" in book.feedback("r", ["a", "b"])


def test_each_pair_of_versions_is_its_own_and_the_latest_comes_first(ws):
    book = ledger(ws)
    book.record(("1", "2"), "classification", [("a", [0], [0])], ([0.001], 0.001))
    book.missed(("1", "3"), "classification", not_shadowed=2, errors=1)
    first, second = book.summary()["pairs"]
    assert (first["challenger"], first["not_shadowed"], first["errors"], first["rows"]) == ("3", 2, 1, 0)
    assert (second["challenger"], second["rows"], second["agreement"]) == ("2", 1, 1.0)


def test_saved_comparison_is_what_reports_and_promotions_read(ws):
    book = ledger(ws)
    with pytest.raises(DataError, match="--shadow challenger"):
        shadow.read_shadow(ws, "toy")
    answers = [(str(i), [i % 2], [0]) for i in range(10)]  # agree on the 5 even rows
    book.record(("1", "2"), "classification", answers, ([0.001] * 10, 0.002))
    book.save()
    saved = shadow.read_shadow(ws, "toy")
    assert saved == json.loads(json.dumps(book.summary()))
    assert "| 1 | 2 | 10 | 10 | 50.0% |" in shadow.summary_markdown(saved)

    assert "agreed on 50.0% of 10 rows" in shadow.require_shadow(
        ws, "toy", "1", "2", min_agreement=0.5, feedback_win=False
    )
    with pytest.raises(
        RegistryError, match=r"agreed with champion 1 on 50.0% of 10 rows, below --min-agreement 0.9"
    ):
        shadow.require_shadow(ws, "toy", "1", "2", min_agreement=0.9, feedback_win=False)
    with pytest.raises(RegistryError, match="--feedback-win: .*no labels"):
        shadow.require_shadow(ws, "toy", "1", "2", min_agreement=None, feedback_win=True)
    with pytest.raises(RegistryError, match="version 3 was not shadowed beside champion version 1"):
        shadow.require_shadow(ws, "toy", "1", "3", min_agreement=0.5, feedback_win=False)

    book.feedback("1", [0])  # the challenger's 0 is right, the champion's 1 wrong
    book.save()
    assert "won on 1 labelled rows" in shadow.require_shadow(
        ws, "toy", "1", "2", min_agreement=None, feedback_win=True
    )
