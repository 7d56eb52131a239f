"""What one trial of a sweep does and reports: the name of its Ray Train runs
(:func:`trial_run`), its epochs (and under PBT and PB2 their checkpoints) handed to Ray
Tune (:func:`report_to_tune`, :class:`TuneReports`), its start, epochs and end as the
sweep's driver sees them (:func:`trial_events`), and the placement groups of its worker
groups, which the sweep removes (:class:`PlacementTracker`).

A trial reports each epoch from its own thread while its Ray Train run fits in another,
the rows coming from Ray Train's controller through a Ray queue that the trial drains
before it returns: Tune's TuneReportCallback reports from another thread, and a row that
arrives after the trial's function returned waits there forever, and the sweep with it.
A trial that trains in its own process reports through :class:`TuneReports`. Torch-free:
the steps' log filter imports :class:`SweepFailed`, the training loop
:func:`record_placement`.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from trainflow import ray_internals

# Where a trial's report row holds its checkpoint's path (the key TuneReportCallback uses too).
CHECKPOINT_PATH = "checkpoint_path"
# Where one report of several epochs holds their rows, as JSON (TuneReports).
EPOCH_ROWS = "epoch_rows"
# The columns of a trial's history, as the sweep's table and its best trial keep them.
HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "val_accuracy", "lr")


class SweepFailed(RuntimeError):
    """No trial of a sweep produced a checkpoint; the message lists why each failed."""


def epoch_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The epochs one of a trial's reports to Tune holds, in order: its own row, or the
    rows it carries under :data:`EPOCH_ROWS`."""
    return json.loads(result[EPOCH_ROWS]) if EPOCH_ROWS in result else [result]


def exploited_checkpoint(checkpoint) -> tuple[str, int] | None:
    """The folder and epoch of the checkpoint Tune hands a restarted trial (a PBT exploit:
    a copy of a stronger trial's latest), or None for a trial's first start."""
    if checkpoint is None:
        return None
    from trainflow.pipelines.models.checkpoint import METRICS

    epoch = json.loads((Path(checkpoint.path) / METRICS).read_text())["epoch"]
    return checkpoint.path, int(epoch)


# How long a trial's epochs wait to go to Tune together, where its scheduler allows it.
REPORT_EVERY_S = 1.0


class TuneReports:
    """A trial's epochs on their way to Ray Tune, each row with its checkpoint's path.

    A report is a round trip to the sweep's driver, which the trial waits for. With
    ``every_s`` 0 each epoch goes at once; else the epochs of ``every_s`` seconds go as one
    report (the latest at its top, all under :data:`EPOCH_ROWS`), an epoch of ``at_epochs``
    (where the scheduler compares trials: ASHA's rungs) goes at once with those before it,
    and :meth:`flush` sends the rest."""

    def __init__(self, every_s: float = 0.0, at_epochs: Collection[int] = ()) -> None:
        self.every_s = every_s
        self.at_epochs = frozenset(at_epochs)
        self.pending: list[dict[str, Any]] = []
        self.sent = time.monotonic()

    def add(self, metrics: dict[str, float], checkpoint: Path) -> None:
        self.pending.append({**metrics, CHECKPOINT_PATH: str(checkpoint)})
        if int(metrics["epoch"]) in self.at_epochs or time.monotonic() - self.sent >= self.every_s:
            self.flush()

    def flush(self) -> None:
        """Report the epochs not reported yet, if any."""
        import ray.tune

        if not self.pending:
            return
        rows = self.pending
        self.pending = []
        ray.tune.report({**rows[-1], EPOCH_ROWS: json.dumps(rows)} if len(rows) > 1 else rows[-1])
        self.sent = time.monotonic()


