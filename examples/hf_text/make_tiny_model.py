"""A tiny pretrained-shaped BERT and its WordPiece tokenizer, saved with ``save_pretrained``
into a folder that ``model.kind: hf:<folder>`` names: for trying the Hugging Face path on a
machine without the hub (the tests build theirs so).

    python make_tiny_model.py tiny-bert            # from ../text_classification/texts.csv

The tokenizer is trained with ``tokenizers`` on the texts given; the model's weights are
random (a real fine-tune starts from a hub model: ``hf:bert-base-uncased``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

TEXTS = Path(__file__).resolve().parents[1] / "text_classification" / "texts.csv"


def make_tiny_model(folder: str | Path, texts: list[str], *, vocab_size: int = 500, seed: int = 0) -> Path:
    """A two-layer BERT of width 32 and a tokenizer trained on ``texts``, in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast
    from transformers.utils import logging

    logging.disable_progress_bar()

    folder = Path(folder)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special)
    )
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=wordpiece.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    out = make_tiny_model(
        sys.argv[1] if len(sys.argv) > 1 else "tiny-bert", pd.read_csv(TEXTS)["text"].tolist()
    )
    print(f"wrote {out}")
