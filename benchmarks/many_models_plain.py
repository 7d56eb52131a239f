"""The many-models baseline: the 16 regressions of benchmarks/configs/diabetes-many.yaml's
sweep, trained one after another in one plain PyTorch process, as a user would write it
(scikit-learn's diabetes data, standardized features and target, the same split sizes,
model, optimizer, batches and epochs, each epoch validated).

    python benchmarks/many_models_plain.py
"""

import itertools
import time

import numpy as np
import torch
import yaml
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split

from trainflow.config import ModelConfig
from trainflow.pipelines.models.build import build_model, model_spec

CONFIG = __file__.rsplit("/", 1)[0] + "/configs/diabetes-many.yaml"


def splits(seed: int = 0):
    """Train and val splits of the sizes trainflow's default split makes (70/10, 20 held for
    test), standardized by the train split's statistics; the target too."""
    x, y = load_diabetes(return_X_y=True)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, test_size=0.3, random_state=seed)
    x_val, _, y_val, _ = train_test_split(x_rest, y_rest, test_size=2 / 3, random_state=seed)
    mean, std = x_train.mean(0), x_train.std(0)
    y_mean, y_std = y_train.mean(), y_train.std()

    def tensors(a, b):
        return torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(
            (b - y_mean) / y_std, dtype=torch.float32
        ).unsqueeze(1)

    return tensors(x_train, y_train), tensors(x_val, y_val)


def train_one(hidden: list[int], lr: float, epochs: int, batch_size: int, data) -> float:
    """One model to its last epoch; its best val loss."""
    (xt, yt), (xv, yv) = data
    torch.manual_seed(0)
    model = build_model(model_spec(ModelConfig(kind="mlp", hidden_sizes=hidden, dropout=0.0), 10, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    best = np.inf
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(yt)).split(batch_size):
            optimizer.zero_grad()
            loss_fn(model(xt[idx]), yt[idx]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            best = min(best, loss_fn(model(xv), yv).item())
    return best


def main() -> None:
    torch.set_num_threads(1)  # what each of trainflow's half-CPU trials gets
    raw = yaml.safe_load(open(CONFIG))
    space = raw["sweep"]["space"]
    train = raw["train"]
    data = splits()
    start = time.perf_counter()
    losses = [
        train_one(hidden, lr, train["epochs"], train["batch_size"], data)
        for hidden, lr in itertools.product(space["model.hidden_sizes"]["grid"], space["train.lr"]["grid"])
    ]
    print(f"models {len(losses)} best_val_loss {min(losses):.4f} train_s {time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
