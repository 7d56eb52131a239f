"""How a sweep's trial hands its epochs to Ray Tune, and, under Population Based Training,
their checkpoints too (PBT copies a strong trial's into a weak one); how a trial restarted
from another's checkpoint finds where to go on from.

A trial reports each epoch with ``ray.tune.report`` from its own thread while its Ray
Train run fits in another, the rows coming from Ray Train's controller through a Ray
queue that the trial drains before it returns. Ray Tune's TuneReportCallback forwards
only a report's metrics and its checkpoint's path, and its rows go through Tune's session
from another thread: a row that arrives after the trial's function returned waits there
forever, and the sweep with it (seen under load). A trial that trains in its own process
reports through :class:`TuneReports`: a second's worth of epochs at a time, and an epoch
where its scheduler compares trials (ASHA's rungs) at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from trainflow.pipelines.models.checkpoint import METRICS

# Where a trial's report row holds its checkpoint's path (the key TuneReportCallback uses too).
CHECKPOINT_PATH = "checkpoint_path"
# Where one report of several epochs holds their rows, as JSON (TuneReports).
EPOCH_ROWS = "epoch_rows"


def epoch_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The epochs one of a trial's reports to Tune holds, in order: its own row, or the
    rows it carries under :data:`EPOCH_ROWS`."""
    return json.loads(result[EPOCH_ROWS]) if EPOCH_ROWS in result else [result]


def exploited_checkpoint(checkpoint) -> tuple[str, int] | None:
    """The folder and epoch of the checkpoint Tune hands a restarted trial (a PBT exploit:
    a copy of a stronger trial's latest), or None for a trial's first start."""
    if checkpoint is None:
        return None
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
