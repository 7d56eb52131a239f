"""A prepared split's tensor columns: written as fixed-size binary with their dtype and
shape, read back as the arrays that were written, by Ray Data and in a process."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainflow.pipelines.data import tensors
from trainflow.pipelines.data.entry import read_split, read_split_batches, split_dataset


def _write_split(folder, columns: dict[str, np.ndarray], label: np.ndarray) -> None:
    """Two files, the second of two row groups, as preparing writes a split's fragments."""
    folder.mkdir()
    table = tensors.table(columns, {"label": label})
    pq.write_table(table.slice(0, 7), folder / "part-00000.parquet")
    with pq.ParquetWriter(folder / "part-00001.parquet", table.schema) as writer:
        writer.write_table(table.slice(7, 5))
        writer.write_table(table.slice(12))


def test_tensor_columns_read_back_as_written(tmp_path, ray_cluster):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((20, 3, 2, 2)).astype(np.float32)
    ids = rng.integers(0, 1000, (20, 5))
    label = np.arange(20)
    _write_split(tmp_path / "train", {"features": images, "ids": ids}, label)

    schema = pq.read_schema(tmp_path / "train" / "part-00001.parquet")
    assert schema.field("features").type == pa.binary(3 * 2 * 2 * 4)
    assert tensors.tensor_columns(schema) == {
        "features": (np.dtype(np.float32), (3, 2, 2)),
        "ids": (np.dtype(np.int64), (5,)),
    }

    split = read_split(tmp_path / "train")
    np.testing.assert_array_equal(split["features"], images)
    np.testing.assert_array_equal(split["ids"], ids)
    np.testing.assert_array_equal(split["label"], label)
    # Batches that start inside a row group and span two of them.
    batches = list(read_split_batches(tmp_path / "train", batch_size=4))
    np.testing.assert_array_equal(np.concatenate([b["ids"] for b in batches]), ids)

    dataset = split_dataset(str(tmp_path / "train")).materialize()
    # The decode runs in each file's read task, not in tasks of its own.
    assert "ReadParquet->MapBatches(to_ray)" in dataset.stats(), dataset.stats()
    got = dataset.take_batch(100)
    order = np.argsort(got["label"])
    np.testing.assert_array_equal(got["features"][order], images)
    np.testing.assert_array_equal(got["ids"][order], ids)
    assert got["features"].dtype == np.float32 and got["ids"].dtype == np.int64


def test_a_sliced_column_and_an_empty_one_decode():
    values = np.arange(24, dtype=np.float32).reshape(6, 4)
    table = tensors.table({"features": values}, {})
    np.testing.assert_array_equal(tensors.to_numpy(table.slice(2, 3))["features"], values[2:5])
    assert tensors.to_numpy(table.slice(6))["features"].shape == (0, 4)
    decoded = tensors.to_ray(table.slice(1))
    np.testing.assert_array_equal(decoded.column("features").combine_chunks().to_numpy(), values[1:])
