"""How a Ray worker of ``trainflow up``'s cluster starts: Ray runs this file (the job's
``py_executable``, :mod:`trainflow.stack.worker_forks`) with the worker's command line. It
hands that command line, its environment, folder and streams to the worker forkserver,
whose child has imported PyTorch already and becomes the worker, and waits for the
child's end; without an answer, the worker starts in this process, as Ray starts it.
Run by its path, it imports nothing but the standard library."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

CONNECT_TIMEOUT_S = 2.0


def relay(pid: int, replies, conn: socket.socket) -> int:
    """Hand this process's stop signals to the forked child ``pid`` until the forkserver
    reports its end on ``conn``; the child's exit code."""

    def handover(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handover)
    line = replies.readline()
    conn.close()
    return int(json.loads(line)["exit"]) if line else 1


def launch(path: str, worker: list[str]) -> int:
    """Start the worker ``worker`` (Ray's ``default_worker.py`` and its arguments) as a
    child of the forkserver at ``path``; replaces this process with it when the forkserver
    does not answer or refuses."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    request = {"python": sys.executable, "argv": worker, "cwd": os.getcwd(), "env": dict(os.environ)}
    body = json.dumps(request).encode()
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(path)
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [0, 1, 2])
        conn.settimeout(None)
        replies = conn.makefile("r")
        reply = json.loads(replies.readline() or "{}")
    except (OSError, ValueError):
        reply = {}
    if "pid" not in reply:
        conn.close()
        os.execv(sys.executable, [sys.executable, *worker])
    return relay(reply["pid"], replies, conn)


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1], sys.argv[2:]))
