"""A training function of the user's own (``train.loop: gpu_loop:train_func``) for
benchmarks/gpu.py: trainflow's cnn placed on the worker's device and wrapped by Ray
(``ray.train.torch.prepare_model``), its batches put on that device by Ray Data
(``iter_torch_batches``, pinned on CUDA), the step under bf16 autocast. It writes each
epoch's end to the benchmark's epoch log (``common.epoch_done``: the device and the
process group's backend with it)."""

import ray.train
import ray.train.torch
import torch
from common import epoch_done

from trainflow.pipelines.models.build import build_model


def train_func(config: dict) -> None:
    spec = config["trainflow"]["model_spec"]
    model = ray.train.torch.prepare_model(build_model(spec))
    device = ray.train.torch.get_device()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    shard = ray.train.get_dataset_shard("train")
    rank = ray.train.get_context().get_world_rank()
    for epoch in range(config["epochs"]):
        model.train()
        batches = shard.iter_torch_batches(batch_size=config["batch_size"], pin_memory=device.type == "cuda")
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_fn(model(batch["features"]), batch["label"])
            loss.backward()
            optimizer.step()
        epoch_done(epoch + 1, {}, rank)
        ray.train.report({"epoch": epoch + 1, "train_loss": loss.item()})
