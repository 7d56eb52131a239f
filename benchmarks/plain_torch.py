"""The digits job as a plain single-process PyTorch loop: the floor for overhead.py.

python benchmarks/plain_torch.py --epochs 20
"""

import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from trainflow.config import ModelConfig
from trainflow.pipelines.models import build_model, model_spec


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # what one of trainflow's half-CPU workers gets
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, test_size=0.3, stratify=y, random_state=0)
    x_val, _, y_val, _ = train_test_split(x_rest, y_rest, test_size=2 / 3, stratify=y_rest, random_state=0)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xt, yt = torch.from_numpy((x_train - mean) / std), torch.from_numpy(y_train)
    xv, yv = torch.from_numpy((x_val - mean) / std), torch.from_numpy(y_val)
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
