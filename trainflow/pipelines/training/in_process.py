"""Training in the calling process, without Ray Train's controller and workers: a sweep's
trial in Ray Tune's trial process, which Tune hands the next trial (``reuse_actors``), and a
run of ``scaling.num_workers: 0`` in the flow's own process, as Ray Train's local mode runs
a training function.

Their start (torch imported in new processes) costs more than a small model's epochs. The
loop asks :class:`LocalContext` what it would ask Ray Train's context, saves each epoch's
checkpoint in the run's folder as Ray Train would (:func:`save_kept`), keeps the best
``checkpoint.keep`` and the latest, and a trial reports its epochs to Tune from its thread
(:class:`trainflow.pipelines.sweep.trials.TuneReports`), where ASHA stops it (docs/guides/sweeps.md).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainflow.config import ConfigError
from trainflow.config.outputs import CheckpointSection
from trainflow.files import redacted
from trainflow.pipelines.models.checkpoint import METRICS


class LocalContext:
    """What the loop asks of Ray Train's context when it runs in its caller's process: the
    only worker, in the run of its folder's name (Ray Train's own functions refuse to
    answer inside a Tune trial, and outside a Ray Train run)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def get_world_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_experiment_name(self) -> str:
        return Path(self.folder).name


def on_a_folder(storage: str) -> bool:
    """Whether ``storage`` is a folder (local, a shared mount, ``file://``), where a loop in
    its caller's process saves its checkpoints; not a bucket."""
    return "://" not in storage or storage.startswith("file://")


def run_folder(storage: str, run_name: str) -> Path:
    """The folder of the run ``run_name`` under ``storage``, made; ConfigError, in one line,
    on a bucket, where only Ray Train's workers save checkpoints."""
    if not on_a_folder(storage):
        raise ConfigError(
            f"scaling.num_workers 0 saves its checkpoints in a folder, and storage {redacted(storage)} is "
            "a bucket: use a folder, or give num_workers 1 or more"
        )
    folder = Path(storage.removeprefix("file://")) / run_name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_kept(
    metrics: dict[str, float], folder: str, kept: CheckpointSection, save: Callable[[Path], Any]
) -> Path:
    """Save an epoch's checkpoint with ``save(folder)`` as ``checkpoint_epoch_<n>`` in the
    run ``folder`` (written under a temporary name, then renamed), delete those past the
    best ``kept.keep`` by ``kept.metric`` and the latest, and return its path. ``metrics``:
    the epoch's, as the checkpoint's metrics.json holds them."""
    run = Path(folder)
    path = run / f"checkpoint_epoch_{int(metrics['epoch']):06d}"
    tmp = run / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    shutil.rmtree(path, ignore_errors=True)  # a trial reset to the same run name starts over
    os.replace(tmp, path)
    _remember(path, kept.metric, metrics.get(kept.metric))
    _keep_best(run, kept, path)
    return path


def best_kept(folder: str, kept: CheckpointSection) -> Path:
    """The run's checkpoint that scores best on ``kept.metric``; of equals, the latest."""
    saved = sorted(Path(folder).glob("checkpoint_epoch_*"))
    if not saved:
        raise FileNotFoundError(f"{folder}: the run saved no checkpoint")
    return max(reversed(saved), key=lambda path: -_score(path, kept))


def _keep_best(run: Path, kept: CheckpointSection, latest: Path) -> None:
    """Delete the run's checkpoints but the best ``kept.keep`` by ``kept.metric`` (better
    by ``kept.mode``) and ``latest``."""
    saved = sorted(run.glob("checkpoint_epoch_*"))
    best = set(sorted(saved, key=lambda path: _score(path, kept))[: kept.keep]) | {latest}
    for folder in saved:
        if folder not in best:
            shutil.rmtree(folder, ignore_errors=True)
            _scores.pop(folder, None)


# Each checkpoint's value of the metric that ranks it, by folder, with the metric's name
# and its metrics.json's stat as they were then: every epoch ranks the run's checkpoints
# again, and their metrics.json holds the whole history. Set for what this process saved,
# read once from what it did not (an earlier attempt's checkpoints).
_scores: dict[Path, tuple[str, tuple[int, int, int], Any]] = {}


def _stamp(folder: Path) -> tuple[int, int, int]:
    stat = (folder / METRICS).stat()
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _remember(folder: Path, metric: str, value: Any) -> None:
    _scores[folder] = (metric, _stamp(folder), value)


def _score(folder: Path, kept: CheckpointSection) -> float:
    """A checkpoint's ``kept.metric``, signed so that the lower is the better; infinite
    where the checkpoint lacks it."""
    known = _scores.get(folder)
    if known is None or known[:2] != (kept.metric, _stamp(folder)):
        _remember(folder, kept.metric, json.loads((folder / METRICS).read_text()).get(kept.metric))
    value = _scores[folder][2]
    sign = -1.0 if kept.mode == "max" else 1.0
    return float("inf") if value is None else sign * float(value)
