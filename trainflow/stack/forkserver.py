"""A warm start's forkserver: a process of ``trainflow up`` that has imported what a run
imports (PyTorch, Ray, Prefect, MLflow, the flows) and forks a child per ``trainflow run``,
``sweep`` or ``predict`` of its workspace, which so skips those imports.

The command connects to ``forkserver.sock`` in the warm folder (its owner's alone) and
hands over its arguments, folder, environment and terminal (:func:`forwarded`); it relays
its stop signals to the child and exits with the child's code. The forkserver serves a
command only when what its imports read matches the command's (:func:`stamp`: the Python,
trainflow's code, the environment variables read on import); otherwise, or with no
forkserver, the command runs in its own process, as without ``trainflow up``."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from trainflow.stack.worker_launch import relay

SOCKET = "forkserver.sock"
SERVE = "--serve-forkserver"  # ``trainflow --serve-forkserver FOLDER``: how ``trainflow up`` starts it
COMMANDS = ("run", "sweep", "predict")
# Imported once, before the first command: a run's own imports (trainflow.runtime's).
IMPORTS = (
    "trainflow.runtime",
    "trainflow.run_checks",
    "trainflow.flows.training",
    "trainflow.flows.sweep",
    "trainflow.pipelines.sweep.run",
    "trainflow.flows.batch_predict",
    "trainflow.pipelines.registry.registration",
    "trainflow.pipelines.registry.card",
    "trainflow.tasks.drift",
    "ray.train.torch",
    "ray.tune",
    "matplotlib.backends.backend_agg",
    "matplotlib.figure",
    # The evaluate step's metrics and the bundled data sets: scikit-learn's import, which
    # a command's checks would otherwise pay before anything starts.
    "sklearn.metrics",
    "sklearn.datasets",
    # The registry's store as the register step opens it (the embedded one's SQLAlchemy
    # tables): imported in a child, they take the CPU from Ray Train's start.
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    # What a warm run or sweep still imported in its child: the registered model's flavour,
    # Prefect's flow graphs and async SQLite client, Ray's DAGs and autoscaler state.
    "mlflow.pyfunc",
    "prefect.utilities.visualization",
    "sqlalchemy.dialects.sqlite.aiosqlite",
    "ray.dag",
    "ray.autoscaler.v2.utils",
)
# Environment variables these imports read (and a command's start-up sets, QUIET_ENV),
# by prefix; those a command sets to use the warm services are left out.
READ_AT_IMPORT = ("RAY_", "PREFECT_", "MLFLOW_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "CUDA_", "PYTHON")
SET_BY_ATTACH = ("RAY_ADDRESS", "PREFECT_API_URL", "PREFECT_UI_URL")
CONNECT_TIMEOUT_S = 2.0
OFF = "TRAINFLOW_FORKSERVER"  # "0": every command runs in a process of its own
_forked = False  # True in a child of the forkserver


def ray_auth_env(folder: Path) -> dict[str, str]:
    """The warm cluster's token auth, which Ray reads when imported: the forkserver imports Ray
    with it, and a command that uses the warm cluster sets it (``warm.attach``)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder / "auth_token")}


PACKAGE = Path(__file__).resolve().parents[1]  # trainflow's source folder


def stamp(env: Mapping[str, str], python: str = sys.executable, package: str | Path = PACKAGE) -> str:
    """What the forkserver's imports depend on: the Python, trainflow's source files in
    ``package`` (their count and latest change) and the environment variables read when
    imported. The forkserver computes it for each request, of the command's Python, source
    folder and environment: the command itself imports nothing to compute it."""
    from trainflow.cluster.quiet import QUIET_ENV

    digest = hashlib.sha256(python.encode())
    changed = [entry.stat().st_mtime_ns for entry in Path(package).rglob("*.py")]
    digest.update(f"{len(changed)}:{max(changed)}".encode())
    for key, value in sorted({**QUIET_ENV, **env}.items()):
        if key.startswith(READ_AT_IMPORT) and key not in SET_BY_ATTACH:
            digest.update(f"{key}={value}\0".encode())
    return digest.hexdigest()


