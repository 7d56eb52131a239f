"""The digits job as a bare Ray script, written the way Ray Train's getting-started guide
writes one: Ray Data streams each worker's shard every epoch, and every epoch reports
its metrics with a checkpoint. Same data, split sizes, model, optimizer and epochs as
trainflow's default job; two workers of half a CPU. Used by overhead.py as a baseline.

    python benchmarks/bare_ray.py --epochs 20
"""

import argparse
import os
import tempfile

import ray
import ray.train
import ray.train.torch
import torch
from digits_split import standardized_splits
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from trainflow.config import ModelConfig
from trainflow.pipelines.models import build_model, model_spec


def train_func(config):
    model = ray.train.torch.prepare_model(build_model(config["spec"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val")
    for epoch in range(config["epochs"]):
        model.train()
        for batch in train_shard.iter_torch_batches(batch_size=config["batch_size"]):
            optimizer.zero_grad()
            loss = loss_fn(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for batch in val_shard.iter_torch_batches(batch_size=config["batch_size"]):
                correct += (model(batch["x"]).argmax(1) == batch["y"]).sum().item()
                total += len(batch["y"])
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save(
                    model.module.state_dict() if hasattr(model, "module") else model.state_dict(),
                    os.path.join(tmp, "model.pt"),
                )
                checkpoint = Checkpoint.from_directory(tmp)
            ray.train.report(
                {"epoch": epoch + 1, "loss": loss.item(), "val_accuracy": correct / max(total, 1)},
                checkpoint=checkpoint,
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--storage", default=tempfile.mkdtemp(prefix="bare-ray-"))
    args = parser.parse_args()

    x_train, y_train, x_val, y_val = standardized_splits()

    ray.init(address="local")  # a cluster of its own, as `ray.init()` makes on a machine without one

    def to_ds(xs, ys):
        return ray.data.from_items([{"x": a, "y": b} for a, b in zip(xs, ys, strict=True)])

    spec = model_spec(ModelConfig(), 64, 10)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"spec": spec, "lr": 1e-3, "batch_size": 64, "epochs": args.epochs},
        datasets={"train": to_ds(x_train, y_train), "val": to_ds(x_val, y_val)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="bare-ray-digits", storage_path=args.storage),
    )
    result = trainer.fit()
    print("val_accuracy", result.metrics["val_accuracy"])


if __name__ == "__main__":
    main()
