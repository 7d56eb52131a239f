"""The local cluster a run started, watched: when it ends under the run (a stop signal
sent to the whole process group, the OOM killer taking its GCS or raylet), the run ends
in one line at once, where Ray would wait 60 s for it and then print a native error.

And processes known by a variable of their environment, which whatever they start inherits:
the processes of a local cluster a run started (:data:`CLUSTER_MARK`), the services of a
stack (:mod:`trainflow.stack.services`). Linux's ``/proc`` is read; elsewhere none is found."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow import ray_internals, signals

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


# The local cluster's processes whose end ends the run: the GCS and the raylet however
# they exit; Ray's log monitor when a stop signal to the process group killed it, at once,
# while the driver would wait on the others for Ray's timeout. Ctrl-C's SIGINT is left to the graceful stop.
_WATCHED = {"gcs_server": False, "raylet": False, "log_monitor": True}
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def local_cluster_processes() -> dict:
    """The watched processes of the local cluster this process started, by name; none for
    a cluster started elsewhere."""
    return ray_internals.local_cluster_processes(list(_WATCHED))


def end_monitor() -> None:
    """End the autoscaler monitor of the local cluster this process started: one node,
    nothing to scale. Ray's shutdown stops it last, and its SIGTERM handler reports its end
    to the GCS stopped before it, which Ray waits a second for; SIGKILL ends it unreported."""
    for process in ray_internals.local_cluster_processes(["monitor"]).values():
        process.kill()
        process.wait()


class ClusterWatch:
    """While it runs, ends the process in one line when its local cluster ends under it:
    a stop signal to the whole process group (systemd's stop, ``timeout``,
    ``kill -- -PGID``), or the kernel's OOM killer taking the GCS or the raylet. What a
    clean stop would have done died with the cluster; the run's record says it did not
    finish (``--resume`` continues it). :meth:`stop` it before stopping the cluster on
    purpose."""

    def __init__(self, processes: dict, mark: str | None = None) -> None:
        self.processes = processes
        self.mark = mark  # the cluster's CLUSTER_MARK
        self._stopped = threading.Event()
        self._signalled = threading.Event()
        signals.stop_signal_listeners.append(self._signalled)
        threading.Thread(target=self._watch, name="trainflow-cluster-watch", daemon=True).start()

    def _watch(self) -> None:
        exits = _exit_poll(self.processes)
        if exits is None:
            self._poll()
            return
        poller, fds = exits
        try:
            # Woken by a watched process's end; each second, to see a stop.
            while not self._stopped.is_set():
                for fd, _ in poller.poll(1000):
                    poller.unregister(fd)  # its process ended: readable from now on
                self._check()
        finally:
            for fd in fds:
                os.close(fd)

    def _poll(self) -> None:
        # Often: the sooner, the fewer lines the dying cluster sends the console first. For
        # a while after a stop signal reached this process, far more often: when the whole
        # process group got it, Ray ends this process (exit code 1, nothing said) as soon as
        # its raylet's object store is gone, which can be a tenth of a second later.
        fast_until = 0.0
        while not self._stopped.is_set():
            if self._signalled.wait(0.002 if time.monotonic() < fast_until else 0.05):
                self._signalled.clear()
                fast_until = time.monotonic() + 2
            self._check()

    def _check(self) -> None:
        ended = cluster_ended(self.processes)
        if ended is not None and not self._stopped.is_set():
            end_with_the_cluster(*ended, mark=self.mark)

    def stop(self) -> None:
        self._stopped.set()
        if self._signalled in signals.stop_signal_listeners:
            signals.stop_signal_listeners.remove(self._signalled)


def watch_local_cluster(mark: str | None = None) -> ClusterWatch | None:
    """Watch the local cluster this process started (``mark``: its processes'
    CLUSTER_MARK); None for a cluster started elsewhere."""
    processes = local_cluster_processes()
    return ClusterWatch(processes, mark) if processes else None


def _exit_poll(processes: dict) -> tuple[select.poll, list[int]] | None:
    """A poll of the processes' pidfds, each readable once its process ends (Linux), and
    the descriptors; None where there are none (the watch then polls the processes)."""
    if not (hasattr(os, "pidfd_open") and hasattr(select, "poll")):
        return None
    poller = select.poll()
    fds: list[int] = []
    try:
        for process in processes.values():
            fds.append(os.pidfd_open(process.pid))
            poller.register(fds[-1], select.POLLIN)
    except OSError:  # one ended already, or a kernel without pidfds: polled, as then
        for fd in fds:
            os.close(fd)
        return None
    return poller, fds


def cluster_ended(processes: dict) -> tuple[str, int] | None:
    """The watched process whose end ends the cluster, and its exit code; one that a stop
    signal killed first (it says what happened), else the GCS or raylet that exited."""
    codes = {name: process.poll() for name, process in processes.items()}
    ended = [(name, code) for name, code in codes.items() if code is not None]
    signalled = [(name, code) for name, code in ended if -code in _STOP_SIGNALS]
    hard = [(name, code) for name, code in ended if not _WATCHED[name]]
    return (signalled or hard or [None])[0]


def end_with_the_cluster(process: str, code: int, mark: str | None = None) -> None:
    """Exit now, in one line: this process's local cluster is gone (its ``process``
    exited with ``code``), and nothing Ray would do next can reach it; what is left of
    the cluster's processes (``mark``: their CLUSTER_MARK) ends too."""
    end_cluster(mark)
    if code < 0 and -code in (*_STOP_SIGNALS, signal.SIGINT):
        message = f"stopped ({signal.Signals(-code).name})"
        status = 128 - code
    else:
        message = (
            f"error: the local Ray cluster stopped during the run (its {process} exited with {code}); "
            f"its log: {ray_internals.session_logs()}/{process}.out"
        )
        status = 1
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(status)
