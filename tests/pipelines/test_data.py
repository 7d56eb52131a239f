"""Sources inspected in the driver, and the split: seeded, by each row's content."""

import numpy as np
import pandas as pd
import pytest

from trainflow.config import DataConfig
from trainflow.pipelines.data.readers import fragment_batches, plan_fragments
from trainflow.pipelines.data.schema import DataError, SourceInfo, inspect_source
from trainflow.pipelines.data.split import hash_split_codes, rank_split_codes, row_keys


def frame(n=300, classes=(0, 1, 2), weights=(0.6, 0.3, 0.1), seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n).astype(np.float32),
            "b": rng.integers(0, 100, size=n),
            "label": rng.choice(classes, size=n, p=weights),
        }
    )


INFO = SourceInfo("frame", "parquet", [], "label", ["a", "b"], "fingerprint")


def test_ranked_split_counts_and_order_independence():
    df = frame(100)
    codes = rank_split_codes(row_keys(df, INFO, 0), val=0.1, test=0.2)
    assert np.bincount(codes, minlength=3).tolist() == [70, 10, 20]
    shuffled = df.sample(frac=1.0, random_state=1)
    again = pd.Series(rank_split_codes(row_keys(shuffled, INFO, 0), val=0.1, test=0.2), index=shuffled.index)
    # The same row gets the same split whatever the order of rows.
    assert again.sort_index().tolist() == codes.tolist()
    assert rank_split_codes(row_keys(df, INFO, 1), val=0.1, test=0.2).tolist() != codes.tolist()


def test_csv_and_parquet_files_and_folders(tmp_path):
    df = frame(50)
    (tmp_path / "pq").mkdir()
    df.iloc[:20].to_parquet(tmp_path / "pq" / "part-0.parquet")
    df.iloc[20:].to_parquet(tmp_path / "pq" / "part-1.parquet")
    df.to_csv(tmp_path / "data.csv", index=False)
    for source in (tmp_path / "pq", tmp_path / "data.csv", tmp_path / "pq" / "part-0.parquet"):
        info = inspect_source(DataConfig(source=str(source)))
        assert info.input_columns == ["a", "b"]
        rows = pd.concat(b for f in plan_fragments(info) for b in fragment_batches(info, f))
        assert list(rows.columns) == ["a", "b", "label"]
        assert sorted(rows["label"].unique()) == [0, 1, 2]
    info = inspect_source(DataConfig(source=str(tmp_path / "pq")))
    assert sum(len(b) for f in plan_fragments(info) for b in fragment_batches(info, f)) == 50


def test_fingerprint_changes_when_a_file_changes(tmp_path):
    path = tmp_path / "d.csv"
    frame(20).to_csv(path, index=False)
    before = inspect_source(DataConfig(source=str(path))).fingerprint
    assert inspect_source(DataConfig(source=str(path))).fingerprint == before
    frame(21).to_csv(path, index=False)
    assert inspect_source(DataConfig(source=str(path))).fingerprint != before


def test_digits_source():
    info = inspect_source(DataConfig())
    assert len(info.input_columns) == 64 and info.label_column == "label"


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
        ({"source": "builtin:iris"}, r"the builtin sources are builtin:digits, builtin:diabetes"),
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
    df = frame(20_000)
    codes = hash_split_codes(row_keys(df, INFO, 0), val=0.1, test=0.2)
    shares = np.bincount(codes, minlength=3) / len(df)
    np.testing.assert_allclose(shares, [0.7, 0.1, 0.2], atol=0.01)
    # Stratified in expectation: each class keeps the split's shares.
    for label in range(3):
        group = codes[df["label"].to_numpy() == label]
        np.testing.assert_allclose(np.bincount(group, minlength=3) / len(group), shares, atol=0.03)
    # A row's split depends on the row alone: any blocking, any order, the same answer.
    halves = pd.concat(
        [
            pd.Series(hash_split_codes(row_keys(part, INFO, 0), val=0.1, test=0.2), index=part.index)
            for part in (df[::2], df[1::2])
        ]
    )
    assert halves.sort_index().tolist() == codes.tolist()
