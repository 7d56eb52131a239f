"""Training: its settings, the loop's parts (schedules, precision, clipping, early
stopping), its inputs, its progress rows, and whole runs resuming exactly where they
stopped. Fits run on real Ray Train workers over the prepared digits."""

import json
import math
import os
import pickle
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.controller_probe import ControllerModules, controller_imported_torch, controller_record
from trainflow import ray_internals
from trainflow.config import ConfigError, DataConfig, PipelineConfig, PreprocessConfig, load_config
from trainflow.config.outputs import CheckpointSection
from trainflow.pipelines.data.entry import read_split_batches, split_bytes
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.models.checkpoint import load_checkpoint
from trainflow.pipelines.training import inputs, optim
from trainflow.pipelines.training import loop as training_loop
from trainflow.pipelines.training.in_process import best_kept, on_a_folder, run_folder, save_kept
from trainflow.pipelines.training.progress import PROGRESS_NAMESPACE, ProgressLog, follow_progress
from trainflow.pipelines.training.run import build_trainer, run_training
from trainflow.pipelines.training.settings import PreparedSplits, TrainSettings
from trainflow.testing import small_config


def test_settings_hold_each_value_once_and_cross_to_workers_whole():
    config = load_config(small_config(train={"epochs": 3, "lr": 0.05}))
    settings = TrainSettings.from_config(
        config,
        preprocessor={"classes": [0, 1], "mean": [0.5]},
        num_features=64,
        num_outputs=10,
        memory_splits={"val": "/prepared/val"},
        progress="run-progress",
    )
    assert settings.train is config.train and settings.train.lr == 0.05
    assert settings.model_spec == {
        "kind": "mlp",
        "num_features": 64,
        "num_outputs": 10,
        "dropout": config.model.dropout,
        "hidden_sizes": [32],
        "parameters": {"total": 64 * 32 + 32 + 32 * 10 + 10, "trainable": 64 * 32 + 32 + 32 * 10 + 10},
    }
    assert settings.placements is None
    assert pickle.loads(pickle.dumps(settings)) == settings  # what Ray does to reach the workers


def test_settings_refuse_what_cannot_cross_naming_it():
    def settings(**values):
        given = {"preprocessor": {}, "num_features": 64, "num_outputs": 10, **values}
        return TrainSettings.from_config(PipelineConfig(), **given)

    # A NumPy scalar from a fit is no JSON (every checkpoint saves the preprocessor as JSON).
    with pytest.raises(
        ConfigError, match=r"^train settings: preprocessor\.mean\[1\]: a float32 cannot be passed"
    ):
        settings(preprocessor={"mean": [0.0, np.float32(1.5)]})
    with pytest.raises(
        ConfigError, match=r"^train settings: preprocessor\.std\[0\]: nan is not a finite number"
    ):
        settings(preprocessor={"std": [float("nan")]})
    with pytest.raises(
        ConfigError, match=r"^train settings: preprocessor\.categorical: key 3 must be a string"
    ):
        settings(preprocessor={"categorical": {3: ["a"]}})
    with pytest.raises(ConfigError, match=r"^train settings: memory_splits\.val: a PosixPath"):
        settings(memory_splits={"val": Path("/prepared/val")})
    # The model must fit the data: a cnn needs a square number of features.
    with pytest.raises(ConfigError, match=r"model\.image_shape: 10 features are not a square image"):
        settings(num_features=10)


def test_lr_schedules_warm_up_then_decay():
    def factors(scheduler, **kw):
        settings = {"epochs": 10, "warmup_epochs": 0, "step_size": 3, "gamma": 0.5, **kw}
        return [optim.lr_factor(e, scheduler=scheduler, **settings) for e in range(settings["epochs"])]

    assert factors("none") == [1.0] * 10
    assert factors("step") == [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125]
    cosine = factors("cosine", warmup_epochs=2)
    assert cosine[:3] == [pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0]
    assert all(a > b for a, b in zip(cosine[2:], cosine[3:], strict=False))  # decays after warm-up
    assert cosine[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8)))


