"""The preparation engine: inputs cut into fragments, passed over by Ray tasks (or in the
driver, on its threads), give what one pass over all the rows at once gives; and a split
read again holds exactly the rows that preparing wrote."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
from trainflow.pipelines.data import prepare as preparing
from trainflow.pipelines.data import readers, runner
from trainflow.pipelines.data import split as splitting
from trainflow.pipelines.data.entry import read_split
from trainflow.pipelines.data.prepare import prepare, raw_split
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.data.schema import DataError, SourceInfo, inspect_dataset, inspect_source
from trainflow.pipelines.data.stats import FitStats


def _frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(rows),
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


def _rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A split's rows as one array, features then label, sorted: comparable as a set."""
    rows = np.column_stack([x, y])
    return rows[np.lexsort(rows.T[::-1])]


def _prepared(entry, name: str) -> np.ndarray:
    split = read_split(entry.split_path(name))
    return _rows(split[FEATURES], split[LABEL])


def _in_one_pass(info, frame: pd.DataFrame, split: SplitConfig, cfg: PreprocessConfig, *, exact: bool):
    """What preparing gives, computed on all the rows at once in this process."""
    kept = frame[[*info.input_columns, info.label_column]].dropna().reset_index(drop=True)
    keys = splitting.row_keys(kept, info, split.seed)
    if exact:
        codes = splitting.exact_split_codes([keys], [kept["label"].to_numpy()], split)[0]
    else:
        codes = splitting.hash_split_codes(keys, val=split.val, test=split.test)
    stats = FitStats()
    stats.add(kept[codes == 0], info, cfg.scaler)
    pre = stats.preprocessor(info, ["a", "b", "c"], cfg)
    rows = {
        name: _rows(pre.features(kept[codes == i]), pre.labels(kept[codes == i]["label"]))
        for i, name in enumerate(splitting.SPLIT_NAMES)
    }
    return pre, rows, kept[codes == 2]


@pytest.mark.parametrize(
    ("exact", "stratify", "threads"),
    [(True, True, False), (True, False, False), (False, True, False), (False, True, True)],
    ids=["exact stratified split", "exact split", "split by row hash", "split by row hash on threads"],
)
def test_fragments_prepare_what_one_pass_over_all_rows_gives(
    tmp_path, ray_cluster, monkeypatch, caplog, exact, stratify, threads
):
    frame = _frame(900)
    frame.loc[[5, 400, 899], "x"] = np.nan  # dropped: data.missing=drop
    source = _parquet_folder(tmp_path / "in", frame)
    info = inspect_source(
        DataConfig(source=str(source), label_column="label", categorical_columns=["c"], missing="drop")
    )
    if not exact:
        monkeypatch.setattr(splitting, "SMALL_INPUT_BYTES", 0)  # the driver's choice: split by row hash
    split, cfg = SplitConfig(seed=3, stratify=stratify), PreprocessConfig()
    assert len(readers.plan_fragments(info)) == 3  # small row groups: one fragment per file
    # On the session's cluster, this machine alone, a table is prepared on the driver's
    # threads; past LOCAL_DRIVER_BYTES (or on a cluster of other machines), on Ray tasks.
    assert preparing.prepares_in_driver(info)
    if not threads:
        monkeypatch.setattr(preparing, "LOCAL_DRIVER_BYTES", -1)
        assert not preparing.prepares_in_driver(info)

    with caplog.at_level("INFO", logger="trainflow"):
        entry = prepare(info, split, cfg, tmp_path / "cache")
    used = preparing.driver_threads(info)
    assert used == (runner.available_threads() if threads else 0)
    assert ("in 3 fragments on" in caplog.text) == threads
    pre, expected, test_rows = _in_one_pass(info, frame, split, cfg, exact=exact)

    assert entry.dropped == 3 and sum(entry.counts.values()) == 897
    assert entry.preprocessor.classes == ["a", "b", "c"] and entry.preprocessor.categorical == pre.categorical
    assert entry.preprocessor.offset == pytest.approx(pre.offset, rel=1e-12)
    assert entry.preprocessor.scale == pytest.approx(pre.scale, rel=1e-9)
    for name in splitting.SPLIT_NAMES:
        np.testing.assert_allclose(_prepared(entry, name), expected[name], rtol=1e-6, err_msg=name)
        assert entry.dataset(name).count() == entry.counts[name]
    # The rows the gate scores a champion on: the test split's raw rows, read again,
    # are the very rows preparing wrote (by their ids).
    raw_test = raw_split(info, split, "test", kept_rows=897).to_pandas()
    assert sorted(raw_test["id"]) == sorted(test_rows["id"])
    written_ids = _prepared(entry, "test")[:, 0] * entry.preprocessor.scale[0] + entry.preprocessor.offset[0]
    assert sorted(raw_test["id"]) == sorted(np.rint(written_ids).astype(int))
    if exact and stratify:  # each class split exactly: 10% and 20% of every class, rounded
        for label, n in pd.Series(frame.dropna()["label"]).value_counts().items():
            code = entry.preprocessor.classes.index(label)
            test = (_prepared(entry, "test")[:, -1] == code).sum()
            assert test == round(n * 0.2), label