def socket_path(home: Path) -> Path:
    return home / "warm" / SOCKET


# The command's side.


def forwarded(argv: list[str], started: float) -> int | None:
    """Run ``argv`` (a ``trainflow`` command line) in the workspace's forkserver and
    return its exit code; None when this process should run it: not a command the
    forkserver serves, RAY_ADDRESS set, no forkserver, or one whose imports do not match
    (:func:`stamp`). ``started``: when this process started (the timeline counts from it)."""
    # With RAY_ADDRESS, Ray is imported for another cluster than the warm one.
    if len(argv) < 2 or argv[1] not in COMMANDS or os.environ.get(OFF) == "0" or "RAY_ADDRESS" in os.environ:
        return None
    path = socket_path(Path(os.environ.get("TRAINFLOW_HOME") or ".trainflow").absolute())
    if not path.is_socket():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(str(path))
        request = {"python": sys.executable, "package": str(PACKAGE), "argv": argv, "cwd": os.getcwd()}
        request |= {"env": dict(os.environ), "started": started}
        body = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [0, 1, 2])
        conn.settimeout(None)
        replies = conn.makefile("r")
        reply = json.loads(replies.readline() or "{}")
    except OSError:
        conn.close()
        return None
    if "pid" not in reply:
        conn.close()
        if "refused" in reply:
            from trainflow.cluster.quiet import command_logger

            command_logger().info(
                "the forkserver of trainflow up has other imports (trainflow's files or the "
                "environment changed): running in this process; `trainflow down` and `up` start one for it"
            )
        return None
    return relay(reply["pid"], replies, conn)


# The forkserver's side.


def serve(folder: Path, command: Callable[[], None]) -> None:
    """Import a run's modules, then fork a child per request on ``folder``/forkserver.sock
    that runs ``command`` (the ``trainflow`` command line, which reads the settings of
    what it imported from the environment it took over) as the caller's process would."""
    from trainflow.cluster.quiet import apply_quiet_env

    apply_quiet_env()  # as a command's start-up sets it before these imports
    own = stamp(os.environ)  # before the imports, which set variables of their own
    listener = listening(folder / SOCKET, IMPORTS)

    def stamp_of(request: dict) -> str | None:
        # The environment as the command will set it to use the warm cluster (``warm.attach``).
        if "python" not in request or "package" not in request:
            return None  # a command of another trainflow
        return stamp({**request["env"], **ray_auth_env(folder)}, request["python"], request["package"])

    ForkServer(listener, own, command, _take_over, stamp_of).loop()


def listening(path: Path, imports: tuple[str, ...], never: tuple[str, ...] = ()) -> socket.socket:
    """Import ``imports``, freeze what they made (:func:`gc.freeze`), then listen on the socket
    ``path``, its owner's alone; SystemExit, before listening, when an import started a
    thread, which a forked child would lack, or imported a module of ``never``."""
    for name in imports:
        importlib.import_module(name)
    if threading.active_count() > 1:  # a fork keeps only this thread: refuse rather than risk it
        names = [t.name for t in threading.enumerate()]
        raise SystemExit(f"threads started by the imports ({names}): not serving")
    if imported := [name for name in never if name in sys.modules]:
        raise SystemExit(f"the imports imported {', '.join(imported)}: not serving")
    # Every object so far in the permanent generation: a child's collections skip them, where
    # each child's first full collection walked them all (0.6 s of a warm command's start).
    gc.collect()
    gc.freeze()
    bound = path.with_name(f"{path.name}.tmp")  # renamed into place once listening: `up` waits for it
    bound.unlink(missing_ok=True)  # left by a forkserver that died at start
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o077)  # the socket: its owner's alone
    try:
        listener.bind(str(bound))
    finally:
        os.umask(old_mask)
    listener.listen(16)
    os.replace(bound, path)
    return listener


