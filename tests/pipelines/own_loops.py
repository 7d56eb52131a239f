"""Training functions of a user's own (train.loop), as a user writes them after Ray Train's
guide, for tests/pipelines/test_user_loop.py. The tests copy this file under a name of
their own onto the driver's path: the run ships it to the Ray workers, which lack it."""

import json
import os
import tempfile
from pathlib import Path

import ray.train
import ray.train.torch
import torch
from torch import nn

from trainflow.pipelines.models.build import build_model


def _resume(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The epoch to start from: after the checkpoint Ray hands back, its weights loaded."""
    checkpoint = ray.train.get_checkpoint()
    if not checkpoint:
        return 0
    with checkpoint.as_directory() as folder:
        model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
        optimizer.load_state_dict(torch.load(os.path.join(folder, "optimizer.pt")))
        return torch.load(os.path.join(folder, "extra_state.pt"))["epoch"] + 1


def _fail_once(config: dict, epoch: int) -> None:
    """Raise at epoch ``config["fail_at"]`` (counted from 0) the first time a worker gets
    there, as a worker lost mid-run: a marker file remembers it across attempts."""
    marker = (
        Path(config.get("fail_marker", "/nonexistent")) / f"rank{ray.train.get_context().get_world_rank()}"
    )
    if epoch == config.get("fail_at") and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"a worker lost at epoch {epoch}")


def train_with_val(config):
    """Trains the model model.kind builds (its spec under config["trainflow"]) on the train
    shard, scores the val shard, and reports val_accuracy and epoch (from 0, as Ray's guide
    counts) with a checkpoint holding the DDP-wrapped model's state dict from rank 0."""
    spec = config["trainflow"]["model_spec"]
    model = ray.train.torch.prepare_model(build_model(spec))  # DDP: its state dict says module.
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    start = _resume(model, optimizer)
    train, val = ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("val")
    seen = {}
    for epoch in range(start, config["epochs"]):
        model.train()
        for batch in train.iter_torch_batches(batch_size=config["batch_size"]):
            seen = {k: (str(v.dtype), list(v.shape[1:])) for k, v in batch.items()}
            loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _fail_once(config, epoch)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for batch in val.iter_torch_batches(batch_size=config["batch_size"]):
                correct += (model(batch["features"]).argmax(1) == batch["label"]).sum().item()
                total += len(batch["label"])
        metrics = {"val_accuracy": correct / max(total, 1), "train_loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
                torch.save({"epoch": epoch}, os.path.join(folder, "extra_state.pt"))
                (Path(folder) / "batch.json").write_text(json.dumps({"seen": seen, "config": config}))
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint)


def no_checkpoint(config):
    """Reports its metrics and never a checkpoint."""
    for epoch in range(config["epochs"]):
        ray.train.report({"loss": 1.0 / (epoch + 1), "epoch": epoch})


def returns_a_tensor(config):
    """Reports a checkpoint of the model's weights with its loss and no epoch, and returns
    a tensor."""
    model = build_model(config["trainflow"]["model_spec"])
    for _ in range(config["epochs"]):
        with tempfile.TemporaryDirectory() as folder:
            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
            ray.train.report({"loss": 0.5}, checkpoint=ray.train.Checkpoint.from_directory(folder))
    return torch.zeros(3)
