"""``preprocess.tokenizer``: a Hugging Face tokenizer as the data's transform.

It runs where a ``preprocess.transform`` runs (on every batch as the data is prepared, on
Ray Data's workers; on the raw rows a prediction gets), turning the text column into the
model's inputs by name (``input_ids``, ``attention_mask``, ...: int64 arrays of
``max_length``). It travels as a transform reference, ``hf-tokenizer:{json}`` (a name no
module can have), naming the tokenizer's folder; its hash is the hash of the tokenizer's
files, so a prepared entry is reused while the tokenizer is the same. A checkpoint keeps a
copy of the files in ``tokenizer/`` and its reference names that folder relatively
(:func:`saved`, :func:`located`), so a registered model takes raw text anywhere.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PREFIX = "hf-tokenizer:"
FOLDER = "tokenizer"  # in a checkpoint
# The files a tokenizer is made of (the model's config.json tells AutoTokenizer its class).
FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "config.json",
)


def reference(folder: str, column: str, max_length: int) -> str:
    """The transform reference of the tokenizer in ``folder`` over ``column``."""
    return PREFIX + json.dumps({"folder": folder, "column": column, "max_length": max_length}, sort_keys=True)


def is_reference(path: str | None) -> bool:
    return bool(path) and path.startswith(PREFIX)


def settings(path: str) -> dict[str, Any]:
    """``{"folder", "column", "max_length"}`` of a reference."""
    return json.loads(path.removeprefix(PREFIX))


def transform_of(config) -> str | None:
    """The data's transform in ``config`` (a PipelineConfig): the user's
    ``preprocess.transform``, the tokenizer's reference, or None. Resolves the tokenizer's
    folder (ConfigError when it is not there)."""
    from trainflow.pipelines.hf_hub import model_folder, resolve

    if config.preprocess.transform or config.preprocess.tokenizer is None:
        return config.preprocess.transform
    tok = config.preprocess.tokenizer
    if tok.name is None:
        folder = model_folder(config.model.kind)
    else:
        folder = resolve(tok.name, "preprocess.tokenizer.name")
    return reference(folder, tok.column, tok.max_length)


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str):
    from transformers import AutoTokenizer

    from trainflow.pipelines.hf_hub import quiet

    with quiet():
        return AutoTokenizer.from_pretrained(folder)


# The tokens of the batches met while the preparation's passes run one after another in
# one process (:func:`remembered`): each pass (scan, fit, write) reads every batch.
MEMO_BYTES = 256 << 20


@dataclass
class _Memo:
    arrays: OrderedDict[tuple[str, bytes], dict[str, np.ndarray]] = field(default_factory=OrderedDict)
    bytes: int = 0


_memo: ContextVar[_Memo | None] = ContextVar("trainflow_tokens", default=None)


@contextmanager
def remembered() -> Iterator[None]:
    """Within the block, a batch of texts tokenized again is answered from memory, up to
    :data:`MEMO_BYTES` of inputs; forgotten when the block ends."""
    token = _memo.set(_Memo())
    try:
        yield
    finally:
        _memo.reset(token)


class Tokenize:
    """The tokenizer as a batch transform: the text column replaced by the model's inputs."""

    def __init__(self, path: str):
        self.path = path
        self.settings = settings(path)
        self.tokenizer = _tokenizer(self.settings["folder"])

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        column = self.settings["column"]
        if column not in batch.columns:
            raise ValueError(
                f"preprocess.tokenizer.column {column!r} is not a column here; the columns are: "
                + ", ".join(map(str, batch.columns))
            )
        texts = batch[column].fillna("").astype(str)
        memo = _memo.get()
        if memo is None:
            encoded = self._encode(texts)
        else:
            key = (
                self.path,
                hashlib.sha256(pd.util.hash_pandas_object(texts, index=False).to_numpy()).digest(),
            )
            encoded = memo.arrays.get(key) or self._encode(texts)
            _keep(memo, key, encoded)
        out = batch.drop(columns=[column]).reset_index(drop=True)
        for name, values in encoded.items():
            out[name] = list(values)
        return out

    def _encode(self, texts: pd.Series) -> dict[str, np.ndarray]:
        """Each input's int64 array of the texts."""
        encoded = self.tokenizer(
            texts.tolist(),
            padding="max_length",
            truncation=True,
            max_length=self.settings["max_length"],
            return_tensors="np",
        )
        return {name: np.asarray(values, dtype=np.int64) for name, values in encoded.items()}


def _keep(memo: _Memo, key: tuple[str, bytes], arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as the memo's newest, the oldest forgotten beyond :data:`MEMO_BYTES`."""
    if key in memo.arrays:
        memo.arrays.move_to_end(key)
        return
    memo.arrays[key] = arrays
    memo.bytes += sum(a.nbytes for a in arrays.values())
    while memo.bytes > MEMO_BYTES:
        _, old = memo.arrays.popitem(last=False)
        memo.bytes -= sum(a.nbytes for a in old.values())


@functools.lru_cache(maxsize=8)
def load(path: str) -> Tokenize:
    """The transform a reference names, made once per process."""
    return Tokenize(path)


def identity(path: str) -> str:
    """A hash of the tokenizer's files and settings: a prepared entry's key part."""
    found = settings(path)
    digest = hashlib.sha256(json.dumps({k: v for k, v in found.items() if k != "folder"}).encode())
    for name in FILES:
        if name == "config.json":  # the model's, not the tokenizer's
            continue
        file = Path(found["folder"]) / name
        if file.is_file():
            digest.update(name.encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def saved(path: str, checkpoint: Path) -> str:
    """The tokenizer's files copied into ``checkpoint``'s ``tokenizer/``; its reference there."""
    found = settings(path)
    target = checkpoint / FOLDER
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        file = Path(found["folder"]) / name
        if file.is_file() and file.resolve() != (target / name).resolve():
            shutil.copyfile(file, target / name)
    return reference(FOLDER, found["column"], found["max_length"])


def located(path: str, base: Path) -> str:
    """A reference whose folder is relative (a checkpoint's) made absolute under ``base``."""
    found = settings(path)
    if Path(found["folder"]).is_absolute():
        return path
    return reference(str((base / found["folder"]).resolve()), found["column"], found["max_length"])
