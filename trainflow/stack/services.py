"""The processes of a team stack: PostgreSQL, an MLflow server, a Prefect server, a Ray
head and one more node, a Prefect worker. Each is started in a session of its own, its
output in a log file, and stopped by its process id (never by name, which would end
every Ray process on the machine). Every process a stack starts, and every process those
start, carries :data:`MEMBER_ENV` naming the stack's folder, so that ``down`` finds what
a service left behind."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from trainflow.cluster.watch import alive, marked

# Set in the environment of every process a stack starts; inherited by their children.
MEMBER_ENV = "TRAINFLOW_STACK_MEMBER"
STOP_TIMEOUT_S = 10.0  # after SIGTERM, before SIGKILL (a Ray head takes longer, and keeps nothing)


class StackError(RuntimeError):
    """A service of the stack could not start or stop; the message says which and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def start(name: str, args: list, env: dict[str, str], folder: Path, cwd: Path | None = None) -> int:
    """``args`` in a session of its own, its output in ``folder``/logs/``name``.log; its pid."""
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(
            [str(a) for a in args],
            env={**env, MEMBER_ENV: str(folder)},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def log_tail(folder: Path, name: str, lines: int = 5) -> str:
    log = folder / "logs" / f"{name}.log"
    text = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return " | ".join(text[-lines:]) or f"nothing in {log}"


def members(folder: Path) -> list[int]:
    """The processes still running that a stack in ``folder`` started, by their environment."""
    return marked(MEMBER_ENV, str(folder))


def stop(pids: list[int], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the process groups ``pids`` lead, together, then SIGKILL to those left after ``timeout``."""
    _end(pids, os.killpg, timeout)


def stop_members(folder: Path, timeout: float = 10.0) -> None:
    """End whatever a stack's services left running (Ray's workers, a flow run's process)."""
    _end(members(folder), os.kill, timeout)


def _end(pids: list[int], send: Callable[[int, int], None], timeout: float) -> None:
    """``send`` SIGTERM to each of ``pids`` alive now, wait up to ``timeout`` for them to
    end, then SIGKILL to each (a group whose leader ended may still hold processes)."""
    targets = [pid for pid in pids if alive(pid)]
    for pid in targets:
        _send(send, pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in targets) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in targets:
        _send(send, pid, signal.SIGKILL)


def _send(send: Callable[[int, int], None], pid: int, sig: int) -> None:
    try:
        send(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(ready, what: str, pid: int, folder: Path, name: str, timeout: float) -> None:
    """Wait for ``ready()``; StackError naming ``what`` and its log when its process ends
    or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if not alive(pid):
            raise StackError(f"{what} ended at start: {log_tail(folder, name)} ({folder}/logs/{name}.log)")
        if time.monotonic() > deadline:
            raise StackError(f"{what} did not answer within {timeout:.0f} s ({folder}/logs/{name}.log)")
        time.sleep(0.3)


class Postgres:
    """A PostgreSQL cluster from the machine's server programs (Debian's ``postgresql``
    package, or any ``initdb`` on PATH), listening on loopback only, password-protected.

    PostgreSQL refuses to run as root: as root its programs run as the ``postgres`` user,
    and its data lives where that user may write, /var/tmp/trainflow-postgres-<folder's
    hash>, since a root's folders are closed to other users."""

    def __init__(self, folder: Path, port: int, password: str):
        self.folder = folder
        self.port = port
        self.password = password
        self.bin = postgres_bin()
        if os.geteuid() == 0:
            digest = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
            self.root = Path(f"/var/tmp/trainflow-postgres-{digest}")
        else:
            self.root = folder / "postgres"
        self.data = self.root / "data"

    def uri(self, database: str, driver: str) -> str:
        return f"postgresql+{driver}://trainflow:{self.password}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args, env: dict | None = None) -> subprocess.CompletedProcess:
        owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run(
            [*owner, *map(str, args)], capture_output=True, text=True, timeout=180, env=env, cwd="/"
        )
        if done.returncode != 0:
            raise StackError(f"PostgreSQL: {Path(str(args[0])).name} failed: {done.stderr.strip()[-500:]}")
        return done

    def start(self, databases: tuple[str, ...]) -> None:
        if self.bin is None:
            raise StackError(
                "PostgreSQL: no server programs on this machine (initdb); install them "
                "(apt-get install postgresql) and run trainflow stack up again"
            )
        fresh = not (self.data / "PG_VERSION").is_file()
        if fresh:
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            self.root.chmod(0o700)
            secret = self.root / "password"
            secret.write_text(self.password)
            if os.geteuid() == 0:
                shutil.chown(secret, "postgres", "postgres")
            secret.chmod(0o600)
            auth = ["-U", "trainflow", "--auth=scram-sha-256", f"--pwfile={secret}"]
            self._run(self.bin / "initdb", "-D", self.data, *auth)
            secret.unlink()
        # TCP on loopback only; its Unix socket in its own folder, not the system's.
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root}"
        log = self.root / "postgres.log"
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", log, "-o", options, "-w", "-t", "120", "start")
        if fresh:
            env = {**os.environ, "PGPASSWORD": self.password}
            for name in databases:
                where = ["-h", "127.0.0.1", "-p", self.port, "-U", "trainflow"]
                self._run(self.bin / "createdb", *where, name, env=env)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").is_file() and port_open(self.port)

    def stop(self) -> None:
        if self.bin is not None and (self.data / "postmaster.pid").is_file():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def delete(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    return Path(versions[-1]).parent if versions else None


def _major(path: str) -> int:
    version = Path(path).parts[-3]
    return int(version) if version.isdigit() else 0
