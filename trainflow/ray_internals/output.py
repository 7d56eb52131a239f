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
# A worker that Ray stops (SIGTERM: Tune ending a finished trial's actor) while Python runs a
# weakref callback prints the SystemExit of Ray's SIGTERM handler as an ignored exception:
# a block from this line to that SystemExit, through the handler.
IGNORED = "Exception ignored in:"
RAYS_SIGTERM_HANDLER = "in sigterm_handler"


def without_noise(name: str, handler: Callable) -> Callable:
    """``handler`` (Ray's, named ``name``) without the lines of :data:`WORKER_NOISE`, a
    worker's lines from its :data:`WORKER_ABORT` on, or the block of a SIGTERM from Ray
    landing in a weakref callback (:data:`IGNORED`); any other handler as it is."""
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
        lines = _without_stopped_blocks(lines)
        if lines:
            handler({**data, "lines": lines})

    print_logs.unfiltered = handler
    return print_logs


def _without_stopped_blocks(lines: list[str]) -> list[str]:
    """``lines`` less each whole block from :data:`IGNORED` to its ``SystemExit`` that passes
    through Ray's SIGTERM handler (a block cut across two batches of lines stays)."""
    kept: list[str] = []
    i = 0
    while i < len(lines):
        end = _stopped_block_end(lines, i) if lines[i].startswith(IGNORED) else None
        if end is None:
            kept.append(lines[i])
        i = i + 1 if end is None else end + 1
    return kept


def _stopped_block_end(lines: list[str], start: int) -> int | None:
    """Where the block at ``start`` ends, its ``SystemExit`` line, when it passes through
    Ray's SIGTERM handler; None for any other block, or one not ended in ``lines``."""
    for j in range(start + 1, len(lines)):
        if lines[j].startswith(IGNORED):
            return None
        if lines[j].startswith("SystemExit"):
            return j if any(RAYS_SIGTERM_HANDLER in line for line in lines[start:j]) else None
    return None
