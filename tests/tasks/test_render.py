"""The one renderer: the lines a user reads, from the result models."""

from trainflow.pipelines.registry.versions import VersionSummary, move_line, versions_lines
from trainflow.tasks import render
from trainflow.tasks.results import PipelineResult, Registered, SweepResult

REGISTERED = Registered(
    name="digits",
    version="1",
    aliases=["champion"],
    run_id="r1",
    champion=True,
    decision={"reason": "no champion yet; accuracy 0.9861 clears min_value 0.9"},
    source="file:///x/checkpoint",
)
METRICS = {"accuracy": 0.98611, "macro_f1": 0.98621, "weighted_f1": 0.98619}
TIMINGS = {"ingest": 0.01, "preprocess": 0.02, "train": 13.1, "evaluate": 0.6, "register": 0.24}


def result(**changes) -> PipelineResult:
    fields = dict(
        name="digits",
        config_hash="abc",
        test_metrics=METRICS,
        registered=REGISTERED,
        checkpoint="/runs/digits-1/checkpoint_1",
        prepared_reused=False,
        timings=TIMINGS,
    )
    return PipelineResult(**{**fields, **changes})


def test_the_run_summary_is_the_block_the_readme_quotes():
    assert render.summary_lines(result()) == [
        "model       digits version 1 -> champion",
        "gate        no champion yet; accuracy 0.9861 clears min_value 0.9",
        "test        accuracy 0.9861, macro_f1 0.9862, weighted_f1 0.9862",
        "checkpoint  /runs/digits-1/checkpoint_1",
        "steps       ingest 0.0s, preprocess 0.0s, train 13.1s, evaluate 0.6s, register 0.2s (total 14.0s)",
        'load it     trainflow.load_model("digits@champion") or "digits/1"',
    ]


def test_the_summary_gives_the_commands_whole_time_beside_the_steps():
    steps = render.summary_lines(result(), wall_s=27.46)[4]
    assert steps.endswith("register 0.2s (total 14.0s; 27.5s with start-up)")


def test_the_summary_says_what_the_cache_answered_before_the_steps():
    cached = render.summary_lines(result(cached=["ingest", "preprocess"], prepared_reused=True))
    assert cached[4] == "cache       ingest, preprocess skipped: same data and config as an earlier run"
    assert cached[5].startswith("steps       ")
    reused = render.summary_lines(result(prepared_reused=True))
    assert reused[4] == "cache       prepared splits reused (same data, split and preprocessing)"


def test_a_challenger_says_the_champion_is_unchanged():
    lost = REGISTERED.model_copy(update={"champion": False, "decision": {"reason": "below"}})
    lines = render.summary_lines(result(registered=lost))
    assert lines[0] == "model       digits version 1 -> challenger (champion unchanged)"
    # Not the champion (there may be none): loaded by its version, not by the alias.
    assert lines[-1] == 'load it     trainflow.load_model("digits/1")'
    assert render.summary_line(result(registered=lost)) == (
        "digits v1 test accuracy 0.9861, champion unchanged"
    )


def trial(trial_id, status, best, lr, error=""):
    return {
        "trial_id": trial_id,
        "params": {"train.lr": lr, "model.kind": "mlp"},
        "status": status,
        "epochs": 3 if best is not None else 0,
        "max_epochs": 3,
        "best": best,
        "best_epoch": 3 if best is not None else None,
        "error": error,
    }


SWEEP = SweepResult(
    name="digits",
    sweep="digits-sweep-1",
    trials=[
        trial("a1", "completed", 0.91234, 0.0123456),
        trial("a2", "failed", None, 0.5, error="ValueError: boom"),
    ],
    best_trial="a1",
    best_config_path="/runs/best-config.yaml",
    max_concurrent=2,
    test_metrics=METRICS,
    registered=REGISTERED,
    checkpoint="/runs/a1/checkpoint",
    timings=TIMINGS,
)


def test_the_sweep_table_lines_up_and_names_failures_and_the_best_trial():
    lines = render.sweep_lines(SWEEP, "val_accuracy", also_written=None)
    assert lines[:3] == [
        "trial  status     epochs  val_accuracy  params",
        "a1     completed  3/3     0.9123        train.lr=0.01235, model.kind=mlp",
        "a2     failed     0/3     -             train.lr=0.5, model.kind=mlp",
    ]
    assert lines[3] == "failed      a2: ValueError: boom"
    assert "best        trial a1; its config: /runs/best-config.yaml" in lines
    assert "concurrency 2 trials at a time" in lines
    assert "model       digits version 1 -> champion" in lines


def test_every_sweep_rendering_shows_a_trial_s_settings_alike():
    markdown = render.sweep_markdown(SWEEP, "val_accuracy", "train: {lr: 0.0123456}\n")
    rows = render.trial_rows("val_accuracy", SWEEP.trials)
    assert "| a1 | completed | 3/3 | 0.9123 | train.lr=0.01235, model.kind=mlp |  |" in markdown
    assert rows[0]["train.lr"] == "0.01235" and rows[0]["val_accuracy"] == 0.9123
    assert rows[1]["val_accuracy"] is None and rows[1]["error"] == "ValueError: boom"


def test_the_models_listing_and_alias_moves():
    versions = [
        VersionSummary("1", [], {"test_accuracy": 0.9}, True, 0),
        VersionSummary("2", ["champion"], {"test_accuracy": 0.95, "test_macro_f1": 0.94}, None, 60_000),
    ]
    assert versions_lines(versions) == [
        "version  aliases   accuracy  macro_f1  gate    created (UTC)",
        "1        -         0.9000    -         passed  1970-01-01 00:00",
        "2        champion  0.9500    0.9400    -       1970-01-01 00:01",
    ]
    promoted = {"action": "promote", "version": "2", "previous": "1"}
    assert move_line("digits", promoted) == "digits: champion -> v2 (was v1)"
    back = {"action": "rollback", "version": "1", "previous": "2"}
    assert move_line("digits", back) == "digits: champion -> v1 (rolled back from v2)"
