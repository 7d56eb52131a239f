"""Where a training resumes from: Ray Train's latest checkpoint, a newer checkpoint folder
that Ray's controller never recorded, or the state saved mid-epoch.

``checkpoint.every_n_steps``: rank 0 saves the weights, the train state and the step
reached to ``<run>/steps/epoch-<E>-step-<S>`` (:class:`StepSaver`), written whole and
renamed, the previous save then deleted; a resumed run goes on from that step, drawing the
batches it would have drawn. Not a Ray Train checkpoint: Ray ranks those by an epoch's
metrics, and Tune and the driver's progress would count one as an epoch.

``checkpoint.preemption_check_steps``: every N steps the workers ask Ray Train whether a
node of the run is being preempted; the first time one is, rank 0 makes the same save at
once (:class:`PreemptionWatch`). docs/guides/faults-and-resume.md says when to use each."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainflow.pipelines.models.checkpoint import METRICS, MODEL, TRAIN_STATE, model_state
from trainflow.ray_internals import switches

if TYPE_CHECKING:
    from trainflow.pipelines.training.progress import ProgressLog
    from trainflow.pipelines.training.settings import TrainSettings

STEPS = "steps"  # the folder of a run's mid-epoch saves
_SAVED = re.compile(r"epoch-(\d+)-step-(\d+)")


def step_folder(storage: str, run_name: str) -> str | None:
    """Where the run ``run_name`` keeps its mid-epoch saves: ``<storage>/<run>/steps`` on a
    storage folder (local, or a mount every node shares); None on a bucket."""
    if "://" in storage and not storage.startswith("file://"):
        return None
    return str(Path(storage.removeprefix("file://")) / run_name / STEPS)


def load_training_state(folder: Path) -> tuple[dict, dict]:
    """A checkpoint folder's train state (optimizer, scheduler, scaler, early stopping,
    epoch, history; ``step`` for a mid-epoch save) and model weights. An epoch's
    checkpoint keeps the history in its ``metrics.json`` alone."""
    state = torch.load(folder / TRAIN_STATE, map_location="cpu", weights_only=True)
    if "history" not in state:
        state["history"] = json.dumps(json.loads((folder / METRICS).read_text())["history"])
    return state, torch.load(folder / MODEL, map_location="cpu", weights_only=True)


def resume_state(checkpoint, settings: TrainSettings) -> tuple[dict, dict] | None:
    """The state to resume from: Ray's latest checkpoint; ``settings.resume_from`` when that
    folder is of a later epoch and loads (a killed run's last write may be partial); the
    newest mid-epoch save when it is later still (its train state's ``step`` says how many
    of its epoch's steps it trained)."""
    # Ray's checkpoint opened once: on a URI storage, each as_directory() downloads it.
    with checkpoint.as_directory() if checkpoint is not None else nullcontext() as folder:
        ray_epoch = json.loads((Path(folder) / METRICS).read_text())["epoch"] if folder else -1
        found = [(ray_epoch, Path(folder))] if folder else []
        if settings.resume_from:
            found.append((settings.resume_from_epoch, Path(settings.resume_from)))
        saved = newest_step_save(settings.step_folder) if settings.step_folder else None
        if saved is not None:
            found.append((saved[0] + 0.5, saved[1]))  # its epoch's start, and some steps
        for _, path in sorted(found, key=lambda f: f[0], reverse=True):
            try:
                return load_training_state(path)
            except Exception:  # partly written: the next newest, which was completed
                continue
        return None


def newest_step_save(folder: str) -> tuple[int, Path] | None:
    """The epochs completed before the newest mid-epoch save in ``folder``, and its path."""
    root = Path(folder)
    saves = (
        [(m[1], m[2], p) for p in root.iterdir() if (m := _SAVED.fullmatch(p.name))] if root.is_dir() else []
    )
    if not saves:
        return None
    epoch, _, path = max(saves, key=lambda s: (int(s[0]), int(s[1])))
    return int(epoch), path


class StepSaver:
    """Rank 0's saves within epoch ``epoch`` (0-based: the epochs completed before it): the
    model's weights and ``parts``' train state with the step reached, to ``folder``."""

    def __init__(self, folder: str, parts, epoch: int, history: list[dict[str, float]]):
        self.folder = Path(folder)
        self.parts = parts
        self.epoch = epoch
        self.history = history

    def save(self, step: int) -> None:
        """The state after ``step`` steps of the epoch, written whole; the save before it deleted."""
        name = f"epoch-{self.epoch}-step-{step}"
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        torch.save(model_state(self.parts.model), tmp / MODEL)
        state: dict[str, Any] = {**self.parts.train_state(self.epoch, self.history), "step": step}
        torch.save(state, tmp / TRAIN_STATE)
        os.replace(tmp, self.folder / name)
        for old in self.folder.iterdir():
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)


class PreemptionWatch:
    """Every ``every``-th step, ask Ray Train whether a node of the run is being preempted
    (on every worker at the same steps: the call waits for them all); its
    ``PreemptionInfo`` the first time one is, None otherwise."""

    def __init__(self, every: int):
        self.every = every
        self.seen = False

    def __call__(self, step: int):
        import ray.train
        from ray.exceptions import RayActorError

        if self.seen or step % self.every:
            return None
        try:
            info = ray.train.get_preemption_info()
        except RayActorError:  # the run is being stopped (a sweep's trial paused or ended)
            self.seen = True
            return None
        self.seen = info is not None
        return info


def preemption_checks(settings: TrainSettings) -> int:
    """Every how many steps the workers ask whether a node is being preempted: 0 where no
    save could follow (no folder for it), the cluster warns of none (Ray Train's
    preemption watcher off, as on trainflow's own local clusters), or no Ray Train run
    would tell (a loop in its caller's process)."""
    every = settings.config.checkpoint.preemption_check_steps
    watched = os.environ.get(switches.TRAIN_PREEMPTION_WATCHER, "1").lower() not in ("0", "false")
    return every if settings.step_folder and watched and not settings.own_folder else 0


def step_hooks(
    progress: ProgressLog | None,
    settings: TrainSettings,
    rank: int,
    epoch: int,
    parts,
    history: list[dict[str, float]],
    skip: int,
) -> Callable[[int, float], None] | None:
    """What ``train_epoch`` calls after each step of epoch ``epoch`` (0-based): on rank 0,
    every ``train.log_every_n_steps``-th step's loss to ``progress`` and every
    ``checkpoint.every_n_steps``-th step's state to the run's folder (:class:`StepSaver`);
    on every worker, the preemption checks (:class:`PreemptionWatch`), rank 0 saving the
    state at once when a node is being preempted. ``skip``: the steps of the epoch trained
    before a resume. None when there is nothing to do."""
    log_every = settings.train.log_every_n_steps
    save_every = settings.config.checkpoint.every_n_steps
    logs = bool(log_every and progress is not None) and rank == 0
    saver = (
        StepSaver(settings.step_folder, parts, epoch, history) if settings.step_folder and rank == 0 else None
    )
    save_every = save_every if saver is not None else None
    watch = PreemptionWatch(every) if (every := preemption_checks(settings)) else None
    if not (logs or save_every or watch):
        return None

    def on_step(step: int, loss: float) -> None:
        step += skip
        if logs and step % log_every == 0:
            progress.step({"epoch": epoch + 1, "step": step, "loss": loss})
        if save_every and step % save_every == 0:
            saver.save(step)
        if watch is not None and (info := watch(step)) is not None and saver is not None:
            saver.save(step)
            if progress is not None:
                progress.preempting(info.preempted_node_ids, info.deadline_ms, epoch + 1, step)

    return on_step


def same_start(epoch: int, step: int) -> None:
    """Every worker resumes at the same epoch and step, or a RuntimeError says why not:
    workers that read different saves would wait for each other at different steps."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    mine = torch.tensor([epoch, step], dtype=torch.int64)
    low = mine.clone()
    high = mine.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError(
            f"the workers found different states to resume from (epoch and step from {low.tolist()} "
            f"to {high.tolist()}): checkpoint.every_n_steps keeps its saves in the run's folder, "
            "which every node must see (a shared mount)"
        )