def test_an_image_folders_test_split_read_again_holds_the_images_preparing_wrote(tmp_path, ray_cluster):
    from tests.pipelines.test_sources import write_image_folder

    root = write_image_folder(tmp_path / "imgs", per_class=12)
    info = inspect_source(DataConfig(source=str(root)))
    split = SplitConfig(val=0.2, test=0.25, seed=2)
    entry = prepare(info, split, PreprocessConfig(), tmp_path / "cache")

    raw_test = raw_split(info, split, "test", kept_rows=36).to_pandas()
    assert len(raw_test) == entry.counts["test"] == 9
    assert raw_test["path"].is_unique and set(raw_test["path"]) <= set(info.files)
    assert {p.rsplit("/", 2)[1] for p in raw_test["path"]} == set(raw_test["label"])
    pre = entry.preprocessor
    again = _rows(pre.features(raw_test), pre.labels(raw_test["label"]))
    np.testing.assert_allclose(again, _prepared(entry, "test"), rtol=1e-6)


def test_images_are_normalized_by_a_given_mean_and_std_of_their_channels(tmp_path, ray_cluster):
    from tests.pipelines.test_sources import write_image_folder
    from trainflow.config import ConfigError

    root = write_image_folder(tmp_path / "imgs", per_class=6)
    info = inspect_source(DataConfig(source=str(root)))
    imagenet = PreprocessConfig(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    entry = prepare(info, SplitConfig(val=0.25, test=0.25), imagenet, tmp_path / "cache")
    assert entry.preprocessor.image["mean"] == imagenet.image_mean
    assert entry.preprocessor.image["std"] == imagenet.image_std
    grey = PreprocessConfig(image_mean=[0.5], image_std=[0.5])
    with pytest.raises(
        ConfigError,
        match=r"^preprocess.image_mean and image_std: one value per channel, and the images have 3 .*not 1$",
    ):
        prepare(info, SplitConfig(), grey, tmp_path / "cache")


def test_a_ray_dataset_source_prepares_as_the_same_rows_in_a_file_do(tmp_path, ray_cluster):
    import ray.data

    frame = _frame(600).drop(columns=["c"])
    frame.to_parquet(tmp_path / "rows.parquet")
    split, cfg = SplitConfig(seed=5), PreprocessConfig(scaler="minmax")
    from_file = prepare(
        inspect_source(DataConfig(source=str(tmp_path / "rows.parquet"))), split, cfg, tmp_path / "c"
    )

    ds = ray.data.from_pandas(_parts(frame, 4))
    info = inspect_dataset(ds, DataConfig())
    assert info.format == "dataset" and info.input_columns == ["id", "x", "n"]
    from_dataset = prepare(info, split, cfg, tmp_path / "c")

    assert from_dataset.counts == from_file.counts and not from_dataset.reused
    assert from_dataset.preprocessor.to_dict() == from_file.preprocessor.to_dict()
    for name in splitting.SPLIT_NAMES:
        np.testing.assert_array_equal(_prepared(from_dataset, name), _prepared(from_file, name), err_msg=name)
    # A Dataset cannot be fingerprinted without reading it all: never reused.
    assert not prepare(inspect_dataset(ds, DataConfig()), split, cfg, tmp_path / "c").reused
    with pytest.raises(DataError, match=r"data\.label_column 'target' is not a column of ray\.data\.Dataset"):
        inspect_dataset(ds, DataConfig(label_column="target"))
    with pytest.raises(DataError, match=r"data\.feature_columns: 'zz' not in ray\.data\.Dataset"):
        inspect_dataset(ds, DataConfig(feature_columns=["x", "zz"]))


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
    ids = np.concatenate([_prepared(entry, name)[:, 0] for name in ("train", "val", "test")])
    assert sorted(ids) == list(range(250))  # scaler none: the id column as read


def test_train_statistics_merge_as_one_pass_over_all_rows_would_give():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"x": rng.normal(1e6, 0.5, 1000), "y": rng.uniform(-1, 1, 1000), "label": 0})
    info = SourceInfo("frame", "parquet", [], "label", ["x", "y"], "fingerprint")
    stats = {"standard": [], "minmax": []}
    for scaler, parts in stats.items():
        for chunk in _parts(frame, 7):
            part = FitStats()
            part.add(chunk, info, scaler)
            parts.append(part)
    merged = {}
    for scaler, parts in stats.items():
        merged[scaler] = parts[0]
        for part in parts[1:]:
            merged[scaler].merge(part)
    standard = merged["standard"].preprocessor(info, [0, 1], PreprocessConfig(scaler="standard"))
    minmax = merged["minmax"].preprocessor(info, [0, 1], PreprocessConfig(scaler="minmax"))
    assert standard.offset == pytest.approx(frame[["x", "y"]].mean().tolist(), rel=1e-14)
    assert standard.scale == pytest.approx(frame[["x", "y"]].std(ddof=0).tolist(), rel=1e-9)
    assert minmax.offset == pytest.approx(frame[["x", "y"]].min().tolist())
    assert minmax.scale == pytest.approx((frame[["x", "y"]].max() - frame[["x", "y"]].min()).tolist())