class ForkServer:
    """One thread: accepts requests, forks their children, reports each child's end. A
    child takes over the request (``take_over``: its folder, environment, arguments and
    streams), then runs ``command``; a request whose ``stamp_of`` is not ``own`` is refused."""

    def __init__(
        self,
        listener: socket.socket,
        own: str,
        command: Callable[[], None],
        take_over: Callable[[dict], None],
        stamp_of: Callable[[dict], str | None],
    ) -> None:
        self.listener = listener
        self.own = own
        self.command = command
        self.take_over = take_over
        self.stamp_of = stamp_of
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)

    def _stop(self, *_) -> None:
        self.stopping = True

    def loop(self) -> None:
        while not self.stopping:
            for key, _ in self.selector.select():
                try:
                    self._handle(key.fileobj)
                except OSError as e:  # a command gone mid-exchange: the others go on
                    _log(f"a command's connection failed: {e}")
        for pid in self.children:
            _kill(pid, signal.SIGTERM)

    def _handle(self, ready) -> None:
        if ready is self.listener:
            self._accept()
        elif ready == self.wake_r:
            os.read(self.wake_r, 512)
            self._reap()
        else:  # the command's end of the connection: it closed, so the command is gone
            self._hang_up(ready)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(CONNECT_TIMEOUT_S)
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            return
        if self.stamp_of(request) != self.own:
            _log(f"refused {_described(request['argv'])}: its imports differ")
            _close(None, fds)
            with contextlib.closing(conn):
                conn.sendall(b'{"refused": "imports differ"}\n')
            return
        pid = os.fork()
        if pid == 0:
            self._child(request, fds, conn)
        _close(None, fds)
        _log(f"process {pid}: {_described(request['argv'])}")
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)
        conn.settimeout(None)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _child(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """The forked child: the command's terminal, folder, environment and arguments, then the command."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.setpgid(0, 0)
            for sock in [self.listener, conn, *self.children.values()]:
                sock.close()
            self.selector.close()
            os.close(self.wake_r)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            self.take_over(request)
            self.command()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                ended = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped already: its code is lost
                ended = (pid, 1 << 8)
            if ended[0] == 0:
                continue
            conn = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(ended[1])
            _log(f"process {pid}: exit code {code}")
            try:
                conn.sendall(json.dumps({"exit": code if code >= 0 else 128 - code}).encode() + b"\n")
            except OSError:
                pass
            with contextlib.suppress(KeyError):  # unless its command hung up first
                self.selector.unregister(conn)
            conn.close()

    def _hang_up(self, conn) -> None:
        """The command of this connection ended before its child: the child stops."""
        self.selector.unregister(conn)
        for pid, child_conn in self.children.items():
            if child_conn is conn:
                _kill(pid, signal.SIGTERM)


def forked() -> bool:
    """Whether this process is a child of the forkserver."""
    return _forked


def run_plainly() -> None:
    """Replace this child of the forkserver with the command in a process of its own: for a
    command that connects to another Ray cluster than the one the forkserver imported Ray for."""
    sys.stdout.flush()
    sys.stderr.flush()
    command = [sys.executable, "-m", "trainflow.cli", *sys.argv[1:]]
    os.execve(sys.executable, command, {**os.environ, OFF: "0"})


def _take_over(request: dict) -> None:
    """Become the command's process: its folder, environment, arguments, streams and clock."""
    from trainflow import timeline

    global _forked
    _forked = True
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    sys.path[0] = request["cwd"]
    # Buffered as Python buffers them at its start: by line on a terminal, stderr always.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own, for its life
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    timeline.count_from(request["started"])


def _described(argv: list[str]) -> str:
    """A request's program and arguments for the forkserver's log, the first 200 characters."""
    program = "trainflow" if argv[1:2] and argv[1] in COMMANDS else Path(argv[0]).name
    return " ".join([program, *argv[1:]])[:200]


def _log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)  # the forkserver's log


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4:
        raise ValueError("a request too short")
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ValueError("a request cut short")
        body += more
    return json.loads(body), fds


def _close(conn: socket.socket | None, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    if conn is not None:
        conn.close()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
