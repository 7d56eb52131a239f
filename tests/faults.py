"""Fault drills for the training tests, used as ``train.callbacks``.

Each fails once per Ray run: the first call at its epoch leaves a marker file named
after the run, so the worker group that Ray (or a Prefect retry) starts again from the
checkpoint trains on. They run inside Ray Train workers, which import this module
from the driver's working directory (the repository root under pytest).
"""

import json
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


# A drill strikes once Ray Train's controller has collected its epoch's report: the
# controller polls each worker for reports, and a worker killed before that poll takes
# its report with it (the group then resumes from the checkpoint before). The event that
# says "collected" is the controller's snapshot of its checkpoints in the run's folder
# naming the epoch's checkpoint (the checkpoint folder itself is written earlier, by the
# worker). A real preemption lands at any moment of an epoch; epochs here take
# milliseconds, so without this wait a drill would race the controller.
COLLECTED_TIMEOUT_S = 120.0


def _collected(epoch: int) -> bool:
    """Wait until the controller's checkpoint snapshot holds a checkpoint of ``epoch``
    (or later); False if it has not after COLLECTED_TIMEOUT_S."""
    import ray.train

    storage = ray.train.get_context().get_storage()
    fs, path = storage.storage_filesystem, storage.checkpoint_manager_snapshot_path
    deadline = time.monotonic() + COLLECTED_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with fs.open_input_stream(path) as f:
                latest = json.loads(f.read()).get("latest_checkpoint_result") or {}
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or mid-write
            latest = {}
        if latest.get("metrics", {}).get("epoch", 0) >= epoch:
            return True
        time.sleep(0.05)
    return False


def _kill_at(epoch: int, rank: int, at_epoch: int, at_rank: int) -> None:
    if epoch == at_epoch and rank == at_rank and _first_time():
        # Struck anyway on a timeout: the run then resumes from an earlier checkpoint,
        # which the tests' assertions on the resumed epoch report.
        _collected(epoch)
        # What a preempted VM or an OOM kill does: no exception, no cleanup.
        os.kill(os.getpid(), signal.SIGKILL)


def kill_rank0_at_epoch2(epoch, metrics, rank):
    _kill_at(epoch, rank, 2, 0)


def kill_rank1_at_epoch2(epoch, metrics, rank):
    _kill_at(epoch, rank, 2, 1)


def fail_at_epoch2(epoch, metrics, rank):
    """An ordinary exception on rank 0 after epoch 2's checkpoint was reported (and
    collected: see _collected)."""
    if epoch == 2 and rank == 0 and _first_time():
        _collected(epoch)
        raise RuntimeError("fault drill: the train task fails once after epoch 2")


class KillRank0AtCall:
    """A loss (``train.loss: tests.faults:KillRank0AtCall``, ``train.loss_args: {at: N}``):
    cross entropy, but rank 0's worker is SIGKILLed at its N-th call in training (not in
    validation), once per run. Rank 0 calls it once per step, so N = steps per epoch +
    k + 1 strikes in epoch 2 right after its step k, whose ``checkpoint.every_n_steps``
    save (every k steps) rank 0 wrote before it took the next step."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    def __call__(self, outputs, targets):
        import ray.train
        import torch.nn.functional as F

        self.calls += outputs.requires_grad
        if (
            self.calls == self.at
            and outputs.requires_grad
            and ray.train.get_context().get_world_rank() == 0
            and _first_time()
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return F.cross_entropy(outputs, targets)