def test_a_bad_value_past_the_first_block_of_a_csv_names_the_file(tmp_path, ray_cluster):
    # The driver's schema check infers a CSV's column types from its first megabyte; a
    # value past it that does not parse surfaces only when the passes read it: here on
    # the driver's threads, in one file of three.
    rows = 400_000
    folder = tmp_path / "csvs"
    folder.mkdir()
    for name in ("a.csv", "c.csv"):
        (folder / name).write_text("x,label\n" + "1.5,0\n2.5,1\n" * 50)
    text = "x,label\n" + "1.5,0\n2.5,1\n" * (rows // 2) + "oops,1\n" + "1.5,0\n" * 10
    (folder / "big.csv").write_text(text)
    info = inspect_source(DataConfig(source=str(folder)))
    assert preparing.driver_threads(info) == runner.available_threads()
    with pytest.raises(DataError, match=r"^data\.source .*csvs: cannot read .*big\.csv as csv: .*oops"):
        prepare(info, SplitConfig(), PreprocessConfig(), tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/counts.json"))


def test_one_small_file_is_prepared_in_the_driver_as_ray_tasks_prepare_it(tmp_path, ray_cluster, monkeypatch):
    frame = _frame(500)
    source = tmp_path / "one.csv"
    frame.to_csv(source, index=False)
    info = inspect_source(DataConfig(source=str(source), label_column="label", categorical_columns=["c"]))
    split, cfg = SplitConfig(seed=1), PreprocessConfig()
    assert preparing.prepares_in_driver(info)
    in_driver = prepare(info, split, cfg, tmp_path / "driver")

    monkeypatch.setattr(preparing, "IN_DRIVER_BYTES", -1)  # the same input through Ray tasks
    monkeypatch.setattr(preparing, "LOCAL_DRIVER_BYTES", -1)
    assert not preparing.prepares_in_driver(info)
    on_ray = prepare(info, split, cfg, tmp_path / "ray")

    assert in_driver.counts == on_ray.counts and sum(in_driver.counts.values()) == 500
    assert in_driver.preprocessor.to_dict() == on_ray.preprocessor.to_dict()
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(_prepared(in_driver, name), _prepared(on_ray, name), err_msg=name)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_within_remembered_a_fragment_read_to_its_end_is_read_again_from_memory(tmp_path, fmt):
    source = tmp_path / f"rows.{fmt}"

    def write(frame: pd.DataFrame, path) -> None:
        (frame.to_parquet if fmt == "parquet" else frame.to_csv)(path, index=False)

    write(_frame(300), source)
    info = inspect_source(DataConfig(source=str(source), label_column="label", categorical_columns=["c"]))
    (fragment,) = readers.plan_fragments(info)

    def labels(**batches) -> list:
        return [v for b in readers.fragment_batches(info, fragment, **batches) for v in b["label"]]

    with readers.remembered():
        first = labels()
        # The file changes on disk: within the block, a later pass reads what the first read.
        write(_frame(300).assign(label=7), source)
        assert labels(frames=False) == first and 7 not in first
    assert set(labels()) == {7}  # the block forgotten, the file is read again

    write(_frame(300), source)
    with readers.remembered():
        next(readers.fragment_batches(info, fragment))  # a pass that stopped early keeps nothing
        write(_frame(300).assign(label=7), source)
        assert set(labels()) == {7}


def test_a_fragment_past_the_remembered_bytes_is_read_again(tmp_path, monkeypatch):
    source = tmp_path / "rows.csv"
    _frame(300).to_csv(source, index=False)
    info = inspect_source(DataConfig(source=str(source), label_column="label", categorical_columns=["c"]))
    (fragment,) = readers.plan_fragments(info)
    monkeypatch.setattr(readers, "REMEMBER_BYTES", 1000)  # less than the fragment's rows

    with readers.remembered():
        assert len(list(readers.fragment_batches(info, fragment))) == 1
        _frame(300).assign(label=7).to_csv(source, index=False)
        assert {v for b in readers.fragment_batches(info, fragment) for v in b["label"]} == {7}