def report_to_tune(train: Callable[..., Any], checkpoints: bool) -> None:
    """``train(callbacks=...)`` in a thread of its own, while this (the trial's) thread
    reports each epoch's metrics to Tune, the path of its checkpoint among them; with
    ``checkpoints``, the checkpoint too, which Tune copies into the trial's folder: what
    PBT hands a weaker trial. Ray Train's callbacks run in its controller actor, so the
    rows come through a Ray queue."""
    import ray.train
    import ray.tune
    from ray.util.queue import Queue

    rows = Queue(actor_options={"num_cpus": 0})
    failed: list[BaseException] = []

    def work() -> None:
        try:
            train(callbacks=[_forward_reports(rows)])
        except BaseException as e:  # noqa: BLE001 - raised again in the trial's thread
            failed.append(e)
        finally:
            try:
                rows.put(None)
            except Exception:  # noqa: BLE001 - Tune stopped the trial: its queue is gone with it
                pass

    thread = threading.Thread(target=work, name="trainflow-trial", daemon=True)
    thread.start()
    while (row := rows.get()) is not None:
        path = row.get(CHECKPOINT_PATH)
        ray.tune.report(row, checkpoint=ray.train.Checkpoint(path) if path and checkpoints else None)
    thread.join()
    if failed:
        raise failed[0]


def quiet_stop() -> None:
    """A trial that Tune stops (ASHA) or pauses (PBT) gets SIGTERM, and Ray's handler raises
    SystemExit wherever this process's Python is: inside a finalizer (a weakref's callback
    while the trial waits on a report), Python prints it as an ignored exception with its
    traceback. Those are dropped; any other goes to Python's own hook."""
    import sys

    default = sys.__unraisablehook__

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            default(unraisable)

    sys.unraisablehook = hook


def _forward_reports(rows):
    """A Ray Train callback that puts each report's metrics (rank 0's, as Ray Tune's
    TuneReportCallback forwards them) and its checkpoint's path into ``rows``; it runs in
    Ray Train's controller."""
    from ray.exceptions import RayActorError
    from ray.train.v2.api.callback import UserCallback

    class ForwardReports(UserCallback):
        def after_report(self, run_context, metrics, checkpoint) -> None:
            row = dict(metrics[0])
            if checkpoint is not None:
                row[CHECKPOINT_PATH] = checkpoint.path
            try:
                rows.put(row)
            except RayActorError:  # Tune ended the trial (a PBT pause or exploit): nobody reads
                pass

    return ForwardReports()


def trial_run(trial_id: str, start: tuple[str, int] | None = None) -> str:
    """The name of a trial's Ray Train run; with ``start`` (a checkpoint folder of another
    trial and its epoch), the run that goes on from it."""
    if start is None:
        return f"trial-{trial_id}"
    # Unique: a run of the same name would resume from its own latest checkpoint instead.
    return f"trial-{trial_id}-from-{trial_id_in(start[0])}-epoch-{start[1]}-{uuid.uuid4().hex[:6]}"


def trial_events(on_event: Callable[[dict[str, Any]], None], release: Callable[[str], None]):
    """A Ray Tune callback that hands each trial's start, epochs and end to ``on_event``,
    and releases an ended or restarted trial's training workers' resources (``release`` of
    its Ray Train runs' name); a trial restarted from another's checkpoint (a PBT exploit)
    is an ``exploit`` event, with the trial and epoch it goes on from; an ``epoch`` event
    carries the trial's report."""
    from ray.tune import Callback

    class TrialEvents(Callback):
        def __init__(self) -> None:
            self.paused: set[str] = set()

        def on_step_end(self, iteration, trials, **info):
            # PBT pauses a trial by killing its actor, and its trainer with it: the group
            # of the trainer's workers is released for the trials that run meanwhile.
            for trial in trials:
                if trial.status == trial.PAUSED and trial.trial_id not in self.paused:
                    self.paused.add(trial.trial_id)
                    release(trial_run(trial.trial_id))

        def on_trial_start(self, iteration, trials, trial, **info):
            self.paused.discard(trial.trial_id)
            event = {"kind": "start", "trial_id": trial.trial_id, "params": trial.config["params"]}
            if (start := exploited_checkpoint(trial.checkpoint)) is not None:
                source = trial_id_in(start[0])  # the trial itself: paused to wait for the others
                kind = "resume" if source == trial.trial_id else "exploit"
                event.update(kind=kind, source=source, epoch=start[1])
            on_event(event)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            for row in epoch_rows(result):
                on_event({"kind": "epoch", "trial_id": trial.trial_id, **history_row(row)})

        def on_trial_complete(self, iteration, trials, trial, **info):
            release(trial_run(trial.trial_id))
            on_event({"kind": "end", "trial_id": trial.trial_id})

        def on_trial_error(self, iteration, trials, trial, **info):
            release(trial_run(trial.trial_id))
            on_event({"kind": "error", "trial_id": trial.trial_id, "error": _error_line(trial.error_file)})

    return TrialEvents()


