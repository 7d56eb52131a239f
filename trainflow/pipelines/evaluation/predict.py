"""Batch prediction: new rows in, a Parquet folder of predictions out.

Its input is checked first (:mod:`.predict_input`: file metadata only, in the driver), so
an input that lacks a column the model needs fails before any Ray worker starts. :func:`predict_to_parquet`
streams the rows through an actor pool that applies the checkpoint's saved
preprocessing, and writes the result to a temporary folder renamed into place when
complete: readers never see half an output.
"""

from __future__ import annotations

from trainflow.files import publishing_folder
from trainflow.pipelines.evaluation.evaluate import predict_rows
from trainflow.pipelines.evaluation.predict_input import InputInfo, check_output


def predict_to_parquet(
    info: InputInfo,
    checkpoint_dir: str,
    output: str,
    *,
    version: str,
    input_columns: list[str],
    batch_size: int,
    concurrency: int = 1,
    num_gpus: float = 0,
) -> int:
    """Predict every input row and write Parquet into ``output``; return the row count.

    The output holds the input's columns that the model does not read (ids, a label if
    present), ``prediction``, one ``proba_<class>`` column per class and ``model_version``;
    none of the model's input columns (``input_columns``: numeric and categorical, or the
    raw columns its ``preprocess.transform`` takes).
    """
    from trainflow.cluster.session import on_the_cluster

    args = (info, checkpoint_dir, output, version, input_columns, batch_size, concurrency, num_gpus)
    return on_the_cluster(_predict_to_parquet, *args)


def _predict_to_parquet(
    info: InputInfo,
    checkpoint_dir: str,
    output: str,
    version: str,
    input_columns: list[str],
    batch_size: int,
    concurrency: int,
    num_gpus: float,
) -> int:
    import pyarrow.parquet as pq
    import ray
    import ray.data

    from trainflow.cluster.preflight import fit_gpu_actors

    out = check_output(output)
    fit_gpu_actors(num_gpus, ray.cluster_resources())
    ds = ray.data.read_parquet(info.files) if info.format == "parquet" else ray.data.read_csv(info.files)
    keep = tuple(c for c in info.columns if c not in input_columns)
    predicted = predict_rows(
        ds,
        checkpoint_dir,
        batch_size,
        concurrency=concurrency,
        num_gpus=num_gpus,
        version=version,
        keep=keep,
    )
    with publishing_folder(out) as tmp:
        predicted.write_parquet(str(tmp))
        return sum(pq.ParquetFile(f).metadata.num_rows for f in tmp.glob("*.parquet"))
