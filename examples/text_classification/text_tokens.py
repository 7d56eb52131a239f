"""The example's batch transform (``preprocess.transform: text_tokens:tokenize``): each
text becomes LENGTH token ids, a hashing tokenizer that needs no vocabulary file and
downloads nothing.

trainflow calls ``tokenize`` on every batch of the CSV's rows while preparing the data
(with the label column, which it passes through), and on the raw rows a prediction gets
(``load_model(...).predict``, batch prediction, the served ``/predict``: without it).
Its output column ``tokens`` holds one int64 array per row: trainflow keeps it int64 and
unscaled, and the model (text_bag.py) receives it as a LongTensor [N, LENGTH].
"""

import re
import zlib

import numpy as np
import pandas as pd

VOCAB_SIZE = 4096  # token ids run 1..VOCAB_SIZE-1; 0 pads a short text
LENGTH = 24  # tokens per text: longer texts are cut, shorter ones padded
WORD = re.compile(r"[a-z][a-z0-9]+")


def token_ids(text: str) -> np.ndarray:
    """A text's words (lower case, two letters or more), each hashed to an id, padded with 0."""
    ids = np.zeros(LENGTH, dtype=np.int64)
    words = WORD.findall(str(text).lower())[:LENGTH]
    ids[: len(words)] = [zlib.crc32(w.encode()) % (VOCAB_SIZE - 1) + 1 for w in words]
    return ids


def tokenize(batch: pd.DataFrame) -> pd.DataFrame:
    """The batch with its ``text`` column replaced by ``tokens``; every other column (the
    label, when there is one) passes through."""
    out = batch.drop(columns=["text"])
    out["tokens"] = [token_ids(t) for t in batch["text"]]
    return out
