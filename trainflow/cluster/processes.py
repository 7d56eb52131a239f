"""Processes known by a variable of their environment, which whatever they start inherits:
the processes of a local cluster a run started (:data:`CLUSTER_MARK`), the services of a
stack (:mod:`trainflow.stack.services`). Linux's ``/proc`` is read; elsewhere none is found."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Every process of a local cluster a run starts carries this variable, set to the cluster's
# own id (Ray's workers inherit the raylet's environment). What still runs with it once Ray
# has shut the cluster down (a worker that hung on its way out, a process a task left
# behind) is ended: nothing of a finished run's cluster stays on the machine.
CLUSTER_MARK = "TRAINFLOW_LOCAL_CLUSTER"


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def marked(name: str, value: str) -> list[int]:
    """The processes running but this one whose environment holds ``name=value``."""
    mark = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


@contextmanager
def cluster_marked() -> Iterator[str]:
    """A new :data:`CLUSTER_MARK`, in this process's environment for the block: the local
    cluster a ``ray.init`` in it starts carries it; what this process starts later does not."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    os.environ[CLUSTER_MARK] = mark
    try:
        yield mark
    finally:
        os.environ.pop(CLUSTER_MARK, None)


def end_cluster(mark: str | None) -> None:
    """SIGKILL to every process left of the local cluster whose :data:`CLUSTER_MARK` is
    ``mark`` (None: a cluster started elsewhere, left alone)."""
    if mark is None:
        return
    for pid in marked(CLUSTER_MARK, mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
