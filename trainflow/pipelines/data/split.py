"""The train/val/test split: seeded, from each row's content, the same wherever and in
whatever order the rows are read.

Every kept row gets a seeded 64-bit hash of its content (:func:`row_keys`; an image by
its path, or by its index in a converted torchvision dataset). Small inputs are split
exactly per class: the driver ranks each class's hashes and the lowest go to test, the
next to val (:func:`exact_split_codes`). Larger inputs place each row by its own hash
(:func:`hash_split_codes`), which streams in bounded memory and is stratified in
expectation. Preparing an input and rebuilding one of its splits later (the champion's
re-score) both go through these functions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainflow.config import SplitConfig
from trainflow.pipelines.data.schema import INDEX, PATH, SourceInfo

SPLIT_NAMES = ("train", "val", "test")  # a split's code is its index here
# Up to this many kept rows the split is exact per class (their hashes are ranked in the
# driver); above it each row's split comes from its own hash.
EXACT_SPLIT_ROWS = 1_000_000
# Inputs up to this size may be split exactly (above: by row hash whatever the row count).
SMALL_INPUT_BYTES = 256 << 20


def key_columns(info: SourceInfo) -> list[str]:
    """The columns a row's hash is taken over: an image's path (its index in a converted
    torchvision dataset); a table row's columns."""
    if info.is_images:
        return [PATH] if info.format == "images" else [INDEX]
    return [*info.input_columns, info.label_column]


def row_keys(batch: pd.DataFrame, info: SourceInfo, seed: int) -> np.ndarray:
    """A seeded 64-bit hash of each row's :func:`key_columns`."""
    if not len(batch):
        return np.zeros(0, dtype=np.uint64)
    frame = batch[key_columns(info)]
    if info.arrays:  # a transform's array per row hashes by its bytes
        frame = frame.assign(**{c: [np.asarray(v).tobytes() for v in frame[c]] for c in info.arrays})
    rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    salt = pd.util.hash_array(np.array([seed], dtype=np.int64))[0]
    # hash_array mixes the bits again, so each seed ranks the rows differently.
    return pd.util.hash_array(rows ^ salt)


def rank_split_codes(keys: np.ndarray, *, val: float, test: float) -> np.ndarray:
    """Split codes (0 train, 1 val, 2 test) for one group of rows from their seeded hashes:
    the lowest ``round(n * test)`` go to test, the next ``round(n * val)`` to val."""
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    n_test = round(n * test)
    n_val = round(n * val)
    split = np.zeros(n, dtype=np.int8)
    split[order[:n_test]] = 2
    split[order[n_test : n_test + n_val]] = 1
    return split


def hash_split_codes(keys: np.ndarray, *, val: float, test: float) -> np.ndarray:
    """Split codes from each row's own hash: no row depends on another, so it streams.

    Each class lands in each split in proportion, up to binomial sampling noise: a class
    of n rows puts n * p rows in a split of fraction p, give or take sqrt(n * p * (1 - p)).
    """
    u = keys / float(2**64)
    return np.where(u < test, 2, np.where(u < test + val, 1, 0)).astype(np.int8)


def exact_split_codes(
    keys: list[np.ndarray], labels: list[np.ndarray], split: SplitConfig
) -> list[np.ndarray]:
    """Every kept row's split (``keys`` and ``labels``: one array per fragment), ranked
    within its class by its seeded hash, or among all rows when the split is not
    stratified; one array of codes per fragment."""
    k = np.concatenate(keys)
    codes = np.zeros(len(k), dtype=np.int8)
    if split.stratify:
        groups, _ = pd.factorize(pd.Series(np.concatenate(labels)))
        members = np.argsort(groups, kind="stable")
        bounds = np.flatnonzero(np.diff(groups[members])) + 1
        parts = np.split(members, bounds)
    else:
        parts = [np.arange(len(k))]
    for rows in parts:
        codes[rows] = rank_split_codes(k[rows], val=split.val, test=split.test)
    return np.split(codes, np.cumsum([len(x) for x in keys])[:-1])


def small_input(info: SourceInfo) -> bool:
    """Small enough to split exactly, if its rows are few enough (SMALL_INPUT_BYTES)."""
    return info.bytes <= SMALL_INPUT_BYTES


def split_is_exact(info: SourceInfo, kept_rows: int) -> bool:
    """Whether this input is split exactly per class, or its rows placed by hash."""
    return small_input(info) and kept_rows <= EXACT_SPLIT_ROWS
