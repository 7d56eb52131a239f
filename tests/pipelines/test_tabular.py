"""Tabular inputs prepared by Ray tasks per fragment, checked against the Ray Data pipeline
that image folders still take: the same rows in each split, the same fitted state."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
from trainflow.pipelines import data, tabular
from trainflow.pipelines.data import (
    DataError,
    SourceInfo,
    check_rows,
    drop_missing,
    inspect_source,
    load_dataset,
    split_dataset,
)
from trainflow.pipelines.preprocess import FEATURES, LABEL, fit_preprocessor, prepare, transform_dataset


def _frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x": rng.normal(1e4, 3, rows),  # a large mean: the statistics must not cancel
            "n": rng.integers(0, 50, rows),
            "c": rng.choice(["red", "green", "blue"], rows),
            "label": rng.choice(["a", "b", "c"], rows, p=[0.6, 0.3, 0.1]),
        }
    )


def _parts(frame: pd.DataFrame, k: int) -> list[pd.DataFrame]:
    n = len(frame)
    return [frame.iloc[i * n // k : (i + 1) * n // k] for i in range(k)]


def _parquet_folder(folder, frame: pd.DataFrame, files: int = 3, row_group: int = 100):
    """``files`` Parquet files in order, each of several row groups."""
    folder.mkdir()
    for i, part in enumerate(_parts(frame, files)):
        pq.write_table(
            pa.Table.from_pandas(part, preserve_index=False),
            folder / f"{i}.parquet",
            row_group_size=row_group,
        )
    return folder


def _rows(frames) -> np.ndarray:
    """A split's rows as one array, features then label, sorted: comparable as a set."""
    x = np.concatenate([np.stack(f[FEATURES].to_numpy()) for f in frames])
    y = np.concatenate([f[LABEL].to_numpy() for f in frames])
    rows = np.column_stack([x, y])
    return rows[np.lexsort(rows.T[::-1])]


def _prepared(entry, name: str) -> np.ndarray:
    return _rows([pq.read_table(p).to_pandas() for p in sorted((entry.path / name).glob("*.parquet"))])


def _through_ray_data(info, split: SplitConfig, cfg: PreprocessConfig, *, exact: bool):
    ds = load_dataset(info)
    report = check_rows(ds, info)
    if report.missing_rows:
        ds = ds.map_batches(
            drop_missing,
            fn_kwargs={"columns": [*info.feature_columns, info.label_column]},
            batch_format="pandas",
        )
    splits = split_dataset(ds, split, info.label_column, exact=exact)
    pre = fit_preprocessor(
        splits["train"],
        numeric=info.numeric_columns,
        categorical=info.categorical_columns,
        label_column=info.label_column,
        classes=report.labels,
        cfg=cfg,
    )
    return pre, {name: _rows([transform_dataset(s, pre).to_pandas()]) for name, s in splits.items()}


@pytest.mark.parametrize(
    ("exact", "stratify"),
    [(True, True), (True, False), (False, True)],
    ids=["exact stratified split", "exact split", "split by row hash"],
)
def test_fragments_prepare_the_rows_and_state_that_ray_data_prepares(
    tmp_path, ray_cluster, monkeypatch, exact, stratify
):
    frame = _frame(900)
    frame.loc[[5, 400, 899], "x"] = np.nan  # dropped: data.missing=drop
    source = _parquet_folder(tmp_path / "in", frame)
    info = inspect_source(
        DataConfig(source=str(source), label_column="label", categorical_columns=["c"], missing="drop")
    )
    if not exact:
        monkeypatch.setattr(data, "SMALL_INPUT_BYTES", 0)  # the driver's choice: split by row hash
    split, cfg = SplitConfig(seed=3, stratify=stratify), PreprocessConfig()
    assert len(tabular.plan_fragments(info)) == 3  # small row groups: one fragment per file

    entry = prepare(info, split, cfg, tmp_path / "cache")
    pre, expected = _through_ray_data(info, split, cfg, exact=exact)

    assert entry.dropped == 3 and sum(entry.counts.values()) == 897
    assert entry.preprocessor.classes == ["a", "b", "c"] and entry.preprocessor.categorical == pre.categorical
    assert entry.preprocessor.mean == pytest.approx(pre.mean, rel=1e-12)
    assert entry.preprocessor.std == pytest.approx(pre.std, rel=1e-9)
    for name in ("train", "val", "test"):
        np.testing.assert_allclose(_prepared(entry, name), expected[name], rtol=1e-6, err_msg=name)
    # The rows the gate scores a champion on: this split's raw rows, read again.
    raw_test = data.raw_split(info, split, "test", kept_rows=897).to_pandas()
    assert len(raw_test) == entry.counts["test"]
    np.testing.assert_allclose(
        sorted(raw_test["x"]), sorted(_prepared(entry, "test")[:, 0] * pre.std[0] + pre.mean[0]), rtol=1e-9
    )
    if exact and stratify:  # each class split exactly: 10% and 20% of every class, rounded
        for label, n in pd.Series(frame.dropna()["label"]).value_counts().items():
            code = entry.preprocessor.classes.index(label)
            test = (_prepared(entry, "test")[:, -1] == code).sum()
            assert test == round(n * 0.2), label


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_limit_takes_the_first_rows_across_files_and_row_groups(tmp_path, ray_cluster, fmt):
    frame = _frame(600)
    if fmt == "parquet":
        source = _parquet_folder(tmp_path / "in", frame)
    else:
        source = tmp_path / "in"
        source.mkdir()
        for i, part in enumerate(_parts(frame, 3)):
            if fmt == "csv":
                part.to_csv(source / f"{i}.csv", index=False)
            else:
                part.to_json(source / f"{i}.jsonl", orient="records", lines=True)
    info = inspect_source(
        DataConfig(source=str(source), label_column="label", categorical_columns=["c"], limit=250)
    )
    entry = prepare(info, SplitConfig(), PreprocessConfig(scaler="none"), tmp_path / "cache")

    assert sum(entry.counts.values()) == 250
    x = np.concatenate([_prepared(entry, name)[:, 0] for name in ("train", "val", "test")])
    assert sorted(x) == pytest.approx(sorted(frame["x"][:250]))


