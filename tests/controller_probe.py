"""A Ray Train callback that runs in a training's controller process and records, in the
cluster's key-value store, whether that process imported torch. It is a module of its
own, importing no torch, so that unpickling the callback there imports none either.

A controller's process is often not a new one: Ray leases an idle worker process of the
session's earlier work for it (three runs by hand of the lost-worker test of
tests/pipelines/test_train.py after the streamed-split test: each controller's process
had started before the run), with whatever that work imported. So the probe records when
its process started, against when the driver made the probe (just before ``fit()``), and
whether torch was there already when the controller unpickled the probe. (Its last
record can come after the controller unpickled what the workers returned at the end,
training/settings.py's Outcome: when that class lived beside the loop, that import
brought torch, and the probe saw it.)"""

import json
import os
import sys
import time

import ray.train

from trainflow import ray_internals

NAMESPACE = "trainflow-tests"


def key(run_name: str) -> bytes:
    return f"controller-torch/{run_name}".encode()


def _since_boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _process_started_since_boot() -> float:
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")


class ControllerModules(ray.train.UserCallback):
    def __init__(self) -> None:
        self.made = _since_boot()  # in the driver, before the run's controller exists
        self.torch_when_unpickled: bool | None = None

    def __setstate__(self, state: dict) -> None:  # in the controller, with the run's other pieces
        self.__dict__.update(state)
        self.torch_when_unpickled = "torch" in sys.modules

    def after_report(self, run_context, metrics, checkpoint):
        record = {
            "torch": "torch" in sys.modules,
            "torch_when_unpickled": self.torch_when_unpickled,
            # Started before the probe was made: a process of this session's earlier work.
            "earlier_process": _process_started_since_boot() < self.made - 0.5,
            "pid": os.getpid(),
        }
        ray_internals.kv_put(key(run_context.get_run_config().name), json.dumps(record).encode(), NAMESPACE)


def controller_record(run_name: str) -> dict | None:
    """What the run's controller recorded (None: nothing, it never reported)."""
    value = ray_internals.kv_get(key(run_name), NAMESPACE)
    return None if value is None else json.loads(value)


def controller_imported_torch(run_name: str) -> bool | None:
    """Whether the run's controller imported torch: False when its process has no torch,
    True when torch came in with the run (a new process, or one that had none when it
    unpickled the run's pieces), None when nothing can be told (no record, or an earlier
    process of the session that held torch before the run reached it)."""
    record = controller_record(run_name)
    if record is None:
        return None
    if not record["torch"]:
        return False
    if record["earlier_process"] and record["torch_when_unpickled"]:
        return None
    return True
