"""Fault drills for the training tests, used as ``train.callbacks``.

Each fails once per Ray run: the first call at its epoch leaves a marker file named
after the run, so the worker group that Ray (or a Prefect retry) starts again from the
checkpoint trains on. They run inside Ray Train workers, which import this module
from the driver's working directory (the repository root under pytest).
"""

import os
import signal
import tempfile
import time
from pathlib import Path

MARKERS = Path(tempfile.gettempdir()) / "trainflow-fault-drills"


def marker(run_name: str) -> Path:
    return MARKERS / run_name


def _first_time() -> bool:
    import ray.train

    path = marker(ray.train.get_context().get_experiment_name())
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


# How long a drill waits after its epoch's report before it kills: Ray Train's controller
# collects a report at its next poll of the worker, and a worker killed before that poll
# takes the report with it (the group then resumes from the checkpoint before). A real
# preemption lands at any moment of an epoch; epochs of these tests take milliseconds.
SETTLE_S = 2.0


def _kill_at(epoch: int, rank: int, at_epoch: int, at_rank: int) -> None:
    if epoch == at_epoch and rank == at_rank and _first_time():
        time.sleep(SETTLE_S)
        # What a preempted VM or an OOM kill does: no exception, no cleanup.
        os.kill(os.getpid(), signal.SIGKILL)


def kill_rank0_at_epoch2(epoch, metrics, rank):
    _kill_at(epoch, rank, 2, 0)


def kill_rank1_at_epoch2(epoch, metrics, rank):
    _kill_at(epoch, rank, 2, 1)


def kill_rank1_at_epoch3(epoch, metrics, rank):
    _kill_at(epoch, rank, 3, 1)


def fail_at_epoch2(epoch, metrics, rank):
    """An ordinary exception on rank 0 after epoch 2's checkpoint was reported (and
    collected: see SETTLE_S)."""
    if epoch == 2 and rank == 0 and _first_time():
        time.sleep(SETTLE_S)
        raise RuntimeError("fault drill: the train task fails once after epoch 2")
