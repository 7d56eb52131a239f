"""A model of your own for trainflow: a small residual MLP.

trainflow imports this module in the driver (so run from this folder, or put it on
PYTHONPATH), ships it to the Ray workers, and calls ``build`` in each one with the
data's shape and outputs and the config's ``model.args``.
"""

from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(width, width),
        )

    def forward(self, x):
        return x + self.body(x)


def build(input_shape: list[int], num_outputs: int, width: int = 64, depth: int = 2, dropout: float = 0.1):
    """``input_shape``: [num_features] for a table, [channels, height, width] for images."""
    features = 1
    for size in input_shape:
        features *= size
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, width),
        *(ResidualBlock(width, dropout) for _ in range(depth)),
        nn.LayerNorm(width),
        nn.Linear(width, num_outputs),
    )
