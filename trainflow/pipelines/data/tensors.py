"""How a prepared split's Parquet holds a tensor per row (``features``, a transform's
array columns): a fixed-size binary column of each row's bytes in C order, the dtype and
shape in the field's metadata.

Parquet writes a list column, such as Ray's tensor type, with a repetition and a
definition level per number; a fixed-size binary column has none, and costs about a
quarter of the CPU to write and a sixth to read (benchmarks/analysis/ingest.md). A
split's readers get tensors back: :func:`to_ray` for Ray Data, :func:`to_numpy` for
batches read in a process.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

TENSOR = b"trainflow.tensor"  # the field metadata's key: {"dtype": ..., "shape": [...]}


def encode(name: str, values: np.ndarray) -> tuple[pa.Field, pa.Array]:
    """The field and column holding ``values`` (one row per tensor) under ``name``."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    shape = list(values.shape[1:])
    width = values.dtype.itemsize * int(np.prod(shape))
    meta = json.dumps({"dtype": values.dtype.str, "shape": shape})
    field = pa.field(name, pa.binary(width), nullable=False, metadata={TENSOR: meta})
    column = pa.FixedSizeBinaryArray.from_buffers(field.type, len(values), [None, pa.py_buffer(values)])
    return field, column


def table(arrays: dict[str, np.ndarray], columns: dict[str, np.ndarray]) -> pa.Table:
    """A table of a tensor column per entry of ``arrays``, then ``columns`` as they are."""
    import pyarrow as pa

    encoded = [encode(name, v) for name, v in arrays.items()]
    plain = [pa.array(v) for v in columns.values()]
    fields = [*(f for f, _ in encoded), *(pa.field(n, c.type) for n, c in zip(columns, plain, strict=True))]
    return pa.Table.from_arrays([*(c for _, c in encoded), *plain], schema=pa.schema(fields))


def tensor_columns(schema: pa.Schema) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The columns of ``schema`` that hold tensors, with each one's dtype and shape."""
    out = {}
    for field in schema:
        meta = (field.metadata or {}).get(TENSOR)
        if meta is not None:
            spec = json.loads(meta)
            out[field.name] = (np.dtype(spec["dtype"]), tuple(spec["shape"]))
    return out


def _array(column, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A binary column's rows as one array of ``shape`` each: a view of its buffer when
    it is one chunk."""
    chunks = [c for c in getattr(column, "chunks", [column]) if len(c)]
    size = int(np.prod(shape))
    parts = [
        np.frombuffer(c.buffers()[1], dtype, count=len(c) * size, offset=c.offset * size * dtype.itemsize)
        for c in chunks
    ]
    if not parts:
        return np.empty((0, *shape), dtype)
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return flat.reshape(-1, *shape)


def to_numpy(batch: pa.RecordBatch | pa.Table) -> dict[str, np.ndarray]:
    """A split's batch as NumPy, a tensor column as an array of its shape per row."""
    tensors = tensor_columns(batch.schema)
    return {
        name: _array(batch.column(name), *tensors[name])
        if name in tensors
        else batch.column(name).to_numpy(zero_copy_only=False)
        for name in batch.schema.names
    }


def to_ray(table: pa.Table) -> pa.Table:
    """A split's table with each tensor column in Ray's tensor type, as Ray Data's
    ``map_batches`` takes it (``batch_format="pyarrow"``)."""
    from ray.data.extensions import ArrowTensorArray

    for name, (dtype, shape) in tensor_columns(table.schema).items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, ArrowTensorArray.from_numpy(_array(table.column(i), dtype, shape)))
    return table