def test_train_statistics_merge_as_one_pass_over_all_rows_would_give():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"x": rng.normal(1e6, 0.5, 1000), "y": rng.uniform(-1, 1, 1000), "label": 0})
    info = SourceInfo("frame", "parquet", [], "label", ["x", "y"], "fingerprint")
    stats = {"standard": [], "minmax": []}
    for scaler, parts in stats.items():
        for chunk in _parts(frame, 7):
            part = tabular.TrainStats()
            part.add(chunk, info, scaler)
            parts.append(part)
    merged = {}
    for scaler, parts in stats.items():
        merged[scaler] = parts[0]
        for part in parts[1:]:
            merged[scaler].merge(part)
    standard = merged["standard"].preprocessor(info, [0, 1], PreprocessConfig(scaler="standard"))
    minmax = merged["minmax"].preprocessor(info, [0, 1], PreprocessConfig(scaler="minmax"))
    assert standard.mean == pytest.approx(frame[["x", "y"]].mean().tolist(), rel=1e-14)
    assert standard.std == pytest.approx(frame[["x", "y"]].std(ddof=0).tolist(), rel=1e-9)
    assert minmax.mean == pytest.approx(frame[["x", "y"]].min().tolist())
    assert minmax.std == pytest.approx((frame[["x", "y"]].max() - frame[["x", "y"]].min()).tolist())


def test_a_bad_value_past_the_first_block_of_a_csv_names_the_file(tmp_path, ray_cluster):
    # The driver's schema check infers a CSV's column types from its first megabyte; a
    # value past it that does not parse surfaces only when a Ray task reads it.
    rows = 400_000
    text = "x,label\n" + "1.5,0\n2.5,1\n" * (rows // 2) + "oops,1\n" + "1.5,0\n" * 10
    (tmp_path / "big.csv").write_text(text)
    info = inspect_source(DataConfig(source=str(tmp_path / "big.csv")))
    with pytest.raises(DataError, match=r"^data\.source .*big\.csv: cannot read .*big\.csv as csv: .*oops"):
        prepare(info, SplitConfig(), PreprocessConfig(), tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/counts.json"))


def test_one_small_file_is_prepared_in_the_driver_as_ray_tasks_prepare_it(tmp_path, ray_cluster, monkeypatch):
    frame = _frame(500)
    source = tmp_path / "one.csv"
    frame.to_csv(source, index=False)
    info = inspect_source(DataConfig(source=str(source), label_column="label", categorical_columns=["c"]))
    split, cfg = SplitConfig(seed=1), PreprocessConfig()
    assert tabular.prepares_in_driver(info)
    in_driver = prepare(info, split, cfg, tmp_path / "driver")

    monkeypatch.setattr(tabular, "IN_DRIVER_BYTES", -1)  # the same input through Ray tasks
    assert not tabular.prepares_in_driver(info)
    on_ray = prepare(info, split, cfg, tmp_path / "ray")

    assert in_driver.counts == on_ray.counts and sum(in_driver.counts.values()) == 500
    assert in_driver.preprocessor.to_dict() == on_ray.preprocessor.to_dict()
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(_prepared(in_driver, name), _prepared(on_ray, name), err_msg=name)
