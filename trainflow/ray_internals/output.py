"""What Ray's printing handler (``log_to_driver``) shows of the workers' output, wrapped by
:func:`trainflow.ray_internals.drop_worker_noise` (use 5, whose private names stay there)."""

from __future__ import annotations

from collections.abc import Callable

# What a worker prints that no user acts on, Ray core's ERROR lines: at the start of Train's
# preemption watcher on a cluster (ray issue 53727); at a kill of an actor already gone.
WORKER_NOISE = ("has constructor arguments in the object store and max_restarts", "ignoring KillActor for")
# Ray core's abort of a worker whose actor was killed as its constructor ended (Train kills
# its preemption watcher when a worker group stops, which on a busy machine can be before
# the watcher is up): this line, then the worker's stack, then nothing more from it.
WORKER_ABORT = "Check failed: raylet_ipc_client_->ActorCreationTaskDone()"


def without_noise(name: str, handler: Callable) -> Callable:
    """``handler`` (Ray's, named ``name``) without the lines of :data:`WORKER_NOISE`, nor a
    worker's lines from its :data:`WORKER_ABORT` on; any other handler as it is."""
    if name != "ray_print_logs" or hasattr(handler, "unfiltered"):
        return handler

    aborted: set = set()  # the workers whose abort began: the rest of their lines is its stack

    def print_logs(data: dict) -> None:
        lines = []
        pid = data.get("pid")
        for line in data.get("lines", ()):
            if WORKER_ABORT in line:
                aborted.add(pid)
            if pid not in aborted and not any(noise in line for noise in WORKER_NOISE):
                lines.append(line)
        if lines:
            handler({**data, "lines": lines})

    print_logs.unfiltered = handler
    return print_logs
