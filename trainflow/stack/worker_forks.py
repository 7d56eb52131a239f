"""The worker forkserver: a process that has imported PyTorch and the other packages a Ray
worker imports (the imports that take most of its start), not Ray, and forks a child per
Ray worker, which so starts without them. ``trainflow up`` keeps one for its warm cluster;
a command that starts a local cluster of its own starts one beside its start-up
(:class:`RunForks`).

Commands that use such a cluster give their Ray job a ``py_executable`` (Ray's
runtime_env field for the command that starts each worker, :func:`worker_python`) that
runs :mod:`trainflow.stack.worker_launch`. The child takes over the worker's folder,
environment, command line and streams, then runs Ray's ``default_worker.py``. Ray itself
is not imported before the fork: it reads the worker's settings from its environment
when imported. A worker whose environment would change these imports starts as Ray
starts it (:func:`stamp`)."""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from trainflow.stack import worker_launch
from trainflow.stack.forkserver import ForkServer, listening

SOCKET = "workers.sock"
IMPORTS = (
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    # What Ray, Ray Train, Tune and Data import in every worker from other packages (a
    # fifth of a worker's imports after PyTorch's); not psutil, which Ray brings its own of.
    "pyarrow.dataset",
    "pydantic.main",
    "pydantic.json_schema",
    "yaml",
    "requests",
    "fsspec",
    "jsonschema",
    "rich.console",
    "rich.layout",
    "filelock",
    "attr",
    "click",
    "google.protobuf.internal.builder",
    "google.protobuf.reflection",
    "google.protobuf.text_format",
)
# Environment variables that change what these imports load or set up.
READ_AT_IMPORT = (
    "TORCH",
    "PYTORCH_",
    "MKL_",
    "KMP_",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "FSSPEC_",
    "PROTOCOL_BUFFERS_",
)


OFF = "TRAINFLOW_WORKER_FORKS"  # "0": a command's own cluster starts its workers as Ray does
# From this many Ray workers that import PyTorch on, a command's own forkserver saves CPU:
# its one import costs about what one worker's PyTorch and its helpers' imports save.
WORTH_IT = 2
# What scikit-learn sets when first imported, in a command before or after Ray's local
# cluster copies the command's environment for its workers.
SKLEARN_ENV = {"KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE"}


def worker_python(folder: Path) -> str:
    """The ``py_executable`` of a job whose workers fork from the forkserver of ``folder``."""
    launcher = Path(worker_launch.__file__).resolve()
    return shlex.join([sys.executable, "-S", str(launcher), str(folder / SOCKET)])


def stamp(python: str, env: dict[str, str]) -> str:
    """What the forkserver's imports depend on: the Python and the variables they read."""
    digest = hashlib.sha256(python.encode())
    for key, value in sorted(env.items()):
        if key.startswith(READ_AT_IMPORT):
            digest.update(f"{key}={value}\0".encode())
    return digest.hexdigest()


def serve(folder: Path) -> None:
    """Import PyTorch, then fork a child per worker asked for on ``folder``/workers.sock."""
    before = dict(os.environ)
    own = stamp(sys.executable, before)
    # Ray reads a worker's settings once, when imported: never before the fork.
    listener = listening(folder / SOCKET, IMPORTS, never=("ray",))
    # What the imports set themselves (torch._dynamo's TORCHINDUCTOR_CACHE_DIR), as a driver
    # that imported them before Ray started hands them to its workers: the same imports.
    own_setting = {k: v for k, v in os.environ.items() if before.get(k) != v}

    def stamp_of(request: dict) -> str:
        env = {k: v for k, v in request["env"].items() if own_setting.get(k) != v or k in before}
        return stamp(request["python"], env)

    ForkServer(listener, own, _run_worker, _become_worker, stamp_of).loop()


def _become_worker(request: dict) -> None:
    """The worker's folder, environment, command line, module path and streams; PyTorch's
    threads as many as OMP_NUM_THREADS asks, now and whenever Ray sets it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(sys.argv[0]).parent), *extra, *[p for p in sys.path[1:] if p not in extra]]
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115 - the process's own, for its life
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    _follow_threads(os.environ.get("OMP_NUM_THREADS", ""))
    # Ray sets OMP_NUM_THREADS when the worker takes its first task (the task's CPUs), after
    # PyTorch was imported: PyTorch's threads follow each setting of it.
    sys.addaudithook(_on_putenv)


def _on_putenv(event: str, args: tuple) -> None:
    if event == "os.putenv" and args[0] in (b"OMP_NUM_THREADS", "OMP_NUM_THREADS"):
        _follow_threads(args[1].decode() if isinstance(args[1], bytes) else args[1])


def _follow_threads(threads: str) -> None:
    """PyTorch's threads as many as ``threads`` (OMP_NUM_THREADS), which PyTorch read only
    when it was imported."""
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def _run_worker() -> None:
    runpy.run_path(sys.argv[0], run_name="__main__")


class RunForks:
    """The worker forkserver of one command that starts a local cluster of its own, started
    now so that its imports overlap the command's start-up. Its socket is in a private
    temporary folder; its log is ``log``'s ``.early`` name until :meth:`use` (a command that
    stops before Ray starts leaves none). It ends with :meth:`stop`, the command's exit,
    or on Linux when the command dies (the kernel's PR_SET_PDEATHSIG)."""

    def __init__(self, log: Path) -> None:
        for key, value in SKLEARN_ENV.items():  # set first: the workers' and the forkserver's agree
            os.environ.setdefault(key, value)
        self.folder = Path(tempfile.mkdtemp(prefix="trainflow-workers-"))
        self.log = log
        self.early_log = log.with_name(f"{log.name}.early")
        self.used = False
        with self.early_log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.folder), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the command, which stops Ray, then this
            )
        atexit.register(self.stop)

    def use(self) -> str:
        """The ``py_executable`` of the command's Ray job; the log moves to its own name."""
        os.replace(self.early_log, self.log)
        self.used = True
        return worker_python(self.folder)

    def stop(self) -> None:
        """End the forkserver (after Ray's shutdown: Ray's workers are its children)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        if not self.used:
            self.early_log.unlink(missing_ok=True)


def _end_with(parent: int) -> None:
    """SIGTERM to this process when ``parent`` ends (Linux); exit now if it ended already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 2:  # a command's own: it ends with that command
        _end_with(int(sys.argv[2]))
    serve(Path(sys.argv[1]))
    if len(sys.argv) > 2:  # and its folder with it
        shutil.rmtree(sys.argv[1], ignore_errors=True)
    os._exit(0)  # without the interpreter's teardown, which PyTorch's imports make slow
