import numpy as np
import pandas as pd
import pytest

from trainflow.config import DataConfig, SplitConfig
from trainflow.pipelines.data import (
    SPLIT_COLUMN,
    DataError,
    assign_split,
    class_values,
    inspect_source,
    load_dataset,
    split_dataset,
)


def frame(n=300, classes=(0, 1, 2), weights=(0.6, 0.3, 0.1), seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n).astype(np.float32),
            "b": rng.integers(0, 100, size=n),
            "label": rng.choice(classes, size=n, p=weights),
        }
    )


def test_assign_split_counts_and_order_independence():
    df = frame(100)
    out = assign_split(df, val=0.1, test=0.2, seed=0)
    assert np.bincount(out[SPLIT_COLUMN], minlength=3).tolist() == [70, 10, 20]
    shuffled = assign_split(df.sample(frac=1.0, random_state=1), val=0.1, test=0.2, seed=0)
    # The same row gets the same split whatever the order of rows.
    assert shuffled.sort_index()[SPLIT_COLUMN].tolist() == out[SPLIT_COLUMN].tolist()
    other_seed = assign_split(df, val=0.1, test=0.2, seed=1)
    assert other_seed[SPLIT_COLUMN].tolist() != out[SPLIT_COLUMN].tolist()


def test_stratified_split_keeps_class_ratios_and_is_deterministic(ray_cluster):
    import ray.data

    df = frame(1000)
    cfg = SplitConfig(val=0.1, test=0.2, seed=3, stratify=True)
    splits = split_dataset(ray.data.from_pandas(df), cfg, "label")
    parts = {k: v.to_pandas() for k, v in splits.items()}
    assert sum(len(p) for p in parts.values()) == len(df)
    overall = df["label"].value_counts(normalize=True).sort_index()
    for name, share in (("train", 0.7), ("val", 0.1), ("test", 0.2)):
        assert len(parts[name]) == pytest.approx(share * len(df), abs=3)
        ratios = parts[name]["label"].value_counts(normalize=True).sort_index()
        assert np.allclose(ratios.to_numpy(), overall.to_numpy(), atol=0.02), name
    # Rows land in exactly one split, and a second run splits the same way.
    keys = [set(map(tuple, p[["a", "b"]].to_numpy().tolist())) for p in parts.values()]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    again = split_dataset(ray.data.from_pandas(df), cfg, "label")["test"].to_pandas()
    pd.testing.assert_frame_equal(
        again.sort_values(["a", "b"]).reset_index(drop=True),
        parts["test"].sort_values(["a", "b"]).reset_index(drop=True),
    )


def test_csv_and_parquet_files_and_folders(tmp_path, ray_cluster):
    df = frame(50)
    (tmp_path / "pq").mkdir()
    df.iloc[:20].to_parquet(tmp_path / "pq" / "part-0.parquet")
    df.iloc[20:].to_parquet(tmp_path / "pq" / "part-1.parquet")
    df.to_csv(tmp_path / "data.csv", index=False)
    for source in (tmp_path / "pq", tmp_path / "data.csv", tmp_path / "pq" / "part-0.parquet"):
        info = inspect_source(DataConfig(source=str(source)))
        assert info.feature_columns == ["a", "b"]
        ds = load_dataset(info)
        assert set(ds.columns()) == {"a", "b", "label"}
        assert class_values(ds, "label") == [0, 1, 2]
    assert load_dataset(inspect_source(DataConfig(source=str(tmp_path / "pq")))).count() == 50


def test_fingerprint_changes_when_a_file_changes(tmp_path):
    path = tmp_path / "d.csv"
    frame(20).to_csv(path, index=False)
    before = inspect_source(DataConfig(source=str(path))).fingerprint
    assert inspect_source(DataConfig(source=str(path))).fingerprint == before
    frame(21).to_csv(path, index=False)
    assert inspect_source(DataConfig(source=str(path))).fingerprint != before


def test_digits_source():
    info = inspect_source(DataConfig())
    assert len(info.feature_columns) == 64 and info.label_column == "label"


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"source": "{tmp}/missing.csv"}, r"data\.source .*missing\.csv: no such file or folder"),
        (
            {"source": "{tmp}/d.csv", "label_column": "target"},
            r"data\.label_column 'target' is not a column of .*d\.csv; its columns are: a, b, label, city",
        ),
        ({"source": "{tmp}/d.csv", "feature_columns": ["a", "zz"]}, r"data\.feature_columns: 'zz' not in"),
        ({"source": "{tmp}/d.csv"}, r"data\.feature_columns: city \(string\) in .* are not numeric"),
        ({"source": "{tmp}/notes.txt"}, r"data\.source .*notes\.txt: unsupported file type '\.txt'"),
        ({"source": "builtin:iris"}, r"the only builtin source is builtin:digits"),
    ],
)
def test_bad_sources_fail_with_the_field_named(tmp_path, cfg, message):
    df = frame(10)
    df["city"] = "x"
    df.to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "notes.txt").write_text("hello")
    cfg = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in cfg.items()}
    with pytest.raises(DataError, match=message):
        inspect_source(DataConfig(**cfg))


def test_the_streaming_split_places_each_row_by_its_own_hash():
    from trainflow.pipelines.data import assign_split_by_hash

    df = frame(20_000)
    out = assign_split_by_hash(df, val=0.1, test=0.2, seed=0)
    shares = np.bincount(out[SPLIT_COLUMN], minlength=3) / len(df)
    np.testing.assert_allclose(shares, [0.7, 0.1, 0.2], atol=0.01)
    # Stratified in expectation: each class keeps the split's shares.
    for _, group in out.groupby("label"):
        np.testing.assert_allclose(
            np.bincount(group[SPLIT_COLUMN], minlength=3) / len(group), shares, atol=0.03
        )
    # A row's split depends on the row alone: any blocking, any order, the same answer.
    halves = pd.concat(
        [assign_split_by_hash(part, val=0.1, test=0.2, seed=0) for part in (df[::2], df[1::2])]
    )
    assert halves.sort_index()[SPLIT_COLUMN].tolist() == out[SPLIT_COLUMN].tolist()
