"""The loss a run trains with, as ``loss_fn(outputs, targets) -> scalar tensor``: a built-in
one (``train.loss``: cross_entropy, mse, l1, huber) or the user's own
(``package.module:name``), and the check of the user's own in the driver.

A loss of the user's own is a function ``(outputs, targets) -> scalar tensor`` (given
``train.loss_args`` as keywords on every call), or a class, such as an ``nn.Module``,
built once with ``train.loss_args`` and called so. For a classifier it gets the model's
logits ``[N, classes]`` and the class indices ``[N]`` (int64); for a regression the
outputs ``[N]`` and the label ``[N]`` standardized as training sees it, of one float
dtype, as the built-in regression losses do. trainflow's loop calls it as its own, under
``train.precision``'s autocast and on each DDP worker's batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainflow.config import ConfigError
from trainflow.config.objective import BUILTIN_LOSSES
from trainflow.pipelines.hooks import call_hook, describe, load_hook

if TYPE_CHECKING:
    from trainflow.config import PipelineConfig

FIELD = "train.loss"
LOSSES = {"mse": nn.MSELoss, "l1": nn.L1Loss, "huber": nn.HuberLoss}
# Rows of the batch a user's loss is called on in the driver.
DRY_ROWS = 4


def make_loss(
    loss: str,
    *,
    label_smoothing: float = 0.0,
    class_weights: list[float] | None = None,
    loss_args: dict[str, Any] | None = None,
    objective: str = "classification",
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of ``loss`` (a train.loss) as ``loss_fn(outputs, labels)``: cross entropy
    over class logits; for a regression (mse, l1, huber) over the model's one output per
    row against the scaled label; or the user's own (:func:`user_loss`) for ``objective``."""
    if loss not in BUILTIN_LOSSES:
        return user_loss(loss, loss_args or {}, regression=objective == "regression")
    if loss == "cross_entropy":
        weight = torch.tensor(class_weights, dtype=torch.float32) if class_weights else None
        return nn.CrossEntropyLoss(weight=weight, label_smoothing=label_smoothing)
    return FlatOutputs(LOSSES[loss]())


class FlatOutputs(nn.Module):
    """A regression's loss on the model's outputs as one number per row, against the label
    in the outputs' dtype; a module, so that a loss module within moves to the device."""

    def __init__(self, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.loss = loss

    def forward(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(outputs.reshape(-1), y.to(outputs.dtype))


def user_loss(path: str, loss_args: dict[str, Any], *, regression: bool) -> Callable[..., torch.Tensor]:
    """The user's loss ``path`` (see the module's docstring), imported and, for a class,
    built with ``loss_args``; ConfigError in one line naming train.loss on any failure."""
    target = load_hook(FIELD, path)
    if isinstance(target, type):
        loss = call_hook(FIELD, path, target, **loss_args)
        if not callable(loss):
            raise ConfigError(
                f"{FIELD} {path}: {target.__name__}(**train.loss_args) gives {describe(loss)}, "
                "not a callable loss"
            )
    else:
        loss = functools.partial(target, **loss_args) if loss_args else target
    return FlatOutputs(loss) if regression else loss


def on_device(loss_fn: Callable[..., torch.Tensor], device: torch.device) -> Callable[..., torch.Tensor]:
    """``loss_fn`` with its tensors (class weights, a module's buffers) on ``device``."""
    return loss_fn.to(device) if isinstance(loss_fn, nn.Module) else loss_fn


def check_loss(config: PipelineConfig, num_outputs: int) -> None:
    """A loss of the user's own (``train.loss: package.module:name``) built and called once
    here on outputs of the model's shape ``[rows, num_outputs]`` and targets of the objective's
    kind; ConfigError in one line naming train.loss when it does not import, does not
    build, raises, or gives anything but one finite number that carries a gradient."""
    path = config.train.user_loss
    if path is None:
        return
    loss_fn = make_loss(path, loss_args=config.train.loss_args, objective=config.objective)
    generator = torch.Generator().manual_seed(0)
    outputs = torch.randn(DRY_ROWS, num_outputs, generator=generator, requires_grad=True)
    if config.objective == "regression":
        targets = torch.randn(DRY_ROWS, generator=generator)
    else:
        targets = torch.arange(DRY_ROWS) % num_outputs
    value = call_hook(FIELD, path, loss_fn, outputs, targets)
    batch = f"for outputs of shape {list(outputs.shape)}"
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ConfigError(
            f"{FIELD} {path}: returned {describe(value)} {batch}, not a scalar tensor; "
            "reduce it over the batch (.mean())"
        )
    if not value.requires_grad:
        raise ConfigError(
            f"{FIELD} {path}: its result {batch} carries no gradient back to them; compute it "
            "from the outputs with torch operations"
        )
    if not torch.isfinite(value.detach()).all():
        raise ConfigError(f"{FIELD} {path}: returned {value.item()} {batch}, not a finite number")
