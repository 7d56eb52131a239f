"""What trainflow's loop builds from the train section to update the model and to stop:
the optimizer, the learning-rate schedule (warm-up, then cosine or step), the precision
(autocast and fp16's gradient scaler) and early stopping; each but the precision's
autocast saves its state with a checkpoint and resumes from it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainflow.config import TrainConfig


def make_optimizer(
    name: str, params, lr: float, weight_decay: float, momentum: float = 0.9
) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"train.optimizer {name!r}: use adam, adamw or sgd")


def lr_factor(epoch: int, *, epochs: int, scheduler: str, warmup_epochs: int, step_size: int, gamma: float):
    """The multiple of train.lr used in ``epoch`` (0-based): linear warm-up, then the schedule."""
    if epoch < warmup_epochs:
        return (epoch + 1) / (warmup_epochs + 1)
    after = epoch - warmup_epochs
    if scheduler == "cosine":
        span = max(epochs - warmup_epochs, 1)
        return 0.5 * (1.0 + math.cos(math.pi * after / span))
    if scheduler == "step":
        return gamma ** (after // step_size)
    return 1.0


def make_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig):
    """A LambdaLR stepped once per epoch; its state (the epoch count) resumes with the run."""
    schedule = {k: getattr(train, k) for k in ("epochs", "scheduler", "warmup_epochs", "step_size", "gamma")}
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: lr_factor(epoch, **schedule))


AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def resolved_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` on ``device``: ``auto`` is bf16-mixed on a GPU with bfloat16 and 32
    elsewhere (a CPU without bf16 units runs bf16 slower than fp32)."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "32"


class Precision:
    """``train.precision`` on one device: the autocast context and, for fp16, a gradient scaler."""

    def __init__(self, precision: str, device: torch.device):
        precision = resolved_precision(precision, device)
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES.get(precision)
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range.
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)


class EarlyStopping:
    """Counts epochs without improvement of one metric; its state resumes with the run."""

    def __init__(self, metric: str, mode: str, patience: int, min_delta: float):
        self.metric = metric
        self.mode = mode
        self.patience = patience
        self.min_delta = min_delta
        self.best: float | None = None
        self.bad_epochs = 0

    def update(self, metrics: dict[str, float]) -> bool:
        """Record an epoch; True when training should stop."""
        value = metrics[self.metric]
        if self.best is None:
            improved = True
        elif self.mode == "max":
            improved = value > self.best + self.min_delta
        else:
            improved = value < self.best - self.min_delta
        if improved:
            self.best = value
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.bad_epochs = state["bad_epochs"]
