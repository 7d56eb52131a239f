"""The example's model (``model.kind: text_bag:build``): the mean of each text's token
embeddings (``nn.EmbeddingBag``, padding ignored), then a linear layer per class.

trainflow calls ``build(input_shape=[LENGTH], num_outputs=..., **model.args)`` in each
worker; the model receives each batch's ``tokens`` as a LongTensor [N, LENGTH].
"""

import torch
from torch import nn


class TextBag(nn.Module):
    def __init__(self, vocab_size: int, dim: int, num_outputs: int, dropout: float):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim, mode="mean", padding_idx=0)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, num_outputs))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def build(
    input_shape: list[int], num_outputs: int, vocab_size: int = 4096, dim: int = 32, dropout: float = 0.0
):
    """``vocab_size``: text_tokens.VOCAB_SIZE, the ids the tokenizer gives."""
    return TextBag(vocab_size, dim, num_outputs, dropout)
