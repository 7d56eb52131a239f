"""The ingest and preprocess tasks: check the source, then prepare its splits, each
cached across flow runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from trainflow.config import PipelineConfig
from trainflow.files import is_uri, redacted
from trainflow.pipelines.data import entry
from trainflow.pipelines.data import prepare as prep
from trainflow.pipelines.data import schema as data
from trainflow.tasks.results import Prepared
from trainflow.workspace import cache_folder, cache_location

# Ingest and preprocess cache across flow runs. Each record is a file at an absolute
# path in the local cache folder (hence the result storage at "/"): the preprocess
# record sits inside the prepared entry it describes, so deleting an entry (or the
# whole cache) also forgets that it was made, and a run never reuses a record whose
# splits are gone. The keys hold the input's fingerprint, so a changed file misses.
# A cache at a URI keeps no preprocess record (it could outlive the entry it names):
# the preprocess task finds the finished entry itself, one small read.
CACHE_RECORDS = Path("/")


def ingest_cache_key(context, parameters: dict[str, Any]) -> str:
    """The data config and task, the input's fingerprint (file list, sizes, mtimes or
    content) and the code that inspects it."""
    config: PipelineConfig = parameters["config"]
    cache = cache_folder(config)
    parts = [
        config.data.model_dump_json(),
        config.task,
        data.source_fingerprint(config.data, cache),
        entry.code_version(),
    ]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return str(cache / "ingest" / key)


def preprocess_cache_key(context, parameters: dict[str, Any]) -> str | None:
    """The prepared entry's own key; the record lives in the entry's folder (none on a URI)."""
    config: PipelineConfig = parameters["config"]
    if is_uri(cache_location(config)):
        return None
    key = entry.cache_key(parameters["source"], config.data.split, config.preprocess)
    return str(cache_folder(config) / key / "prefect-task-record")


@task(
    name="ingest",
    cache_key_fn=ingest_cache_key,
    persist_result=True,
    result_storage=CACHE_RECORDS,
)
def ingest(config: PipelineConfig, checked: data.SourceInfo | None = None) -> data.SourceInfo:
    """Check the source and its columns and fingerprint it; runs in the driver, before Ray.
    ``checked``: the source as the run's checks (``trainflow.checks``) already found it."""
    info = checked or data.inspect_source(config.data, cache_folder(config), task=config.task)
    get_run_logger().info(
        "source %s (%s, %d files): %d features, label %r, fingerprint %s",
        info.source,
        info.format,
        len(info.files),
        len(info.input_columns),
        info.label_column,
        info.fingerprint,
    )
    return info


@task(
    name="preprocess",
    cache_key_fn=preprocess_cache_key,
    persist_result=True,
    result_storage=CACHE_RECORDS,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=lambda task, task_run, state: (
        not isinstance(state.result(raise_on_failure=False), data.DataError)
    ),
)
def preprocess(config: PipelineConfig, source: data.SourceInfo) -> Prepared:
    """Check the rows, split, fit on train, write every split as Parquet under the cache
    (or reuse a finished entry)."""
    logger = get_run_logger()
    prepared = prep.prepare(source, config.data.split, config.preprocess, cache_location(config))
    pre = prepared.preprocessor
    if prepared.dropped:
        logger.warning("dropped %d rows with a missing value (data.missing=drop)", prepared.dropped)
    target = "a number to predict" if pre.is_regression else f"{len(pre.classes)} classes"
    logger.info(
        "%s prepared splits %s at %s: %s",
        "reused" if prepared.reused else "wrote",
        prepared.counts,
        redacted(prepared.path),
        target,
    )
    return Prepared(
        path=str(prepared.path),
        counts=prepared.counts,
        preprocessor=pre.to_dict(),
        num_features=pre.num_features,
        num_outputs=pre.num_outputs,
        fingerprint=prepared.key,
        reused=prepared.reused,
        dropped=prepared.dropped,
    )
