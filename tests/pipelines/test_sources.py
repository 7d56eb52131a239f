"""Every kind of source, on small files the tests write, read by the engine's readers."""

import struct
import zipfile

import numpy as np
import pandas as pd
import pytest

from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.data.readers import fragment_batches, plan_fragments
from trainflow.pipelines.data.schema import DataError, inspect_source


def frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.integers(0, 10, size=n),
            "color": rng.choice(["red", "green", "blue"], size=n),
            "label": np.arange(n) % 3,
        }
    )


def read_all(info) -> pd.DataFrame:
    """Every row of the source, fragment by fragment, as the engine's workers read them."""
    return pd.concat([b for f in plan_fragments(info) for b in fragment_batches(info, f)], ignore_index=True)


def rows_of(info):
    return read_all(info).sort_values(["a"]).reset_index(drop=True)


def test_json_lines_glob_and_uris_read_the_same_rows(tmp_path, ray_cluster):
    df = frame()
    (tmp_path / "parts").mkdir()
    df.iloc[:30].to_json(tmp_path / "parts" / "a.jsonl", orient="records", lines=True)
    df.iloc[30:].to_json(tmp_path / "parts" / "b.jsonl", orient="records", lines=True)
    (tmp_path / "parts" / "_SUCCESS").write_text("")  # a writer's marker, skipped
    expected = df.sort_values("a").reset_index(drop=True)
    for source in (
        str(tmp_path / "parts"),
        str(tmp_path / "parts" / "*.jsonl"),
        f"file://{tmp_path}/parts",
    ):
        info = inspect_source(DataConfig(source=source, categorical_columns=["color"]))
        assert info.format == "json" and len(info.files) == 2, source
        got = rows_of(info)
        np.testing.assert_allclose(got["a"], expected["a"])
        assert got["color"].tolist() == expected["color"].tolist()


def test_a_glob_picks_only_what_it_matches(tmp_path, ray_cluster):
    frame(20).to_csv(tmp_path / "train-1.csv", index=False)
    frame(30, seed=1).to_csv(tmp_path / "train-2.csv", index=False)
    frame(40, seed=2).to_csv(tmp_path / "other.csv", index=False)
    info = inspect_source(DataConfig(source=str(tmp_path / "train-*.csv"), categorical_columns=["color"]))
    assert [f.rsplit("/", 1)[1] for f in info.files] == ["train-1.csv", "train-2.csv"]
    assert len(read_all(info)) == 50
    with pytest.raises(DataError, match=r"data\.source .*nope-\*\.csv: the pattern matches no file"):
        inspect_source(DataConfig(source=str(tmp_path / "nope-*.csv")))


def test_a_non_local_fsspec_filesystem_a_zip_archive(tmp_path, ray_cluster):
    # zip:// is no filesystem pyarrow knows: it goes through fsspec, in the driver and
    # in every Ray worker that reads a part.
    df = frame()
    archive = tmp_path / "data.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("data/part-0.csv", df.iloc[:25].to_csv(index=False))
        z.writestr("data/part-1.csv", df.iloc[25:].to_csv(index=False))
    info = inspect_source(DataConfig(source=f"zip://data::file://{archive}", categorical_columns=["color"]))
    assert info.format == "csv" and len(info.files) == 2
    got = rows_of(info)
    np.testing.assert_allclose(got["a"], df.sort_values("a")["a"])