def test_early_stopping_counts_epochs_without_improvement():
    stop = optim.EarlyStopping("val_loss", "min", patience=2, min_delta=0.01)
    assert [stop.update({"val_loss": v}) for v in (1.0, 0.9, 0.895, 0.95)] == [False, False, False, True]
    resumed = optim.EarlyStopping("val_loss", "min", patience=2, min_delta=0.01)
    resumed.load_state_dict(stop.state_dict())
    assert (resumed.best, resumed.bad_epochs) == (0.9, 2)
    assert optim.EarlyStopping("val_accuracy", "max", 1, 0.0).update({"val_accuracy": 0.5}) is False


def _batches(n=4, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {FEATURES: torch.randn(size, 8, generator=g), LABEL: torch.randint(0, 3, (size,), generator=g)}
    ] * n


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_autocasts_on_the_cpu(precision):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    seen = []
    model[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    p = optim.Precision(precision, torch.device("cpu"))
    assert p.scaler.is_enabled() == (precision == "16-mixed")
    before = [w.detach().clone() for w in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = training_loop.train_epoch(model, _batches(), opt, nn.CrossEntropyLoss(), p)
    assert math.isfinite(loss)
    assert set(seen) == {optim.AUTOCAST_DTYPES[precision]}
    assert all(w.dtype == torch.float32 for w in model.parameters())  # master weights stay fp32
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_auto_precision_is_full_on_the_cpu():
    p = optim.Precision("auto", torch.device("cpu"))
    assert p.dtype is None and not p.scaler.is_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_precision_is_bf16_on_a_gpu_that_has_it():
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    assert optim.Precision("auto", torch.device("cuda")).dtype == expected


def test_gradient_clipping_bounds_each_update():
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    before = torch.cat([w.detach().flatten() for w in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    training_loop.train_epoch(model, _batches(n=1), opt, nn.CrossEntropyLoss(), grad_clip_norm=0.01)
    after = torch.cat([w.detach().flatten() for w in model.parameters()])
    assert (after - before).norm() == pytest.approx(0.01, rel=1e-4)  # lr x clipped norm


def test_the_trainer_keeps_and_places_what_the_config_says(tmp_path):
    """checkpoint.keep, its metric and mode, scaling.placement_strategy and the retries
    reach Ray Train's own configs as given (no run: Ray Train's to honour them)."""
    config = load_config(
        small_config(
            checkpoint={"keep": 3, "metric": "val_loss", "mode": "min"},
            scaling={"num_workers": 2, "placement_strategy": "SPREAD"},
            failure={"max_failures": 4},
        )
    )
    settings = TrainSettings.from_config(config, preprocessor={}, num_features=64, num_outputs=10)
    trainer = build_trainer(settings, None, run_name="placed", storage_path=str(tmp_path))
    kept = trainer.run_config.checkpoint_config
    assert (kept.num_to_keep, kept.checkpoint_score_attribute, kept.checkpoint_score_order) == (
        3,
        "val_loss",
        "min",
    )
    assert trainer.scaling_config.placement_strategy == "SPREAD"
    assert trainer.scaling_config.num_workers == 2
    assert trainer.run_config.failure_config.max_failures == 4
    assert (trainer.run_config.name, trainer.run_config.storage_path) == ("placed", str(tmp_path))


def test_momentum_reaches_sgd():
    opt = optim.make_optimizer("sgd", nn.Linear(2, 2).parameters(), 0.1, 0.0, momentum=0.5)
    assert opt.param_groups[0]["momentum"] == 0.5


def test_adamw_decays_the_weights_apart_from_the_gradient_and_adam_through_it():
    """train.optimizer: adamw with weight_decay shrinks each weight by lr x decay whatever
    its gradient (decoupled decay); adam adds the decay to the gradient instead, where its
    normalised step makes a zero-gradient weight move by about lr."""

    def one_step(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        weight = nn.Parameter(torch.full((3,), 2.0))
        opt = optim.make_optimizer(name, [weight], 0.1, 0.01)
        weight.grad = torch.zeros(3)  # the loss does not move it
        opt.step()
        return weight.detach(), torch.full((3,), 2.0)

    after, before = one_step("adamw")
    assert torch.allclose(after, before * (1 - 0.1 * 0.01))  # 2.0 -> 1.998
    after, before = one_step("adam")
    assert torch.allclose(after, before - 0.1, atol=1e-4)  # 2.0 -> 1.9: a normalised step


@pytest.fixture(scope="module")
def prepared(ray_cluster, tmp_path_factory):
    info = inspect_source(DataConfig(limit=600))
    return prepare(info, DataConfig().split, PreprocessConfig(), tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def splits(prepared):
    pre = prepared.preprocessor
    return PreparedSplits(str(prepared.path), pre.to_dict(), pre.num_features, len(pre.classes))


def fit(splits, storage, run_name=None, ray_callbacks=(), **train):
    """Train the small MLP as the train task does, on two workers (what these tests are
    about: shards, every worker stopping together, a rank other than 0 lost); (result,
    the epoch rows, every row). ``ray_callbacks``: Ray Train callbacks, run in the
    controller."""
    rows = []
    result = run_training(
        load_config(small_config(train=train, scaling={"num_workers": 2})),
        splits,
        run_name=run_name or f"test-{uuid.uuid4().hex[:8]}",
        storage=str(storage),
        on_row=rows.append,
        callbacks=ray_callbacks,
    )
    return result, [r for r in rows if r["kind"] == "epoch"], rows


def dataset_managers() -> int:
    """Ray Train's dataset-manager actors this cluster has started, alive or ended."""
    from trainflow.ray_internals.probes import actor_class_names

    return actor_class_names().count("DatasetManager")


def autoscaling_coordinator():
    """Ray's autoscaling coordinator of this cluster (a detached actor, one per cluster,
    started by the first user that asks it for resources), or None."""
    import ray

    try:
        return ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    except ValueError:
        return None


def without_autoscaling_coordinator() -> None:
    """End the cluster's autoscaling coordinator, if another test's run started one."""
    import ray

    if (coordinator := autoscaling_coordinator()) is not None:
        ray.kill(coordinator, no_restart=True)
        deadline = time.monotonic() + 30
        while autoscaling_coordinator() is not None and time.monotonic() < deadline:
            time.sleep(0.05)


def test_progress_rows_arrive_in_order_once_each_and_are_deleted_after(ray_cluster):
    name = f"test-progress-{uuid.uuid4().hex[:8]}"
    rank0, rank1 = ProgressLog(name, 0), ProgressLog(name, 1)
    rows = []
    with follow_progress(name, rows.append, every_s=0.05) as progress:
        rank0.started("node-a", 0, 2)
        rank1.started("node-b", 0, 2)
        rank0.add({"epoch": 1, "train_loss": 0.5})
        # Two writers in the same nanosecond: the second takes the next free key.
        same_ns = [ProgressLog(name, 0), ProgressLog(name, 0)]
        for writer in same_ns:
            writer._last_ns = 1 << 62
        same_ns[0].step({"epoch": 2, "step": 1, "loss": float("nan")})
        same_ns[1].step({"epoch": 2, "step": 2, "loss": 0.25})
    assert [(r["kind"], r.get("epoch")) for r in rows] == [
        ("start", None),
        ("epoch", 1),
        ("step", 2),
        ("step", 2),
    ]
    # A worker group's start is its rank 0's; every rank's is in the workers.
    row = {"kind": "start", "rank": 0, "node_id": "node-a", "start_epoch": 0, "workers": 2, "start_step": 0}
    assert rows[0] == row
    assert math.isnan(rows[2]["loss"]) and rows[3]["step"] == 2
    assert [w["rank"] for w in progress.workers] == [0, 1] and progress.nodes == ["node-a", "node-b"]
    assert progress.starts == [0] and progress.sizes == [2]
    assert ray_internals.kv_list(f"trainflow/progress/{name}/", PROGRESS_NAMESPACE) == []


def test_a_progress_row_outlives_the_worker_killed_right_after_writing_it(ray_cluster):
    import ray

    name = f"test-progress-{uuid.uuid4().hex[:8]}"

    @ray.remote(max_retries=0)
    def write_then_die():
        import os
        import signal

        ProgressLog(name, 0).add({"epoch": 1})
        os.kill(os.getpid(), signal.SIGKILL)

    rows = []
    with follow_progress(name, rows.append):
        with pytest.raises(ray.exceptions.WorkerCrashedError):
            ray.get(write_then_die.remote())
    assert rows == [{"kind": "epoch", "epoch": 1}]


def test_a_shard_read_from_parquet_is_every_world_size_th_row(prepared):
    path = prepared.split_path("val")
    x, y = next(iter(read_split_batches(path, batch_size=1 << 16))).values()
    n, world = len(y), 7
    assert n % world  # so that equal shards must drop rows
    equal = [inputs.read_shard(path, rank, world, equal=True) for rank in range(world)]
    assert [len(shard_y) for _, shard_y in equal] == [n // world] * world
    assert torch.equal(equal[3][0], torch.from_numpy(x[3 : n - n % world : world]))
    every = [inputs.read_shard(path, rank, world, equal=False) for rank in range(world)]
    assert sorted(torch.cat([shard_y for _, shard_y in every]).tolist()) == sorted(y.tolist())


def test_auto_keeps_each_split_in_memory_by_its_own_size():
    small, large = 1 << 20, inputs.IN_MEMORY_BYTES
    assert inputs.in_memory_splits("auto", {"train": large, "val": small}) == ("val",)
    assert inputs.in_memory_splits("auto", {"train": small, "val": small}) == ("train", "val")
    assert inputs.in_memory_splits("auto", {"train": large, "val": large}) == ()
    # What counts is each worker's share: two workers hold half a large split each.
    assert inputs.in_memory_splits("auto", {"train": large, "val": small}, workers=2) == ("train", "val")
    # The explicit settings hold whatever the sizes.
    assert inputs.in_memory_splits("never", {"train": small, "val": small}) == ()
    assert inputs.in_memory_splits("always", {"train": large, "val": large}) == ("train", "val")


def test_an_in_memory_augmented_train_split_draws_new_crops_and_flips_each_batch():
    # Four 2x6x6 images of distinct values, flattened as prepared rows.
    x = torch.arange(4 * 2 * 6 * 6, dtype=torch.float32).reshape(4, -1)
    y = torch.arange(4)
    image = {"shape": [2, 6, 6], "mean": [0.0, 0.0], "std": [1.0, 1.0], "augment": True}

    def one_epoch(seed: int) -> list[dict]:
        torch.manual_seed(seed)  # the loop seeds every epoch (epoch_seed)
        batches = inputs.tensor_batches(x, y, 2)
        return list(inputs.augmented_batches(batches, {"image": image}))

    first, again, other = one_epoch(1), one_epoch(1), one_epoch(2)
    assert [b[LABEL].tolist() for b in first] == [[0, 1], [2, 3]]  # labels untouched
    assert all(b[FEATURES].shape == (2, 72) for b in first)
    seen = torch.cat([b[FEATURES] for b in first])
    assert not torch.equal(seen, x)  # cropped or flipped
    # Each image keeps its own values (a crop pads with zeros; a flip moves pixels).
    for i in range(4):
        assert set(seen[i].unique().tolist()) <= set(x[i].tolist()) | {0.0}
    # Drawn from torch's generator: the same epoch seed draws the same, another does not.
    assert torch.equal(seen, torch.cat([b[FEATURES] for b in again]))
    assert not torch.equal(seen, torch.cat([b[FEATURES] for b in other]))
    # Without augment the batches pass as they are.
    plain = list(
        inputs.augmented_batches(inputs.tensor_batches(x, y, 2), {"image": {**image, "augment": False}})
    )
    assert torch.equal(torch.cat([b[FEATURES] for b in plain]), x)


@pytest.mark.slow
def test_a_streamed_augmented_train_split_is_augmented_in_ray_datas_tasks(ray_cluster):
    import ray.data

    from trainflow.pipelines.data.preprocess import augment_dataset

    x = np.arange(4 * 2 * 6 * 6, dtype=np.float32).reshape(4, -1)
    ds = ray.data.from_items([{FEATURES: x[i], LABEL: i} for i in range(4)])
    image = {"shape": [2, 6, 6], "mean": [0.0, 0.0], "std": [1.0, 1.0], "augment": True}
    rows = sorted(augment_dataset(ds, {"image": image}).take_all(), key=lambda r: r[LABEL])
    seen = np.stack([r[FEATURES] for r in rows])
    assert seen.shape == x.shape and not np.array_equal(seen, x)
    for i in range(4):
        assert set(np.unique(seen[i]).tolist()) <= set(x[i].tolist()) | {0.0}
    assert augment_dataset(ds, {"image": {**image, "augment": False}}) is ds


def test_split_inputs_hands_trainer_a_dataset_only_for_streamed_splits(prepared):
    memory_splits, datasets = inputs.split_inputs(prepared.path, in_memory=("train", "val"))
    assert memory_splits == {name: prepared.split_path(name) for name in ("train", "val")}
    assert datasets is None
    memory_splits, datasets = inputs.split_inputs(prepared.path, in_memory=())
    assert memory_splits == {} and sorted(datasets) == ["train", "val"]
    with pytest.raises(ValueError, match=r"unknown splits \['test'\]; use \['train', 'val'\]"):
        inputs.split_inputs(prepared.path, in_memory=("test",))


def test_a_streamed_split_lists_its_files_once_not_at_every_epoch(prepared):
    """Each epoch executes a streamed split anew: read with Ray Data's first Parquet
    datasource, its footers are read once when the Dataset is made, and an execution runs
    only the read tasks (Ray 2.60's default datasource lists the files, on actors it starts
    for it, at every execution). The caller's DataContext is left as it was
    (tests/test_ray_internals.py)."""
    dataset = prepared.dataset("train")
    stats = dataset.materialize().stats()  # what one epoch executes
    assert "ReadParquet" in stats and "ListFiles" not in stats, stats


def test_streamed_epochs_give_every_row_once_each_epoch_with_the_next_started_early(ray_cluster):
    import ray.data

    ds = ray.data.from_items([{FEATURES: [float(i)], LABEL: i} for i in range(1000)], override_num_blocks=4)
    (shard,) = ds.streaming_split(1)  # what Ray Train hands a worker
    epochs = inputs.StreamedEpochs(shard, 128, torch.device("cpu"), pin_memory=False)
    for epoch in range(3):
        more = epoch < 2
        chunks = list(epochs.epoch(more=more))
        assert all(len(c[LABEL]) <= 128 for c in chunks)
        assert sorted(torch.cat([c[LABEL] for c in chunks]).tolist()) == list(range(1000))
        assert (epochs._ahead is not None) == more  # the next epoch started before this one ended
    batches = list(inputs.chunk_batches(chunks, 50, torch.Generator().manual_seed(0)))
    assert [len(b[LABEL]) for b in batches[:3]] == [50, 50, 28]  # a chunk of 128, cut


@pytest.mark.slow
def test_a_streamed_train_split_validates_on_the_whole_val_split_and_early_stopping_stops_every_worker(
    prepared, splits, tmp_path, monkeypatch
):
    # What auto picks for a large train split: train streams from Ray Data, val is read
    # once into each worker's memory. TorchTrainer gets no val Dataset, so a loop that
    # asked Ray for a val shard would fail the run. The split size that auto keeps in
    # memory, set between the two splits' shares of the two workers:
    train, val = (split_bytes(prepared.split_path(name)) for name in ("train", "val"))
    monkeypatch.setattr(inputs, "IN_MEMORY_BYTES", (train + val) / 4)
    memory_splits, datasets = inputs.split_inputs(prepared.path, in_memory=("val",))
    assert list(memory_splits) == ["val"] and list(datasets) == ["train"]
    managers = dataset_managers()
    # No epoch can beat the first by 10: the run stops after 1 + patience epochs, every
    # worker together (a worker that trained on would wait for the others' all-reduce).
    result, history, rows = fit(
        splits,
        tmp_path,
        epochs=6,
        early_stopping={"metric": "val_loss", "mode": "min", "patience": 2, "min_delta": 10.0},
    )
    assert (rows[0]["in_memory"], rows[0]["streamed"]) == (["val"], ["train"])
    assert dataset_managers() == managers + 1  # Ray Train's, to shard the streamed train split
    # Ray Data shares the cluster with the workers: Ray Train's requests to the
    # autoscaling coordinator stay.
    assert autoscaling_coordinator() is not None
    assert (result.status, result.epoch) == ("early_stopped", 3)
    assert result.message == "val_loss did not improve for 2 epochs"
    assert [m["epoch"] for m in history] == [1, 2, 3]
    # The best epoch's val metrics are its checkpoint's model scored on every val row,
    # though each of the two workers held only its own rows.
    batch = next(iter(read_split_batches(prepared.split_path("val"), batch_size=1 << 16)))
    x, y = torch.tensor(batch[FEATURES]), torch.tensor(batch[LABEL])
    with torch.no_grad():
        logits = load_checkpoint(result.best_checkpoint).model(x)
    best = result.best_metrics
    assert best["val_loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert best["val_accuracy"] == pytest.approx((logits.argmax(dim=1) == y).float().mean().item())


@pytest.mark.slow
def test_a_run_reports_its_progress_picks_its_best_checkpoint_and_resumes_exactly_after_losing_a_worker(
    splits, tmp_path
):
    # Dropout, SGD momentum, a cosine schedule with warm-up: all of it must resume.
    settings = dict(
        epochs=3, optimizer="sgd", lr=0.05, scheduler="cosine", warmup_epochs=1, deterministic=True
    )
    managers = dataset_managers()
    without_autoscaling_coordinator()
    run_name = f"straight-{uuid.uuid4().hex[:8]}"
    result, straight, rows = fit(splits, tmp_path, run_name, ray_callbacks=[ControllerModules()], **settings)
    # The plan first, from the driver; then the worker group's start and each epoch.
    assert rows[0] == {
        "kind": "plan",
        "in_memory": ["train", "val"],  # what auto picks for splits this small
        "streamed": [],
        "run_path": f"{tmp_path}/{run_name}",
        "parameters": "2,410 of 2,410 parameters train",
        "loss": "cross_entropy",
        "class_weights": None,
    }
    assert [(r["kind"], r.get("epoch")) for r in rows[1:]] == [("start", None)] + [
        ("epoch", e) for e in (1, 2, 3)
    ]
    assert (result.status, result.epoch, result.message) == ("completed", 3, "")
    assert result.starts == [0] and len(result.nodes) == 1 and result.in_memory == ("train", "val")
    assert result.run_path.endswith(run_name)
    # No Datasets to shard, so no dataset manager: an actor process fewer per training.
    assert dataset_managers() == managers
    # A local cluster that the session started cannot grow: no autoscaling coordinator.
    assert autoscaling_coordinator() is None
    # Ray Train's controller, which never holds a tensor, imported no torch
    # (pipelines/training/controller.py): 1.3 CPU-seconds less per training. Unless Ray
    # started it in a process of the session's earlier work that held torch already,
    # where nothing can be told (tests/controller_probe.py).
    record = controller_record(run_name)
    assert record is not None and controller_imported_torch(run_name) in (False, None), record
    # The history is every epoch's figures, as the workers reported them.
    assert [{k: h[k] for k in ("epoch", "val_accuracy")} for h in result.history] == [
        {k: r[k] for k in ("epoch", "val_accuracy")} for r in straight
    ]
    # The best checkpoint is the epoch with the best val_accuracy (checkpoint.metric), and loads.
    best = max(straight, key=lambda r: r["val_accuracy"])
    assert result.best_metrics["epoch"] == best["epoch"] and "history" not in result.best_metrics
    assert load_checkpoint(result.best_checkpoint).metrics["epoch"] == best["epoch"]
    assert ray_internals.kv_list("trainflow/progress/", PROGRESS_NAMESPACE) == []

    # The same run, its rank 1 killed after epoch 2 of 3 was collected (tests/faults.py
    # waits for it): the restart resumes from epoch 2's checkpoint and trains the last
    # epoch again.
    result, resumed, _ = fit(
        splits, tmp_path / "killed", callbacks=["tests.faults:kill_rank1_at_epoch2"], **settings
    )
    assert result.status == "completed"
    assert result.starts == [0, 2]
    # The epoch after the checkpoint is trained again; what it gives equals the straight run.
    assert [m["epoch"] for m in resumed] == [1, 2, 3]
    by_epoch = {m["epoch"]: m for m in resumed}  # the last report of each epoch
    for m in straight:
        for key in ("train_loss", "val_loss", "val_accuracy", "lr"):
            assert by_epoch[m["epoch"]][key] == pytest.approx(m[key], rel=1e-5), (m["epoch"], key)


SEEN: list[tuple[int, int]] = []  # (pid, epoch) of each epoch seen_here was called after


def seen_here(epoch: int, metrics: dict, rank: int) -> None:
    """A train.callbacks function: where each epoch ran, kept in this module."""
    SEEN.append((os.getpid(), epoch))


def test_no_workers_trains_in_this_process_as_one_worker_would_and_goes_on_from_its_checkpoint(
    splits, tmp_path
):
    train = {"epochs": 3, "deterministic": True, "callbacks": [f"{__name__}:seen_here"]}
    config = load_config(small_config(train=train, scaling={"num_workers": 0}, checkpoint={"keep": 1}))
    SEEN.clear()
    rows = []
    result = run_training(config, splits, run_name="here", storage=str(tmp_path), on_row=rows.append)
    # Every epoch ran in this very process (a Ray Train worker's callback list is its own).
    assert SEEN == [(os.getpid(), epoch) for epoch in (1, 2, 3)]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert rows[0]["run_path"] == str(tmp_path / "here") and rows[0]["in_memory"] == ["train", "val"]
    assert [r["kind"] for r in rows[1:]] == ["start", "epoch", "epoch", "epoch"]
    assert (result.status, result.epoch, result.starts) == ("completed", 3, [0])
    assert [h["epoch"] for h in result.history] == [1, 2, 3]
    # The best checkpoint by val_accuracy is the one handed on; keep 1 leaves it and the latest.
    best = max(reversed(epochs), key=lambda r: r["val_accuracy"])["epoch"]
    assert result.best_metrics["epoch"] == best == load_checkpoint(result.best_checkpoint).metrics["epoch"]
    kept = {f"checkpoint_epoch_{epoch:06d}" for epoch in (best, 3)}
    assert {p.name for p in (tmp_path / "here").glob("checkpoint_*")} == kept
    # The history is the checkpoint's metrics.json's alone, an epoch a line.
    latest = tmp_path / "here" / "checkpoint_epoch_000003"
    lines = (latest / "metrics.json").read_text().splitlines()
    rows = [json.loads(line.strip().rstrip(",")) for line in lines if line.startswith('    {"epoch"')]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert "history" not in torch.load(latest / "train_state.pt", weights_only=True)

    # The same epochs on one Ray Train worker give the same figures.
    one = config.model_copy(update={"scaling": config.scaling.model_copy(update={"num_workers": 1})})
    on_worker = run_training(one, splits, run_name="worker", storage=str(tmp_path))
    for mine, theirs in zip(result.history, on_worker.history, strict=True):
        for key in ("train_loss", "val_loss", "val_accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4), (mine["epoch"], key)

    # Run again under its name with more epochs (a retry, --resume), it goes on after epoch 3.
    more = config.model_copy(update={"train": config.train.model_copy(update={"epochs": 5})})
    SEEN.clear()
    result = run_training(more, splits, run_name="here", storage=str(tmp_path))
    assert SEEN == [(os.getpid(), 4), (os.getpid(), 5)]
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4, 5]


def test_kept_checkpoints_rank_by_what_their_metrics_say_after_a_restart_of_the_run(tmp_path):
    """save_kept ranks a run's checkpoints at every epoch; a checkpoint written again (a
    trial reset to the same run name) ranks by its new metrics, one written by another
    process by what its metrics.json holds."""
    kept = CheckpointSection(keep=1, metric="val_loss", mode="min")

    def save_epoch(epoch, val_loss):
        metrics = {"epoch": epoch, "val_loss": val_loss}

        def save(folder):
            folder.mkdir()
            (folder / "metrics.json").write_text(json.dumps({**metrics, "history": [metrics]}))

        return save_kept(metrics, str(tmp_path), kept, save).name

    assert [save_epoch(1, 0.5), save_epoch(2, 0.9)] == [f"checkpoint_epoch_00000{e}" for e in (1, 2)]
    assert best_kept(str(tmp_path), kept).name == "checkpoint_epoch_000001"
    save_epoch(1, 2.0)  # started over: epoch 1 now worse than epoch 2
    assert best_kept(str(tmp_path), kept).name == "checkpoint_epoch_000002"
    save_epoch(3, 1.0)  # the latest, kept beside the best; epoch 1 deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint_epoch_00000{e}" for e in (2, 3)]
    # Rewritten by another process: read again.
    rewritten = {"epoch": 3, "val_loss": 0.1}
    (tmp_path / "checkpoint_epoch_000003" / "metrics.json").write_text(json.dumps(rewritten))
    assert best_kept(str(tmp_path), kept).name == "checkpoint_epoch_000003"


def test_a_run_without_workers_keeps_its_checkpoints_in_a_folder_and_refuses_a_bucket(tmp_path):
    assert run_folder(f"file://{tmp_path}", "run") == tmp_path / "run" and (tmp_path / "run").is_dir()
    assert on_a_folder(str(tmp_path)) and not on_a_folder("gs://bucket/runs")  # a sweep's trials too
    refused = r"^scaling\.num_workers 0 saves its checkpoints in a folder, and storage s3://bucket/runs is"
    with pytest.raises(ConfigError, match=refused):
        run_folder("s3://key:secret@bucket/runs", "run")


def test_balanced_class_weights_are_scikit_learns_from_the_prepared_train_labels(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.utils.class_weight import compute_class_weight

    from trainflow.pipelines.training.settings import balanced_class_weights

    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 2])
    (tmp_path / "train").mkdir()
    pq.write_table(pa.table({"label": labels[:5]}), tmp_path / "train" / "a.parquet")
    pq.write_table(pa.table({"label": labels[5:]}), tmp_path / "train" / "b.parquet")
    weights = balanced_class_weights(str(tmp_path), 4)  # class 3 has no train rows
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels) * 3 / 4
    np.testing.assert_allclose(weights[:3], expected)
    assert weights[3] == 0.0


def test_a_run_saved_every_n_steps_resumes_at_the_step_it_lost_not_the_epochs_start(splits, tmp_path):
    # Without dropout, whose masks a resumed epoch draws anew: the rest is the same run.
    model = {"kind": "mlp", "hidden_sizes": [32], "dropout": 0.0}
    train = {"epochs": 3, "optimizer": "sgd", "lr": 0.05, "deterministic": True}

    def run(name, checkpoint=None, **more):
        rows = []
        config = small_config(model=model, train={**train, **more}, scaling={"num_workers": 2})
        if checkpoint:
            config["checkpoint"] = checkpoint
        result = run_training(
            load_config(config), splits, run_name=name, storage=str(tmp_path), on_row=rows.append
        )
        return result, rows

    # Fresh names: a fault drill strikes once per run name.
    straight, rows = run(f"straight-{uuid.uuid4().hex[:8]}", log_every_n_steps=1)
    steps = sum(r["kind"] == "step" and r["epoch"] == 1 for r in rows)
    assert steps >= 4, rows

    # Saved every 2 steps; rank 0 killed right after epoch 2's save at step 2.
    every = 2
    killed_name = f"killed-{uuid.uuid4().hex[:8]}"
    killed, rows = run(
        killed_name,
        {"every_n_steps": every},
        loss="tests.faults:KillRank0AtCall",
        loss_args={"at": steps + every + 1},
    )
    assert killed.status == "completed"
    starts = [(r["start_epoch"], r["start_step"]) for r in rows if r["kind"] == "start"]
    assert starts == [(0, 0), (1, every)], starts
    # The epochs after the save are those of the run that never stopped.
    by_epoch = {r["epoch"]: r for r in killed.history}
    for r in straight.history:
        for key in ("val_loss", "val_accuracy", "lr"):
            assert by_epoch[r["epoch"]][key] == pytest.approx(r[key], rel=1e-5), (r["epoch"], key)
    # One save kept at a time, in the run's own folder.
    saves = sorted(p.name for p in (tmp_path / killed_name / "steps").iterdir())
    assert len(saves) == 1 and saves[0].startswith("epoch-2-step-"), saves
