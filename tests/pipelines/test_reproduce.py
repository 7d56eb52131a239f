"""A version's exact config rebuilt from the registry, the lineage a reproduction is checked
against, and the model card, on a real MLflow registry (no Ray: versions of untrained
checkpoints). tests/e2e/test_reproduce.py trains and reproduces one for real."""

import json

import pytest

from tests.pipelines.test_registry import make_checkpoint, register
from trainflow.config import PipelineConfig
from trainflow.pipelines.registry import card, reproduce, versions
from trainflow.pipelines.registry.lineage import CONFIG_HASH_TAG, DATA_FINGERPRINT_TAG, GIT_COMMIT_TAG
from trainflow.workspace import workspace

# The checkpoints of make_checkpoint save the default config.
HASH = PipelineConfig().config_hash()


def lineage(config_hash=HASH, fingerprint="data-1", commit="abc123"):
    return {CONFIG_HASH_TAG: config_hash, DATA_FINGERPRINT_TAG: fingerprint, GIT_COMMIT_TAG: commit}


def test_the_original_is_the_config_its_checkpoint_saved_with_its_lineage_and_test_metrics(
    trainflow_home, tmp_path
):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8, tags=lineage())
    found = reproduce.original(ws, "toy/1")
    assert found.ref == "toy/1" and found.config == PipelineConfig()
    assert (found.data_fingerprint, found.git_commit) == ("data-1", "abc123")
    assert found.metrics == {"accuracy": 0.8, "macro_f1": 0.8}
    assert reproduce.original(ws, "toy@champion").version == "1"  # an alias: the version it points at


def test_a_version_whose_config_cannot_be_rebuilt_exactly_is_refused_in_one_line(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8)  # no lineage tags
    register(ws, make_checkpoint(tmp_path / "c2"), 0.8, tags=lineage(config_hash="0123456789ab"))
    other = make_checkpoint(tmp_path / "c3")
    (tmp_path / "c3" / "config.json").write_text(json.dumps({"train": {"learning_rate": 0.1}}))
    register(ws, other, 0.8, tags=lineage())
    cases = {
        "toy/1": f"toy/1 has no {CONFIG_HASH_TAG} or {DATA_FINGERPRINT_TAG} tag: only a version registered "
        "by trainflow's register step can be reproduced",
        "toy/2": f"toy/2: its checkpoint's config.json hashes {HASH}, not 0123456789ab as registered: the "
        "exact config cannot be rebuilt; reproduce it with the release that trained it",
        "toy/3": "toy/3: its checkpoint's config.json is not a config of this trainflow release "
        "(invalid config: train.learning_rate: unknown key",
    }
    for ref, message in cases.items():
        with pytest.raises(versions.RegistryError) as e:
            reproduce.original(ws, ref)
        assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_changed_data_or_code_is_refused_naming_both_values_unless_forced(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8, tags=lineage())
    found = reproduce.original(ws, "toy/1")
    assert reproduce.check_unchanged(found, "data-1", "abc123", force=False) == []

    with pytest.raises(reproduce.ReproduceRefused) as e:
        reproduce.check_unchanged(found, "data-2", "abc123", force=False)
    assert str(e.value) == (
        "cannot reproduce toy/1: the data of builtin:digits has changed (fingerprint data-1 when toy/1 "
        "was trained, data-2 now); --force reproduces it anyway"
    )
    with pytest.raises(reproduce.ReproduceRefused, match=r"the code's git commit has changed \(abc123 when "):
        reproduce.check_unchanged(found, "data-1", "def456", force=False)
    with pytest.raises(reproduce.ReproduceRefused, match=r"\(abc123 when toy/1 was trained, none: not a git"):
        reproduce.check_unchanged(found, "data-1", None, force=False)

    forced = reproduce.check_unchanged(found, "data-2", "def456", force=True)
    assert [c.split(" (")[0] for c in forced] == [
        "the data of builtin:digits has changed",
        "the code's git commit has changed",
    ]


def test_differences_are_the_reproductions_metric_minus_the_originals():
    original = {"accuracy": 0.9, "macro_f1": 0.8, "top2": 0.99}
    assert reproduce.differences(original, {"accuracy": 0.9, "macro_f1": 0.85}) == {
        "accuracy": 0.0,
        "macro_f1": pytest.approx(0.05),
    }


def test_the_card_says_what_the_version_is_its_lineage_metrics_gate_and_how_to_load_it(
    trainflow_home, tmp_path
):
    ws = workspace()
    reg = register(ws, make_checkpoint(tmp_path / "c1"), 0.8, tags=lineage())
    config = PipelineConfig(name="toy")
    written = card.write_card(ws, reg, config, {"accuracy": 0.8, "macro_f1": 0.8})
    assert card.read_card(ws, "toy/1") == written
    assert written.startswith("# toy version 1\n")
    for expected in [
        "| model | `toy`, version 1 |",
        "| objective | classification |",
        "| model kind | `cnn` |",
        "| data source | `builtin:digits` |",
        "| data fingerprint | `data-1` |",
        f"| config hash | `{HASH}` |",
        "| git commit | `abc123` |",
        "| Prefect flow run | none: registered outside a flow |",
        f"| MLflow run | `{reg.run_id}` |",
        f"Gate on `accuracy` passed: champion. {reg.decision.reason}",
        "| accuracy | 0.8000 |",
        "## Drift at training time\n\n" + card.NO_DRIFT,
        'model = trainflow.load_model("models:/toy/1")',
        "`trainflow models serve toy/1`",
        "`trainflow models reproduce toy/1`",
    ]:
        assert expected in written, expected

    drift = "| feature | psi |\n|---|---|\n| pixel_0 | 0.01 |"
    with_drift = card.card_markdown(reg, config, lineage(), {"accuracy": 0.8}, drift=drift)
    assert "## Drift at training time\n\n" + drift + "\n\n## How to load it" in with_drift


def test_a_version_registered_without_a_card_has_none(trainflow_home, tmp_path):
    ws = workspace()
    register(ws, make_checkpoint(tmp_path / "c1"), 0.8)
    assert card.read_card(ws, "toy/1") is None
