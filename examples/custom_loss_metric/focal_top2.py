"""A loss and a metric of your own, for trainflow's loop: a focal loss and top-2 accuracy.

digits-focal-top2.yaml names them as package.module:name (`focal_top2:FocalLoss`,
`focal_top2:top2_accuracy`); trainflow imports this module from the current folder or
PYTHONPATH and ships it to the Ray workers.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class FocalLoss(nn.Module):
    """Cross entropy that weighs each row by (1 - p)^gamma, p the probability the model
    gives the true class: rows it already gets right count less (Lin et al., 2017,
    https://arxiv.org/abs/1708.02002). gamma 0 is cross entropy. Built once per worker
    with train.loss_args: FocalLoss(gamma=2.0)."""

    def __init__(self, gamma: float = 2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # outputs: the model's logits [N, classes]; targets: class indices [N].
        log_p = F.log_softmax(outputs.float(), dim=1).gather(1, targets[:, None]).squeeze(1)
        return (-((1 - log_p.exp()) ** self.gamma) * log_p).mean()


def top2_accuracy(targets: np.ndarray, outputs: np.ndarray) -> float:
    """The share of rows whose true class is among the two the model scores highest.
    targets: class indices [N]; outputs: softmax probabilities [N, classes]."""
    top2 = np.argsort(-outputs, axis=1)[:, :2]
    return float(np.mean((top2 == targets[:, None]).any(axis=1)))
