"""Ray Train's getting-started training function, run by trainflow as ``train.loop``.

The code of Ray's guide "Get Started with Distributed Training using PyTorch"
(docs.ray.io/en/latest/train/getting-started-pytorch.html), with the checkpoint of its
"Saving and Loading Checkpoints" guide so that a run resumes after a lost worker. Changed
only where it reads its data and its settings:

- data: trainflow's prepared train split, this worker's shard
  (``ray.train.get_dataset_shard("train")``), in place of FashionMNIST and a DataLoader;
  a batch's ``features`` viewed as the images they are;
- settings: ``config["lr"]``, ``config["epochs"]``, ``config["batch_size"]`` (train.lr,
  train.epochs, train.batch_size) and the data's classes and image shape
  (``config["trainflow"]["model_spec"]``) in place of numbers in the code.
"""

import os
import tempfile

import ray.train.torch
import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torchvision.models import resnet18


def train_func(config):
    spec = config["trainflow"]["model_spec"]  # the model model.kind describes, for this data

    # The model, on this worker's device and wrapped for DDP; its loss and optimizer.
    model = resnet18(num_classes=spec["num_outputs"])
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model = ray.train.torch.prepare_model(model)
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=config["lr"])

    # Data: this worker's shard of the prepared train split.
    train_shard = ray.train.get_dataset_shard("train")

    # Resume from the latest checkpoint, when Ray hands one back.
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            model.module.load_state_dict(torch.load(os.path.join(checkpoint_dir, "model.pt")))
            optimizer.load_state_dict(torch.load(os.path.join(checkpoint_dir, "optimizer.pt")))
            start_epoch = torch.load(os.path.join(checkpoint_dir, "extra_state.pt"))["epoch"] + 1

    # Train.
    for epoch in range(start_epoch, config["epochs"]):
        # drop_last: BatchNorm cannot train on a last batch of one row.
        for batch in train_shard.iter_torch_batches(batch_size=config["batch_size"], drop_last=True):
            images, labels = batch["features"].view(-1, *spec["input_shape"]), batch["label"]
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # The epoch's metrics to Ray Train, with a checkpoint from rank 0.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
                torch.save(optimizer.state_dict(), os.path.join(temp_checkpoint_dir, "optimizer.pt"))
                torch.save({"epoch": epoch}, os.path.join(temp_checkpoint_dir, "extra_state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(temp_checkpoint_dir)
            ray.train.report(metrics, checkpoint=checkpoint)
        if ray.train.get_context().get_world_rank() == 0:
            print(metrics)
