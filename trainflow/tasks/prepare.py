"""The ingest and preprocess steps: check the source, then prepare its splits, each
cached across flow runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from trainflow.cluster.session import connected
from trainflow.config import ConfigError, PipelineConfig, PreprocessConfig
from trainflow.files import is_uri, redacted
from trainflow.pipelines.data import entry, schema, tokenizer, transform
from trainflow.pipelines.data import prepare as prep
from trainflow.tasks.results import Prepared
from trainflow.tasks.steps import as_config, expect, step
from trainflow.workspace import cache_folder, cache_location

# Ingest's and preprocess's records, at absolute paths (storage at "/"): a preprocess record
# sits inside its entry, so deleting the entry forgets it; keys hold the input's fingerprint.
# A cache at a URI keeps none (it could outlive its entry): the task finds the entry itself.
CACHE_RECORDS = Path("/")


def ingest_cache_key(context, parameters: dict[str, Any]) -> str:
    """The data config and objective, the input's fingerprint (file list, sizes, mtimes or
    content) and the code that inspects it: trainflow's, and a preprocess.transform's
    (whose output's columns it checks)."""
    config = as_config(parameters["config"], "ingest")
    cache = cache_folder(config)
    parts = [
        config.data.model_dump_json(),
        config.objective,
        schema.source_fingerprint(config.data, cache),
        entry.code_version(),
    ]
    transform_path = tokenizer.transform_of(config)
    if transform_path:
        parts += [transform_path, transform.code_hash(transform_path)]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return str(cache / "ingest" / key)


def preprocess_cache_key(context, parameters: dict[str, Any]) -> str | None:
    """The prepared entry's own key; the record lives in the entry's folder (none on a URI)."""
    config = as_config(parameters["config"], "preprocess")
    if is_uri(cache_location(config)) or not isinstance(parameters["source"], schema.SourceInfo):
        return None
    source = parameters["source"]
    key = entry.cache_key(source, config.data.split, preprocessing(config, source))
    return str(cache_folder(config) / key / "prefect-task-record")


def _retry_unless_refused(task, task_run, state) -> bool:
    # Bad data, or a step handed the wrong thing, stays so on every retry; a lost node may not.
    return not isinstance(state.result(raise_on_failure=False), schema.DataError | ConfigError)


@step(name="ingest", cache_key_fn=ingest_cache_key, persist_result=True, result_storage=CACHE_RECORDS)
def ingest(
    config: PipelineConfig | dict | str, checked: schema.SourceInfo | None = None
) -> schema.SourceInfo:
    """Check ``config``'s data source, its columns and types, and fingerprint it; in this
    process, reading no rows. Cached across flow runs while the input is unchanged.
    ``checked``: the source as the run's checks (``trainflow.run_checks``) found it already."""
    config = as_config(config, "ingest")
    info = checked or schema.inspect_source(
        config.data,
        cache_folder(config),
        objective=config.objective,
        transform=tokenizer.transform_of(config),
    )
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


@step(
    name="preprocess",
    cache_key_fn=preprocess_cache_key,
    persist_result=True,
    result_storage=CACHE_RECORDS,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_unless_refused,
)
def preprocess(config: PipelineConfig | dict | str, source: schema.SourceInfo) -> Prepared:
    """Check the rows, split, fit on train and write every split as Parquet under the
    cache, on Ray tasks (in this process for one small file, or on its threads for a table
    when the Ray cluster is this machine alone); or reuse a finished entry. Connects to
    Ray when the caller has not (``cluster.connected``), unless one small file needs none."""
    config = as_config(config, "preprocess")
    expect(source, schema.SourceInfo, "preprocess", "source", "ingest")
    if not prep.prepares_in_driver(source, local=False):
        connected(config, get_run_logger())
    prepared = prep.prepare(source, config.data.split, preprocessing(config, source), cache_location(config))
    _log_prepared(get_run_logger(), prepared)
    pre = prepared.preprocessor
    return Prepared(
        path=str(prepared.path),
        counts=prepared.counts,
        preprocessor=pre.to_dict(),
        num_features=pre.num_features,
        num_outputs=pre.num_outputs,
        fingerprint=prepared.key,
        reused=prepared.reused,
        dropped=prepared.dropped,
        source_fingerprint=source.fingerprint,
        preparation=config.preparation_hash(),
    )


def preprocessing(config: PipelineConfig, source: schema.SourceInfo) -> PreprocessConfig:
    """``config.preprocess``; on images, the fields the config leaves null (``image_size``,
    ``image_mean``, ``image_std``) as the model's own image processing has them (an ``hf:``
    model's image processor: :meth:`~trainflow.pipelines.models.kinds.ModelFamily.image_processing`)."""
    cfg = config.preprocess
    if not source.is_images:
        return cfg
    from trainflow.pipelines.models.kinds import family

    found = family(config.model.kind).image_processing(config.model.kind)
    if not found:
        return cfg
    if cfg.image_mean is not None:  # the config's normalization, with the processor's size
        found = {k: v for k, v in found.items() if k == "image_size"}
    return cfg.model_copy(update={k: v for k, v in found.items() if getattr(cfg, k) is None})


def _log_prepared(logger, prepared: entry.PreparedEntry) -> None:
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
