"""What a training function of the user's own (``train.loop``) reports, followed from Ray
Train's controller: :class:`LoopReports`, a Ray Train ``UserCallback``, turns each report
into the epoch row the driver logs (a :class:`~.progress.ProgressLog` row, as trainflow's
own loop writes) and keeps the epochs so far in every checkpoint the loop reports
(:data:`HISTORY`), where a resumed run, the driver and the checkpoint's conversion read them.

The controller never imports torch (``ray_internals.torch_config``): it imports this
module to unpickle the callback, so this module imports none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import ray.train

from trainflow.config import ConfigError
from trainflow.pipelines.training.progress import ProgressLog

# The file a user's loop's checkpoints gain beside its own: the epochs so far.
HISTORY = "trainflow-history.json"


def numbers(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    """The metrics that are numbers: what a history row, MLflow and the log take."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _a_count(value: Any) -> bool:
    """Whether a reported ``epoch`` is a count: a whole number, not below 0."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and value >= 0 and value == int(value)


class LoopHistory:
    """The epochs a user's loop reported, as rows of its numeric metrics with trainflow's
    ``epoch``, counted from 1 as trainflow's own loop counts them.

    An epoch's number is the ``epoch`` the loop reports, plus one when the loop counts from
    0 (its first report says 0, as Ray's guide counts); without one, the epoch after the
    last. A report of an epoch reported before (a restarted worker group) replaces that row
    and every later one."""

    def __init__(self, rows: list[dict[str, Any]] | None = None, epoch_offset: int | None = None):
        self.rows = list(rows or [])
        # Added to the loop's epoch: 1 when it counts from 0; None until it reports one.
        self.epoch_offset = epoch_offset
        # The rows the latest checkpoint holds: a restarted worker group resumes after them.
        self.checkpointed = len(self.rows)

    def add(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record one report of the loop (rank 0's metrics); return its row."""
        reported = metrics.get("epoch")
        if _a_count(reported):
            if self.epoch_offset is None:
                self.epoch_offset = 1 if reported == 0 else 0
            epoch = int(reported) + self.epoch_offset
        else:
            epoch = self.rows[-1]["epoch"] + 1 if self.rows else 1
        self.rows = [row for row in self.rows if row["epoch"] < epoch]
        self.checkpointed = min(self.checkpointed, len(self.rows))
        row = {**numbers(metrics), "epoch": epoch}
        self.rows.append(row)
        return row

    def checkpoint(self) -> dict[str, Any]:
        """The rows so far are a checkpoint's: what its :data:`HISTORY` holds."""
        self.checkpointed = len(self.rows)
        return self.to_json()

    def rewind(self) -> None:
        """Drop the rows after the latest checkpoint: the worker group failed, and its next
        start resumes from that checkpoint."""
        self.rows = self.rows[: self.checkpointed]

    def to_json(self) -> dict[str, Any]:
        return {"history": self.rows, "epoch_offset": self.epoch_offset}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> LoopHistory:
        if not data:
            return cls()
        return cls(data["history"], data["epoch_offset"])


def write_history(checkpoint: ray.train.Checkpoint, data: dict[str, Any]) -> None:
    """Write a checkpoint's :data:`HISTORY` where Ray Train stored it."""
    with checkpoint.filesystem.open_output_stream(f"{checkpoint.path}/{HISTORY}") as f:
        f.write(json.dumps(data).encode())


def read_history(checkpoint: ray.train.Checkpoint | None) -> dict[str, Any] | None:
    """A checkpoint's :data:`HISTORY`, read where Ray Train stored it; None when there is
    no checkpoint or it has none."""
    if checkpoint is None:
        return None
    try:
        with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/{HISTORY}") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def resumed_history(storage: str, run_name: str) -> dict[str, Any] | None:
    """The :data:`HISTORY` of the checkpoint the run ``run_name`` under ``storage`` resumes
    from when it is fitted again (Ray Train's latest of the run); None for a new run."""
    from trainflow.files import filesystem

    fs, root = filesystem(storage)
    try:
        result = ray.train.Result.from_path(f"{root}/{run_name}", storage_filesystem=fs)
    except RuntimeError:  # no such run, or one that never recorded a checkpoint
        return None
    return read_history(result.checkpoint)


def missing_metric(loop: str, metric: str, reported: Mapping[str, Any]) -> ConfigError:
    """The one line for a loop whose checkpoints lack the checkpoint.metric a config names."""
    named = ", ".join(sorted(reported)) or "none"
    return ConfigError(
        f"checkpoint.metric {metric}: train.loop {loop} reports no such metric with its "
        f"checkpoints; it reports {named}: name one of them"
    )


def last_epoch(history: Mapping[str, Any] | None) -> int:
    """The epoch a :data:`HISTORY` ends after (0 for none)."""
    rows = (history or {}).get("history") or []
    return int(rows[-1]["epoch"]) if rows else 0


class LoopReports(ray.train.UserCallback):
    """Runs in Ray Train's controller: each report of a user's loop becomes an epoch row of
    the ProgressLog ``progress`` (None: nobody follows the run) and a row of the history
    every checkpoint keeps. ``history``: the :data:`HISTORY` the run resumes from, else
    None. ``required``: the loop's path and the checkpoint.metric the config names; a
    checkpoint reported without it ends the run (:func:`missing_metric`)."""

    def __init__(
        self,
        progress: str | None,
        history: Mapping[str, Any] | None = None,
        required: tuple[str, str] | None = None,
    ):
        self.progress = progress
        self.history = LoopHistory.from_json(history)
        self.required = required

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if checkpoint is not None and self.required and self.required[1] not in metrics[0]:
            raise missing_metric(*self.required, metrics[0])
        row = self.history.add(metrics[0])
        if checkpoint is not None:
            write_history(checkpoint, self.history.checkpoint())
        if self.progress:
            ProgressLog(self.progress).add(row)

    def after_exception(self, run_context, worker_exceptions) -> None:
        self.history.rewind()
