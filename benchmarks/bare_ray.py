"""The digits job as a bare Ray script, written the way Ray Train's getting-started guide
writes one: Ray Data streams each worker's shard every epoch, and every epoch reports
its metrics with a checkpoint. Same data, split sizes, model, optimizer and epochs as
trainflow's default job; two workers of half a CPU. Used by overhead.py as a baseline.

    python benchmarks/bare_ray.py --epochs 20
    RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05 python benchmarks/bare_ray.py --epochs 20 --in-memory

``--in-memory`` is the same script given what trainflow gives itself for small splits:
no Ray Data, the driver passes both splits' arrays with the training function's config
(Ray puts them in its object store once), and each worker keeps its own rows (every
world_size-th, from its rank) as tensors for all epochs, in the same batches of 64.
overhead.py runs it with trainflow's controller poll, ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05``.
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
from trainflow.pipelines.models.build import build_model, model_spec


def in_memory_batches(arrays, batch_size):
    """This worker's rows of a split held in memory, as tensors, cut into batches once."""
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    x, y = (torch.from_numpy(a[rank::world]) for a in arrays)
    return [{"x": xb, "y": yb} for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True)]


def train_func(config):
    model = ray.train.torch.prepare_model(build_model(config["spec"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    if "arrays" in config:  # --in-memory: both splits read once, before the first epoch
        train_batches = in_memory_batches(config["arrays"]["train"], config["batch_size"])
        val_batches = in_memory_batches(config["arrays"]["val"], config["batch_size"])

        def batches(split):
            return train_batches if split == "train" else val_batches
    else:  # Ray Data streams each worker's shard, every epoch
        shards = {split: ray.train.get_dataset_shard(split) for split in ("train", "val")}

        def batches(split):
            return shards[split].iter_torch_batches(batch_size=config["batch_size"])

    for epoch in range(config["epochs"]):
        model.train()
        for batch in batches("train"):
            optimizer.zero_grad()
            loss = loss_fn(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for batch in batches("val"):
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
    parser.add_argument(
        "--storage", default=None, help="Ray Train's storage (default: a new temporary folder)"
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="no Ray Data: pass both splits to the workers, each keeps its rows as tensors",
    )
    args = parser.parse_args()
    storage = args.storage or tempfile.mkdtemp(prefix="bare-ray-")

    x_train, y_train, x_val, y_val = standardized_splits()

    ray.init(address="local")  # a cluster of its own, as `ray.init()` makes on a machine without one

    def to_ds(xs, ys):
        return ray.data.from_items([{"x": a, "y": b} for a, b in zip(xs, ys, strict=True)])

    spec = model_spec(ModelConfig(), 64, 10)
    config = {"spec": spec, "lr": 1e-3, "batch_size": 64, "epochs": args.epochs}
    if args.in_memory:
        config["arrays"] = {"train": (x_train, y_train), "val": (x_val, y_val)}
        datasets = None
    else:
        datasets = {"train": to_ds(x_train, y_train), "val": to_ds(x_val, y_val)}
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="bare-ray-digits", storage_path=storage),
    )
    result = trainer.fit()
    print("val_accuracy", result.metrics["val_accuracy"])


if __name__ == "__main__":
    main()