def test_numpy_npz_and_structured_npy(tmp_path, ray_cluster):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype(np.float32), np.arange(40) % 2
    np.savez(tmp_path / "d.npz", x=x, label=y)
    info = inspect_source(DataConfig(source=str(tmp_path / "d.npz")))
    assert info.format == "numpy" and info.input_columns == ["x_0", "x_1", "x_2"]
    got = read_all(info)
    np.testing.assert_allclose(got[["x_0", "x_1", "x_2"]].to_numpy(dtype=np.float32), x)
    assert got["label"].tolist() == y.tolist()
    entry = prepare(info, SplitConfig(), PreprocessConfig(scaler="minmax"), tmp_path / "cache")
    assert sum(entry.counts.values()) == 40
    # Min-max scaling fitted on train: the train split spans exactly [0, 1] per feature.
    train = entry.dataset("train").take_batch(100)[FEATURES]
    np.testing.assert_allclose(train.min(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(train.max(axis=0), 1.0, atol=1e-6)

    structured = np.zeros(10, dtype=[("h", "f8"), ("w", "f8"), ("label", "i8")])
    structured["label"] = np.arange(10) % 2
    np.save(tmp_path / "s.npy", structured)
    info = inspect_source(DataConfig(source=str(tmp_path / "s.npy")))
    assert info.input_columns == ["h", "w"] and len(read_all(info)) == 10


def write_image_folder(root, per_class=6, size=(10, 12), mode="RGB"):
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(["cat", "dog", "emu"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            shape = (*size, 3) if mode == "RGB" else size
            pixels = np.clip(rng.normal(60 * (k + 1), 20, size=shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_image_folder_labels_come_from_sorted_folder_names(tmp_path, ray_cluster):
    root = write_image_folder(tmp_path / "imgs")
    info = inspect_source(DataConfig(source=str(root)))
    assert info.format == "images" and info.classes == ["cat", "dog", "emu"] and len(info.files) == 18
    entry = prepare(
        info,
        SplitConfig(val=0.17, test=0.17),
        PreprocessConfig(image_size=[8, 8], augment=True),
        tmp_path / "c",
    )
    pre = entry.preprocessor
    assert pre.classes == ["cat", "dog", "emu"] and pre.image["shape"] == [3, 8, 8]
    assert pre.num_features == 3 * 8 * 8 and pre.image["augment"]
    train = entry.dataset("train").take_batch(100)
    assert train[FEATURES].shape == (entry.counts["train"], 192)
    assert abs(float(train[FEATURES].mean())) < 0.2  # normalized with the train split's statistics
    assert sorted(set(train[LABEL].tolist())) == [0, 1, 2]

    from PIL import Image

    image = np.asarray(Image.open(root / "dog" / "0.png"))
    assert pre.features(pd.DataFrame({"image": [image]})).shape == (1, 192)


def write_mnist_raw(folder, n_train=30, n_test=12):
    """MNIST's own on-disk format (idx-ubyte), as torchvision's download leaves it."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">iiii", 2051, n, 28, 28) + images.tobytes()
        )
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, n) + labels.tobytes())


MNIST_CLASSES = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four"]


def test_torchvision_mnist_is_read_by_torchvision_and_converted_once_to_images(tmp_path, ray_cluster):
    cache = tmp_path / "cache"
    write_mnist_raw(cache / "torchvision" / "MNIST" / "raw")
    info = inspect_source(DataConfig(source="torchvision:MNIST"), cache_root=cache)
    assert info.format == "image_parquet" and info.is_images and info.input_columns == ["image"]
    assert info.image_mode == "L" and info.classes[:5] == MNIST_CLASSES and len(info.classes) == 10
    converted = cache / "torchvision" / "MNIST.parquet"
    assert sorted(p.name for p in converted.iterdir()) == ["_done.json", "part-0.parquet", "part-1.parquet"]
    mtime = (converted / "part-0.parquet").stat().st_mtime_ns
    rows = read_all(info)
    # Each row: the image as torchvision gives it, its class name and its index (train rows first).
    assert len(rows) == 42 and rows["index"].tolist() == list(range(42))
    assert rows["label"].tolist()[:3] == MNIST_CLASSES[:3] and rows["image"][0].shape == (28, 28)
    import torchvision

    first = np.asarray(torchvision.datasets.MNIST(str(cache / "torchvision"), train=True).data[0])
    np.testing.assert_array_equal(rows["image"][0], first)
    again = inspect_source(DataConfig(source="torchvision:MNIST"), cache_root=cache)
    assert again.fingerprint == info.fingerprint
    assert (converted / "part-0.parquet").stat().st_mtime_ns == mtime  # not converted again


def test_a_conversion_by_an_older_trainflow_is_converted_again(tmp_path, ray_cluster):
    cache = tmp_path / "cache"
    write_mnist_raw(cache / "torchvision" / "MNIST" / "raw")
    old = cache / "torchvision" / "MNIST.parquet"  # one column per pixel, as 0.3.0 wrote it
    old.mkdir()
    pd.DataFrame({"pixel_0": np.zeros(3, np.uint8), "label": [0, 1, 2]}).to_parquet(old / "part-0.parquet")
    (old / "_done.json").write_text('{"rows": 3, "classes": ["0 - zero"]}')
    info = inspect_source(DataConfig(source="torchvision:MNIST"), cache_root=cache)
    assert info.format == "image_parquet" and len(read_all(info)) == 42


def test_a_torchvision_dataset_prepares_through_the_image_path(tmp_path, ray_cluster):
    cache = tmp_path / "cache"
    write_mnist_raw(cache / "torchvision" / "FashionMNIST" / "raw", n_train=40, n_test=20)
    cfg = DataConfig(source="torchvision:FashionMNIST", image_mode="RGB", limit=50)
    info = inspect_source(cfg, cache_root=cache)
    entry = prepare(
        info, SplitConfig(val=0.2, test=0.2), PreprocessConfig(image_size=[16, 20], augment=True), cache
    )
    pre = entry.preprocessor
    assert pre.classes[:2] == ["T-shirt/top", "Trouser"] and pre.input_columns == ["image"]
    assert pre.image["shape"] == [3, 16, 20] and pre.image["augment"] and len(pre.image["mean"]) == 3
    assert sum(entry.counts.values()) == 50
    train = entry.dataset("train").take_batch(100)
    assert train[FEATURES].shape == (entry.counts["train"], 3 * 16 * 20)
    assert abs(float(train[FEATURES].mean())) < 0.2  # normalized with the train split's statistics
    # The split hashes each image's index: another seed places other rows.
    other = prepare(
        info, SplitConfig(val=0.2, test=0.2, seed=1), PreprocessConfig(image_size=[16, 20]), cache
    )
    assert other.key != entry.key
    # A raw image predicts through the same preprocessing: an array, or a PNG file's bytes.
    import io

    from PIL import Image

    image = read_all(info)["image"][0]  # in data.image_mode: grey MNIST pixels as RGB
    assert image.shape == (28, 28, 3)
    png = io.BytesIO()
    Image.fromarray(image[:, :, 0]).save(png, format="PNG")  # a grey PNG, converted to RGB
    x = pre.features(pd.DataFrame({"image": [image, png.getvalue()]}))
    np.testing.assert_allclose(x[0], x[1], atol=1e-6)


def test_torchvision_without_files_or_network_says_where_to_put_them(tmp_path, monkeypatch):
    import torchvision.datasets

    # No network, on any machine: torchvision's own download code runs, against a
    # loopback port where nothing listens (9, discard), and no proxy is asked.
    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with pytest.raises(
        DataError,
        match=r"(?s)FashionMNIST: not in .* and the download failed \(Error downloading .*Tried http://127\.0\.0\.1:9/",
    ):
        inspect_source(DataConfig(source="torchvision:FashionMNIST"), cache_root=tmp_path)
    with pytest.raises(DataError, match=r"torchvision:SVHN: use one of MNIST, FashionMNIST, CIFAR10"):
        inspect_source(DataConfig(source="torchvision:SVHN"), cache_root=tmp_path)


# Each bad input: its own error, naming the column or file, before training.


@pytest.mark.parametrize(
    "write, cfg, message",
    [
        (
            lambda p: frame().assign(label=frame()["a"]).to_csv(p, index=False),
            {"categorical_columns": ["color"]},
            r"data\.label_column 'label' in .*d\.csv is double; a class label must hold integers",
        ),
        (
            lambda p: frame().to_csv(p, index=False),
            {},
            r"data\.feature_columns: color \(string\) in .* are not numeric",
        ),
        (
            lambda p: frame().to_csv(p, index=False),
            {"categorical_columns": ["a", "color"]},
            r"data\.categorical_columns: a \(double\) in .* hold neither strings",
        ),
        (
            lambda p: frame().to_csv(p, index=False),
            {"categorical_columns": ["color"], "classes": ["x", "y"]},
            r"data\.classes \['x', 'y'\] are not ints like the label column 'label'",
        ),
        (
            lambda p: p.write_text(""),
            {},
            r"data\.source .*d\.csv: cannot read .*d\.csv as csv: CSV parse error: Empty CSV file",
        ),
    ],
)
def test_bad_schemas_fail_in_the_driver(tmp_path, write, cfg, message):
    write(tmp_path / "d.csv")
    with pytest.raises(DataError, match=message):
        inspect_source(DataConfig(source=str(tmp_path / "d.csv"), **cfg))


def test_an_unreadable_file_in_a_folder_is_named(tmp_path):
    (tmp_path / "pq").mkdir()
    frame().to_parquet(tmp_path / "pq" / "part-0.parquet")
    (tmp_path / "pq" / "part-1.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"cannot read .*part-1\.parquet as parquet"):
        inspect_source(DataConfig(source=str(tmp_path / "pq"), categorical_columns=["color"]))


def with_values(column, values):
    df = frame()
    df[column] = df[column].astype(object)
    for i, v in enumerate(values):
        df.loc[i, column] = v
    return df


@pytest.mark.parametrize(
    "df, cfg, message",
    [
        (
            with_values("a", [np.nan, None, np.nan]).astype({"a": float}),
            {},
            r"column 'a' has 3 missing values \(blank, null or NaN\) in 60 rows; set data\.missing=drop",
        ),
        (
            with_values("a", [np.inf, -np.inf]).astype({"a": float}),
            {},
            r"column 'a' holds inf in 2 of 60 rows",
        ),
        (
            frame(),
            {"classes": [0, 1]},
            r"data\.label_column 'label': labels \[2\] in .* are outside data\.classes \[0, 1\]; list them",
        ),
        (frame().iloc[:0], {}, r"data\.source .*: no rows"),
        (frame().assign(label=1), {}, r"needs at least 2 classes, found \[1\]"),
    ],
)
def test_bad_rows_fail_with_the_column_and_the_count(tmp_path, ray_cluster, df, cfg, message):
    df.to_parquet(tmp_path / "d.parquet")
    info = inspect_source(
        DataConfig(source=str(tmp_path / "d.parquet"), categorical_columns=["color"], **cfg)
    )
    with pytest.raises(DataError, match=message):
        prepare(info, SplitConfig(), PreprocessConfig(), tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_missing_values_are_dropped_and_counted_when_asked(tmp_path, ray_cluster):
    df = with_values("a", [np.nan, np.nan]).astype({"a": float})
    df.loc[5, "color"] = None
    df.to_parquet(tmp_path / "d.parquet")
    info = inspect_source(
        DataConfig(source=str(tmp_path / "d.parquet"), categorical_columns=["color"], missing="drop")
    )
    entry = prepare(info, SplitConfig(), PreprocessConfig(), tmp_path / "cache")
    assert entry.dropped == 3 and sum(entry.counts.values()) == 57


def test_large_jpegs_are_read_transformed_and_written_in_bounded_pieces(tmp_path, ray_cluster, monkeypatch):
    import pyarrow.parquet as pq
    from PIL import Image

    from trainflow.pipelines.data import readers
    from trainflow.pipelines.data.entry import split_files
    from trainflow.pipelines.data.preprocess import image_chunk_rows
    from trainflow.pipelines.training import inputs

    rng = np.random.default_rng(0)
    for i in range(100):
        (tmp_path / "jpegs" / ("a" if i % 2 else "b")).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "jpegs" / ("a" if i % 2 else "b") / f"{i}.jpg")
    info = inspect_source(DataConfig(source=str(tmp_path / "jpegs")))
    # A worker decodes images until their pixels pass IMAGE_BATCH_BYTES, not a fixed count.
    monkeypatch.setattr(readers, "IMAGE_BATCH_BYTES", 1 << 20)
    sizes = [len(b) for f in plan_fragments(info) for b in fragment_batches(info, f)]
    assert sum(sizes) == 100 and max(sizes) == -(-(1 << 20) // (224 * 224 * 3))
    monkeypatch.undo()
    # The float32 rows are made and written a chunk of image_chunk_rows at a time.
    entry = prepare(
        info, SplitConfig(val=0.1, test=0.1), PreprocessConfig(image_size=[224, 224]), tmp_path / "c"
    )
    chunk = image_chunk_rows([3, 224, 224])
    groups = [pq.ParquetFile(p).metadata for p in split_files(entry.split_path("train"))[1]]
    assert chunk < entry.counts["train"] and sum(g.num_rows for g in groups) == entry.counts["train"]
    assert sum(g.num_row_groups for g in groups) >= 2
    assert all(g.row_group(i).num_rows <= chunk for g in groups for i in range(g.num_row_groups))
    # A streamed train split of such rows arrives in chunks of whole batches under STREAM_CHUNK_BYTES.
    rows = inputs.stream_chunk_rows(32, entry.preprocessor.num_features)
    assert rows % 32 == 0 and rows >= 32 and rows * 4 * 3 * 224 * 224 <= inputs.STREAM_CHUNK_BYTES
    assert inputs.stream_chunk_rows(64, 64) == 64 * inputs.STREAM_CHUNK_BATCHES
