import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.pipelines.data.entry import cache_key
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL, Preprocessor, transform_batch
from trainflow.pipelines.data.schema import DataError, SourceInfo
from trainflow.pipelines.data.stats import FitStats


def fit(train: pd.DataFrame, numeric, categorical, cfg: PreprocessConfig) -> Preprocessor:
    info = SourceInfo(
        "frame", "parquet", [], "label", [*numeric, *categorical], "fp", categorical_columns=categorical
    )
    stats = FitStats()
    stats.add(train, info, cfg.scaler)
    return stats.preprocessor(info, [0, 1], cfg)


def test_transform_batch_on_three_rows():
    pre = Preprocessor(["x", "y"], "label", ["cat", "dog"], offset=[1.0, 10.0], scale=[2.0, 5.0])
    batch = pd.DataFrame({"x": [1.0, 3.0, -1.0], "y": [10, 20, 0], "label": ["dog", "cat", "dog"]})
    out = transform_batch(batch, state=pre.to_dict())
    assert out[FEATURES].dtype == np.float32
    np.testing.assert_allclose(out[FEATURES], [[0, 0], [1, 2], [-1, -2]])
    assert out[LABEL].tolist() == [1, 0, 1]
    with pytest.raises(DataError, match=r"column 'label' holds labels \['bird'\] outside the classes"):
        transform_batch(batch.assign(label=["dog", "bird", "cat"]), state=pre.to_dict())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_frame_and_its_columns_as_arrays_scale_alike_and_keep_a_spread_far_from_zero(dtype):
    """A frame (serving, prediction) and a dict of arrays (preparation's writes) scale alike,
    whatever the columns' type, and a column of timestamps keeps its spread in float32."""
    seconds = 1.7e9 + np.arange(1000) * 60  # a minute apart, 1.7e9 s from zero
    frame = pd.DataFrame({"t": seconds.astype(dtype), "x": np.linspace(-1, 1, 1000).astype(dtype)})
    pre = Preprocessor(["t", "x"], "label", [0], offset=[float(seconds.mean()), 0.0], scale=[60.0, 1.0])
    from_frame = pre.features(frame)
    assert from_frame.dtype == np.float32 and from_frame.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(from_frame, pre.features({c: frame[c].to_numpy() for c in frame}))
    if dtype != np.float32:  # float32 holds 1.7e9 to 128 s: no minutes left to keep
        np.testing.assert_allclose(np.diff(from_frame[:, 0]), 1.0, rtol=1e-5)


def test_preprocessor_json_round_trip(tmp_path):
    pre = Preprocessor(["x"], "label", [0, 1], [0.5], [2.0])
    pre.save(tmp_path / "p.json")
    assert Preprocessor.load(tmp_path / "p.json") == pre


def test_a_preprocessor_saved_by_trainflow_0_1_0_reads_as_today():
    old = {
        "feature_columns": ["n"],
        "label_column": "label",
        "classes": [0, 1],
        "standardize": True,
        "mean": [1.0],
        "std": [4.0],
        "scaler": "minmax",
        "categorical": {"plan": ["basic", "pro"]},
        "image": None,
    }
    pre = Preprocessor.from_dict(old)
    assert (pre.numeric_columns, pre.offset, pre.scale, pre.scaler) == (["n"], [1.0], [4.0], "minmax")
    assert pre.input_columns == ["n", "plan"]
    unscaled = Preprocessor.from_dict({**old, "standardize": False, "mean": [], "std": [], "scaler": "none"})
    assert unscaled.features(pd.DataFrame({"n": [3.0], "plan": ["pro"]})).tolist() == [[3.0, 0.0, 1.0]]


def test_fitted_statistics_and_a_constant_column():
    train = pd.DataFrame({"x": [0.0, 2.0, 4.0], "c": [5.0, 5.0, 5.0], "label": [0, 1, 0]})
    pre = fit(train, ["x", "c"], [], PreprocessConfig())
    assert pre.offset == pytest.approx([2.0, 5.0])
    assert pre.scale == pytest.approx([np.std([0, 2, 4]), 1.0])  # a constant column is not scaled