def history_row(result: dict[str, Any]) -> dict[str, Any]:
    """What the sweep keeps of one epoch's report: its history columns and checkpoint."""
    return {k: result[k] for k in (*HISTORY_KEYS, CHECKPOINT_PATH) if k in result}


def _error_line(error_file: str | None) -> str:
    """The last line of a failed trial's traceback, which says what went wrong."""
    if not error_file or not Path(error_file).is_file():
        return "failed (no error recorded)"
    lines = [line.strip() for line in Path(error_file).read_text().splitlines() if line.strip()]
    return lines[-1] if lines else "failed (no error recorded)"


def trial_id_in(path: str) -> str:
    """The id of the trial whose folder holds ``path``: Tune names a trial's folder after it
    (run_trial_af7a9_00003_3_train_lr=...)."""
    for part in reversed(Path(path).parts):
        if found := re.match(r"run_trial_([0-9a-f]+_\d{5})_", part):
            return found[1]
    return "?"


# A worker group's placement group in Ray's GCS key-value store, a key per group:
# trainflow/placements/<tracker>/<run>/<group id>, written once by the worker that holds it.
NAMESPACE = "trainflow"
PREFIX = "trainflow/placements/"


def record_placement(tracker: str, run: str) -> None:
    """Record the placement group of the calling Ray Train worker's group, in the Ray
    Train run ``run``, with the :class:`PlacementTracker` named ``tracker``."""
    import ray

    group = ray.util.get_current_placement_group()
    if group is not None:
        ray_internals.kv_put(f"{PREFIX}{tracker}/{run}/{group.id.hex()}", b"", NAMESPACE)


class PlacementTracker:
    """The placement groups that the worker groups of a sweep named ``name`` recorded
    (:func:`record_placement`, by rank 0 of each), removed when their trial ends
    (:meth:`release`) and when the sweep does (:meth:`close`). A trial that ASHA stops is
    killed with its trainer's controller, which then cannot remove its workers' group; Ray
    Train's own cleaner does so only a check later, and only in workers that run
    trainflow's setup hook (``ray_internals.answer_cleaner_from_gcs``): left alone, later
    trials could wait for those CPUs forever."""

    def __init__(self, name: str):
        self.name = name
        self.prefix = f"{PREFIX}{name}/"

    def groups(self, run: str = "") -> list[str]:
        """The hex ids of the groups recorded for the Ray Train run ``run`` and the runs
        named ``run-<more>`` (a trial's runs after a PBT exploit); "": every run."""
        keys = [key.decode() for key in ray_internals.kv_list(f"{self.prefix}{run}", NAMESPACE)]
        names = [key.removeprefix(self.prefix).rsplit("/", 1) for key in keys]
        return sorted(
            {group for name, group in names if not run or name == run or name.startswith(f"{run}-")}
        )

    def release(self, run: str) -> None:
        """Remove the groups of the Ray Train run ``run`` (and ``run-<more>``) that still
        hold resources."""
        self._remove(self.groups(run))

    def close(self) -> None:
        """Remove every group still held, and forget them all."""
        try:
            self._remove(self.groups())
        finally:
            ray_internals.kv_delete_prefix(self.prefix, NAMESPACE)

    @staticmethod
    def _remove(hex_ids: list[str]) -> None:
        import ray
        from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

        for hex_id in hex_ids:
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id)))
            if placement_group_table(group).get("state") not in ("REMOVED", None):
                remove_placement_group(group)
