import json

import numpy as np
import pandas as pd
import pytest

from trainflow.config import PreprocessConfig, SplitConfig
from trainflow.pipelines.data import DataError, SourceInfo
from trainflow.pipelines.preprocess import (
    FEATURES,
    LABEL,
    Preprocessor,
    cache_key,
    fit_preprocessor,
    prepare,
    transform_batch,
)


def test_transform_batch_on_three_rows():
    pre = Preprocessor(["x", "y"], "label", ["cat", "dog"], True, mean=[1.0, 10.0], std=[2.0, 5.0])
    batch = pd.DataFrame({"x": [1.0, 3.0, -1.0], "y": [10, 20, 0], "label": ["dog", "cat", "dog"]})
    out = transform_batch(batch, state=pre.to_dict())
    assert out[FEATURES].dtype == np.float32
    np.testing.assert_allclose(out[FEATURES], [[0, 0], [1, 2], [-1, -2]])
    assert out[LABEL].tolist() == [1, 0, 1]
    with pytest.raises(DataError, match=r"column 'label' holds labels \['bird'\] outside the classes"):
        transform_batch(batch.assign(label=["dog", "bird", "cat"]), state=pre.to_dict())


def test_preprocessor_json_round_trip(tmp_path):
    pre = Preprocessor(["x"], "label", [0, 1], True, [0.5], [2.0])
    pre.save(tmp_path / "p.json")
    assert Preprocessor.load(tmp_path / "p.json") == pre


def test_statistics_come_from_the_train_split_only(ray_cluster):
    import ray.data

    train = pd.DataFrame({"x": [0.0, 2.0, 4.0], "c": [5.0, 5.0, 5.0], "label": [0, 1, 0]})
    pre = fit_preprocessor(
        ray.data.from_pandas(train),
        numeric=["x", "c"],
        categorical=[],
        label_column="label",
        classes=[0, 1],
        cfg=PreprocessConfig(),
    )
    assert pre.mean == pytest.approx([2.0, 5.0])
    assert pre.std == pytest.approx([np.std([0, 2, 4]), 1.0])  # a constant column is not scaled


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
    assert sorted(p.name for p in first.path.iterdir()) == [
        "counts.json",
        "preprocessor.json",
        "test",
        "train",
        "val",
    ]
    # Train statistics differ from the whole data's: fitted on train only.
    import ray.data

    train_x = ray.data.read_parquet(str(first.path / "train")).take_batch(1000)[FEATURES]
    assert train_x.shape == (first.counts["train"], 1)
    assert first.preprocessor.mean[0] != pytest.approx(df["x"].mean(), abs=1e-9)
    assert train_x.mean() == pytest.approx(0.0, abs=1e-5)
    second = prepare(info, SplitConfig(), PreprocessConfig(), cache)
    assert second.reused and second.path == first.path and second.counts == first.counts
    assert [p.name for p in cache.iterdir()] == [first.path.name]  # no temporary folder left


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
    assert sorted(p.name for p in entry.path.iterdir()) == [
        "counts.json",
        "preprocessor.json",
        "test",
        "train",
        "val",
    ]
    assert prepare(info, SplitConfig(), PreprocessConfig(), cache).reused


def test_categorical_vocabulary_from_train_and_unknown_categories_at_prediction(ray_cluster):
    import ray.data

    train = pd.DataFrame({"n": [1.0, 3.0, 5.0], "plan": ["pro", "basic", "pro"], "label": [0, 1, 0]})
    pre = fit_preprocessor(
        ray.data.from_pandas(train),
        numeric=["n"],
        categorical=["plan"],
        label_column="label",
        classes=[0, 1],
        cfg=PreprocessConfig(scaler="minmax"),
    )
    assert pre.categorical == {"plan": ["basic", "pro"]} and pre.num_features == 3
    assert (pre.mean, pre.std) == ([1.0], [4.0])
    rows = pd.DataFrame({"n": [5.0, 1.0, 3.0], "plan": ["basic", "enterprise", None]})
    # An unseen category and a missing one encode as zeros; nothing crashes.
    np.testing.assert_allclose(pre.features(rows), [[1, 1, 0], [0, 0, 0], [0.5, 0, 0]])
    assert Preprocessor.from_dict(json.loads(json.dumps(pre.to_dict()))) == pre