def test_prepare_writes_once_and_reuses_the_entry(tmp_path, ray_cluster):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(5, 3, 400), "label": rng.integers(0, 2, 400)})
    df.to_parquet(tmp_path / "d.parquet")
    info = SourceInfo(
        str(tmp_path / "d.parquet"), "parquet", [str(tmp_path / "d.parquet")], "label", ["x"], "fp"
    )
    cache = tmp_path / "cache"
    first = prepare(info, SplitConfig(), PreprocessConfig(), cache)
    assert not first.reused and sum(first.counts.values()) == 400
    assert sorted(p.name for p in Path(first.path).iterdir()) == [
        "counts.json",
        "preprocessor.json",
        "profile.json",
        "test",
        "train",
        "val",
    ]
    # Train statistics differ from the whole data's: fitted on train only.
    train_x = first.dataset("train").take_batch(1000)[FEATURES]
    assert train_x.shape == (first.counts["train"], 1)
    assert first.preprocessor.offset[0] != pytest.approx(df["x"].mean(), abs=1e-9)
    assert train_x.mean() == pytest.approx(0.0, abs=1e-5)
    second = prepare(info, SplitConfig(), PreprocessConfig(), cache)
    assert second.reused and second.path == first.path and second.counts == first.counts
    assert [p.name for p in cache.iterdir()] == [Path(first.path).name]  # no temporary folder left


def test_a_failed_prepare_leaves_no_entry(tmp_path, ray_cluster):
    df = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "label": [0, 0, 1, 1]})
    df.to_parquet(tmp_path / "d.parquet")
    info = SourceInfo(
        str(tmp_path / "d.parquet"), "parquet", [str(tmp_path / "d.parquet")], "label", ["x"], "fp"
    )
    cache = tmp_path / "cache"
    # Four rows leave the validation split empty: an error, and nothing in the cache.
    with pytest.raises(DataError, match="the val split is empty"):
        prepare(info, SplitConfig(val=0.1, test=0.25), PreprocessConfig(), cache)
    assert list(cache.iterdir()) == []


def test_a_crashed_runs_leftovers_are_never_reused(tmp_path, ray_cluster):
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.normal(size=200), "label": rng.integers(0, 2, 200)}).to_parquet(
        tmp_path / "d.parquet"
    )
    info = SourceInfo(
        str(tmp_path / "d.parquet"), "parquet", [str(tmp_path / "d.parquet")], "label", ["x"], "fp"
    )
    cache = tmp_path / "cache"
    key = cache_key(info, SplitConfig(), PreprocessConfig())
    # A crash mid-write leaves a temporary folder; an entry without counts.json is no entry.
    (cache / f".tmp-{key}-dead" / "train").mkdir(parents=True)
    (cache / f".tmp-{key}-dead" / "counts.json").write_text('{"train": 1, "val": 0, "test": 0}')
    (cache / key / "train").mkdir(parents=True)
    entry = prepare(info, SplitConfig(), PreprocessConfig(), cache)
    assert not entry.reused and sum(entry.counts.values()) == 200
    assert sorted(p.name for p in Path(entry.path).iterdir()) == [
        "counts.json",
        "preprocessor.json",
        "profile.json",
        "test",
        "train",
        "val",
    ]
    assert prepare(info, SplitConfig(), PreprocessConfig(), cache).reused


def test_categorical_vocabulary_from_train_and_unknown_categories_at_prediction():
    train = pd.DataFrame({"n": [1.0, 3.0, 5.0], "plan": ["pro", "basic", "pro"], "label": [0, 1, 0]})
    pre = fit(train, ["n"], ["plan"], PreprocessConfig(scaler="minmax"))
    assert pre.categorical == {"plan": ["basic", "pro"]} and pre.num_features == 3
    assert (pre.offset, pre.scale) == ([1.0], [4.0])
    rows = pd.DataFrame({"n": [5.0, 1.0, 3.0], "plan": ["basic", "enterprise", None]})
    # An unseen category and a missing one encode as zeros; nothing crashes.
    np.testing.assert_allclose(pre.features(rows), [[1, 1, 0], [0, 0, 0], [0.5, 0, 0]])
    assert Preprocessor.from_dict(json.loads(json.dumps(pre.to_dict()))) == pre
