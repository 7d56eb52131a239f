"""The user's metrics (``evaluation.metrics``) on the validation split each epoch, as
``val_<name>``: scored on the whole split, the same figures on every worker.

Each worker validates its own shard. Its outputs and targets go to rank 0
(``torch.distributed.gather_object``), which scores every metric once on them all, and
rank 0's figures go back to every worker (``broadcast_object_list``): checkpoint ranking
and early stopping read the same number on each, so all workers stop together. A metric
that raises on rank 0 raises its one line on every worker alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainflow.pipelines.metrics import UserMetric, score_all

# Per batch, what validation keeps for the metrics: (outputs, targets) on the CPU.
Kept = list[tuple[torch.Tensor, torch.Tensor]]


class ValidationMetrics:
    """The user's ``metrics`` over a run's validation split; ``preprocessor`` (its state)
    turns a regression's standardized outputs and labels back into the label's units."""

    def __init__(self, metrics: list[UserMetric], objective: str, preprocessor: dict[str, Any]):
        self.metrics = metrics
        self.regression = objective == "regression"
        self.label_offset = float(preprocessor.get("label_offset", 0.0))
        self.label_scale = float(preprocessor.get("label_scale", 1.0))

    def __call__(self, kept: Kept) -> dict[str, float]:
        """``val_<name>`` of each metric over every worker's ``kept`` batches."""
        targets, outputs = self.arrays(kept)
        return _scored_on_rank_0((targets, outputs), self.score)

    def arrays(self, kept: Kept) -> tuple[np.ndarray, np.ndarray]:
        """This worker's targets and outputs as the metrics take them
        (:mod:`trainflow.pipelines.metrics`): class indices and softmax probabilities, or
        true and predicted numbers in the label's units. Empty arrays for no batches."""
        if not kept:
            return np.zeros(0), np.zeros(0)
        outputs = torch.cat([o for o, _ in kept]).float()
        targets = torch.cat([y for _, y in kept])
        if self.regression:
            return self.unscaled(targets), self.unscaled(outputs)
        return targets.long().numpy(), torch.softmax(outputs, dim=1).numpy()

    def unscaled(self, values: torch.Tensor) -> np.ndarray:
        """A regression's standardized outputs or labels as ``[N]`` in the label's units."""
        return values.double().reshape(-1).numpy() * self.label_scale + self.label_offset

    def score(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        """Every metric on every worker's ``(targets, outputs)``, joined in rank order;
        NaN for each when the validation split has no rows."""
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return {f"val_{m.name}": float("nan") for m in self.metrics}
        targets = np.concatenate([t for t, _ in parts])
        outputs = np.concatenate([o for _, o in parts])
        return score_all(self.metrics, targets, outputs, prefix="val_")


def _scored_on_rank_0(part: Any, score) -> dict[str, float]:
    """``score`` of every worker's ``part`` (a list in rank order), computed on rank 0 and
    handed to every worker; an exception it raises, raised on every worker."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return score([part])
    rank = dist.get_rank()
    parts = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    result: list[Any] = [None]
    if rank == 0:
        try:
            result = [score(parts)]
        except Exception as e:  # every worker raises it, instead of waiting on rank 0
            result = [e]
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]
