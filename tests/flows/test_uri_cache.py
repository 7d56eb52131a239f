"""A run whose prepared splits and Ray Train storage are in an object store (`cache:
s3://...`, `storage: s3://...`): the splits are written by Ray tasks, read by the training
workers and by Ray Data, and found again by the next run, all through the store, with
nothing of them on the driver's disk; the checkpoints are written there by Ray Train and
the best is copied here for evaluation and the registry.

The store is moto's S3 server on loopback (the S3 API over HTTP, as boto and pyarrow speak
it to AWS), reached as any S3-compatible endpoint is: the URI names the endpoint, the
region and the credentials.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainflow.cluster.checks import PreflightError
from trainflow.config import ConfigError, load_config
from trainflow.files import filesystem
from trainflow.flows.training import training_pipeline
from trainflow.pipelines.data.entry import PUBLISHED, finished_entry
from trainflow.run_checks import before_run
from trainflow.tasks import preprocess

moto_server = pytest.importorskip(
    "moto.server", reason="moto[server] (the local S3 endpoint) is not installed"
)


@pytest.fixture(scope="module")
def s3_endpoint():
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


def s3_uri(endpoint: str, path: str) -> str:
    return (
        f"s3://key:secret@{path}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
        "&allow_bucket_creation=true"
    )


def two_csv_files(folder: Path) -> Path:
    """Two files, so that Ray tasks prepare them (one small file is prepared in the driver)."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(2):
        x = rng.normal(size=(150, 4))
        pd.DataFrame({**{f"f{j}": x[:, j] for j in range(4)}, "label": (x[:, 0] > 0).astype(int)}).to_csv(
            folder / f"part-{i}.csv", index=False
        )
    return folder


@pytest.mark.slow
# The last task call runs outside a flow: Prefect warns its logs have no flow run.
@pytest.mark.filterwarnings("ignore:Logger .prefect.task_runs. attempted to send logs")
def test_a_run_prepares_trains_and_reuses_its_splits_with_cache_and_storage_on_s3(
    ray_cluster, prefect_harness, trainflow_home, tmp_path, s3_endpoint
):
    cache, storage = s3_uri(s3_endpoint, "trainflow/cache"), s3_uri(s3_endpoint, "trainflow/runs")
    config = load_config(
        {
            "name": "s3cache",
            "data": {"source": str(two_csv_files(tmp_path / "data"))},
            "train": {"epochs": 2, "batch_size": 32},
            "scaling": {"num_workers": 1},
            "registry": {"min_value": 0.0},
            "cache": cache,
            "storage": storage,
        }
    )
    result = training_pipeline(config=config)
    assert result.registered.version == "1" and result.test_metrics["accuracy"] > 0.8
    assert not result.prepared_reused and result.cached == []

    # Ray Train's run is in the bucket (with trainflow's record of it); the best checkpoint
    # was copied here whole, and the registered version holds it.
    fs, runs = filesystem(storage)
    (run,) = fs.get_file_info(fs_selector(runs))
    stored = {i.base_name for i in fs.get_file_info(fs_selector(run.path))}
    assert "trainflow-run.json" in stored and any(n.startswith("checkpoint_") for n in stored)
    copy = Path(result.checkpoint)
    assert copy.parent == trainflow_home / "checkpoints" / run.base_name and copy.name in stored
    assert (copy / "model.pt").is_file() and (copy.parent / "reports").is_dir()

    # The entry is in the bucket, published by its marker; the driver's cache holds no split.
    fs, root = filesystem(cache)
    entries = fs.get_file_info(fs_selector(root))
    assert len(entries) == 1, entries
    key = entries[0].base_name
    entry = finished_entry(cache, key)
    assert entry is not None and entry.path.startswith("s3://") and "/attempt-" in entry.path
    published = fs.get_file_info(fs_selector(f"{root}/{key}"))
    assert sorted(i.base_name for i in published)[-1] == PUBLISHED and len(published) == 2
    assert entry.dataset("train").count() == entry.counts["train"]  # Ray Data reads it too
    assert not list((trainflow_home / "cache").rglob("*.parquet"))

    # The next run finds it there (no Prefect record names it: the task looks itself).
    again = preprocess(config, before_run(config).source)
    assert again.reused and again.path == entry.path
    assert len(fs.get_file_info(fs_selector(f"{root}/{key}"))) == 2  # no second attempt


def test_a_sweep_on_an_object_store_is_refused_in_one_line(trainflow_home):
    config = load_config(
        {"storage": "s3://key:secret@bucket/runs", "sweep": {"space": {"train.lr": {"choice": [0.1]}}}}
    )
    with pytest.raises(
        ConfigError,
        match=r"^invalid config: storage: a sweep keeps its trials in a folder, not at s3://bucket/runs; ",
    ):
        before_run(config, sweep=True)


def test_an_unreachable_cache_fails_the_checks_in_one_line(trainflow_home):
    config = load_config({"cache": s3_uri("127.0.0.1:9", "trainflow/cache")})
    with pytest.raises(PreflightError) as e:
        before_run(config)
    message = str(e.value)
    assert message.startswith("cache: cannot write to s3://trainflow/cache?endpoint_override=127.0.0.1:9")
    assert "\n" not in message and "secret" not in message and "check the address" in message


def test_an_entry_is_read_only_once_published(tmp_path, s3_endpoint):
    from trainflow.files import join, published_attempt, publishing_attempt, write_text

    location = s3_uri(s3_endpoint, f"trainflow/attempts-{tmp_path.name}")
    with pytest.raises(RuntimeError):
        with publishing_attempt(location, PUBLISHED) as folder:
            write_text(join(folder, "part"), "half")
            raise RuntimeError("a writer fails")
    assert published_attempt(location, PUBLISHED) is None
    fs, root = filesystem(location)
    assert fs.get_file_info(fs_selector(root)) == []  # its attempt is gone
    with publishing_attempt(location, PUBLISHED) as first:
        pass
    with publishing_attempt(location, PUBLISHED) as second:
        pass
    # The first finished entry stays; a later writer's attempt is dropped.
    assert published_attempt(location, PUBLISHED) == first != second
    assert len(fs.get_file_info(fs_selector(root))) == 2


def fs_selector(path: str):
    import pyarrow.fs

    return pyarrow.fs.FileSelector(path, allow_not_found=True)
