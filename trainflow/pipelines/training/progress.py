"""A training run's progress, from its Ray Train workers to the driver: each worker (re)start,
each epoch's metrics and, with ``train.log_every_n_steps``, step losses.

Workers write rows to a :class:`ProgressLog`; the driver follows it with
:func:`follow_progress` while ``fit()`` runs.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from trainflow import ray_internals

# Where ProgressLog keeps its rows in Ray's GCS key-value store.
PROGRESS_NAMESPACE = "trainflow"
PROGRESS_PREFIX = "trainflow/progress/"


class ProgressLog:
    """The rows that Ray Train workers write for the driver.

    Held in Ray's GCS key-value store, which every process already talks to: no process of
    its own, and a row is stored once its write returns. Each row is one key,
    ``trainflow/progress/<name>/<kind>/<time_ns>-<rank>-<counter>``, with the row as JSON:
    unique without coordination, ordered by time. A writer holds ``name`` and its rank; a
    reader (the driver) holds the rows it has read, so each poll reads only new keys."""

    def __init__(self, name: str, rank: int = 0):
        self.name = name
        self.rank = rank
        self.prefix = f"{PROGRESS_PREFIX}{name}/"
        self._last_ns = 0
        self._read: dict[bytes, dict[str, Any]] = {}  # every row read, by key
        self._unseen: list[bytes] = []  # the keys read since rows() last returned them

    # Written by the workers.

    def add(self, row: dict[str, Any]) -> None:
        self._put({"kind": "epoch", **row})

    def step(self, row: dict[str, Any]) -> None:
        self._put({"kind": "step", **row})

    def preempting(self, nodes: list[str], deadline_ms: int | None, epoch: int, step: int) -> None:
        """Ray Train warned that ``nodes`` are being preempted (gone at ``deadline_ms``, when
        known); the state after ``step`` steps of epoch ``epoch`` (1-based) is saved."""
        self._put(
            {"kind": "preempting", "nodes": nodes, "deadline_ms": deadline_ms, "epoch": epoch, "step": step}
        )

    def started(self, node_id: str, start_epoch: int, workers: int, start_step: int = 0) -> None:
        """This worker (re)started on node ``node_id``, after epoch ``start_epoch`` (0: from
        scratch) and ``start_step`` steps of the next (a mid-epoch save), one of a group of
        ``workers``."""
        row = {"kind": "start", "rank": self.rank, "node_id": node_id, "start_epoch": start_epoch}
        self._put({**row, "workers": workers, "start_step": start_step})

    def _put(self, row: dict[str, Any]) -> None:
        value = json.dumps(row)
        for counter in itertools.count():
            # Never behind this writer's last key, even if the wall clock steps back.
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            key = f"{self.prefix}{row['kind']}/{self._last_ns:020d}-{self.rank}-{counter}"
            # True when the key was taken (by another writer in the same nanosecond).
            if not ray_internals.kv_put(key, value, PROGRESS_NAMESPACE, overwrite=False):
                return

    # Read by the driver.

    def rows(self) -> list[dict[str, Any]]:
        """The rows written since the last call, in order: every epoch and step row, and
        the start of each worker group (its rank 0)."""
        self._read_new(self.prefix)
        keys = sorted(self._unseen, key=_written)
        self._unseen = []
        rows = [self._read[key] for key in keys]
        return [row for row in rows if row["kind"] != "start" or row["rank"] == 0]

    def workers(self) -> list[dict[str, Any]]:
        """Every worker start written so far, in order, without its ``kind``."""
        self._read_new(f"{self.prefix}start/")
        return [
            {k: v for k, v in row.items() if k != "kind"}
            for key, row in sorted(self._read.items(), key=lambda item: _written(item[0]))
            if row["kind"] == "start"
        ]

    def clear(self) -> None:
        """Delete every row of ``name`` from the store."""
        ray_internals.kv_delete_prefix(self.prefix, PROGRESS_NAMESPACE)

    def _read_new(self, prefix: str) -> None:
        for key in ray_internals.kv_list(prefix, PROGRESS_NAMESPACE):
            if key not in self._read:
                value = ray_internals.kv_get(key, PROGRESS_NAMESPACE)
                if value is not None:
                    self._read[key] = json.loads(value)
                    self._unseen.append(key)


def clear_progress(names_starting: str) -> None:
    """Delete the rows of every progress name that starts with ``names_starting``: those of
    earlier attempts of a run, which a driver killed outright could not delete."""
    ray_internals.kv_delete_prefix(f"{PROGRESS_PREFIX}{names_starting}", PROGRESS_NAMESPACE)


def _written(key: bytes) -> tuple[int, ...]:
    """A progress row's key, as what orders it: its time, then its writer's rank and counter."""
    return tuple(int(part) for part in key.rsplit(b"/", 1)[1].split(b"-"))


@dataclass
class Progress:
    """What :func:`follow_progress` saw: after the block, every worker (re)start."""

    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def starts(self) -> list[int]:
        """The epoch each start of the worker group resumed after (0: from scratch)."""
        return [w["start_epoch"] for w in self.workers if w["rank"] == 0]

    @property
    def sizes(self) -> list[int]:
        """The workers of each start of the worker group: an elastic run's resizes."""
        return [w["workers"] for w in self.workers if w["rank"] == 0]

    @property
    def nodes(self) -> list[str]:
        return sorted({w["node_id"] for w in self.workers})


@contextmanager
def follow_progress(
    name: str, on_row: Callable[[dict[str, Any]], None], every_s: float = 0.5
) -> Iterator[Progress]:
    """Call ``on_row`` for each row the workers write to the :class:`ProgressLog` ``name``
    as it arrives, ``{"kind": "start" | "epoch" | "step", ...}``, and delete the rows
    after the block."""
    log = ProgressLog(name)
    stop = threading.Event()
    progress = Progress()

    def drain() -> None:
        for row in log.rows():
            on_row(row)

    def poll() -> None:
        while not stop.wait(every_s):
            drain()

    thread = threading.Thread(target=poll, name=f"{name}-progress", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        try:
            drain()
            progress.workers = log.workers()
        finally:
            log.clear()
