"""The digits job as a plain single-process PyTorch loop: the floor for overhead.py.

python benchmarks/plain_torch.py --epochs 20
"""

import argparse

import torch
from digits_split import standardized_splits

from trainflow.config import ModelConfig
from trainflow.pipelines.models.build import build_model, model_spec


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # what one of trainflow's half-CPU workers gets
    x_train, y_train, x_val, y_val = standardized_splits()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    xv, yv = torch.from_numpy(x_val), torch.from_numpy(y_val)
    model = build_model(model_spec(ModelConfig(), 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(args.epochs):
        model.train()
        for idx in torch.randperm(len(yt)).split(64):
            optimizer.zero_grad()
            loss_fn(model(xt[idx]), yt[idx]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        print("val_accuracy", (model(xv).argmax(1) == yv).float().mean().item())


if __name__ == "__main__":
    main()
