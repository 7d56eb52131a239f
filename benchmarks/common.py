"""What every benchmark section shares: the machine and versions it ran on, writing its
results (``results/<section>.json`` and ``results/<section>.md``, each written to a
temporary file and renamed), a local Ray cluster of its own, synthetic Parquet inputs,
and the memory of a process tree sampled while it works."""

from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# The load on the machine when this benchmark started and when it wrote its results: the
# machines are shared, and other work moves wall times.
LOAD_AT_START = os.getloadavg()
STARTED = time.monotonic()  # how long a section took to measure, recorded with its results
PACKAGES = ("trainflow", "torch", "ray", "prefect", "mlflow-skinny", "pyarrow", "numpy")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1_5_15min": {
            "at_start": [round(x, 2) for x in LOAD_AT_START],
            "at_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def add_results_arg(parser) -> None:
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"folder for <section>.json and .md (default {RESULTS}; quick runs: {RESULTS / 'quick'})",
    )


def command_line() -> str:
    """The command this benchmark was started with, as a shell would take it."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(HERE.parent)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def write_section(section: str, figures: dict[str, Any], markdown: str, results: Path | None = None) -> Path:
    """Write ``<section>.json`` (the figures plus date, machine, versions and the command
    line that produced them) and
    ``<section>.md`` (the report's section, starting with ``## ``) into ``results``:
    by default benchmarks/results, or benchmarks/results/quick for a quick run, so a
    quick check never replaces measured figures."""
    if not markdown.startswith("## "):
        raise ValueError(f"the {section} section's markdown must start with '## '")
    if results is None:
        results = RESULTS / "quick" if figures.get("quick") else RESULTS
    results.mkdir(parents=True, exist_ok=True)
    doc = {
        "section": section,
        "date": now(),
        "command": command_line(),
        "took_s": round(time.monotonic() - STARTED, 1),
        "machine": machine(),
        "versions": versions(),
        **figures,
    }
    _write_atomic(results / f"{section}.json", json.dumps(doc, indent=2) + "\n")
    _write_atomic(results / f"{section}.md", markdown.rstrip() + "\n")
    return results / f"{section}.md"


def smoke_model_env(home: Path, what: str) -> dict[str, str]:
    """The environment of a fresh TRAINFLOW_HOME under ``home`` in which `trainflow run
    --smoke` registered `digits-smoke/1` (trainflow's cnn on the 64 digits pixels): the
    model a benchmark then uses, ``what`` saying for what if the setup fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    env["TRAINFLOW_HOME"] = str(home / "home")
    setup = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "run", "--smoke"],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    if setup.returncode != 0:
        sys.stderr.write(setup.stdout[-3000:] + setup.stderr[-3000:])
        raise SystemExit(f"setup failed: `trainflow run --smoke` registers the model {what}")
    return env


def trainflow_services(env: dict[str, str], *args: str) -> None:
    """`trainflow up` or `down` in ``env``'s TRAINFLOW_HOME, off the clock."""
    done = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", *args],
        env=env,
        cwd=HERE.parent,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"trainflow {' '.join(args)} failed: {done.stderr[-2000:]}")


def forkserver_children_cpu_s(home: Path) -> float:
    """The CPU seconds of the ended children of `trainflow up`'s forkserver for ``home`` (each
    command it ran), from /proc: a warm command runs there, outside its own process tree."""
    pid = json.loads((home / "warm" / "warm.json").read_text())["pids"]["forkserver"]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime


def start_ray(num_cpus: int = 2, object_store_mb: int | None = None, **extra) -> None:
    """A local Ray cluster of this process's own, set up as trainflow sets up its own."""
    import ray

    from trainflow.cluster.quiet import LOCAL_CLUSTER_ENV, configure_ray_data, quiet_token_auth_notice
    from trainflow.cluster.session import ray_init_kwargs
    from trainflow.ray_internals import drop_worker_noise

    for key, value in LOCAL_CLUSTER_ENV.items():
        os.environ.setdefault(key, value)
    quiet_token_auth_notice()
    kwargs = ray_init_kwargs()
    if object_store_mb:
        kwargs["object_store_memory"] = object_store_mb << 20
    ray.init(address="local", num_cpus=num_cpus, **kwargs, **extra)
    drop_worker_noise()
    configure_ray_data()


# Synthetic tabular input: float32 features f0..f{n-1} and an integer label of 4 classes.

ROWS_PER_FILE = 250_000


def write_parquet_input(folder: Path, rows: int, features: int = 64, seed: int = 0) -> dict[str, Any]:
    """A folder of Parquet files (Snappy, as pyarrow writes by default); returns its size."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written, part = 0, 0
    while written < rows:
        n = min(ROWS_PER_FILE, rows - written)
        x = rng.standard_normal((n, features), dtype=np.float32) * 3 + 1
        label = (x[:, 0] > 1).astype(np.int64) + 2 * (x[:, 1] > 1).astype(np.int64)
        table = pa.table({**{f"f{j}": x[:, j] for j in range(features)}, "label": label})
        pq.write_table(table, folder / f"part-{part:04d}.parquet")
        written, part = written + n, part + 1
    size = sum(p.stat().st_size for p in folder.glob("*.parquet"))
    return {"rows": rows, "features": features, "files": part, "file_mb": round(size / 2**20, 1)}


def raw_mb(rows: int, features: int = 64) -> float:
    """The input's size in memory: float32 features plus an int64 label per row."""
    return rows * (4 * features + 8) / 2**20


# Memory of a process and everything it started (Ray's GCS, raylet and workers).


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _tree(root: int) -> list[int]:
    kids = _children()
    todo, out = [root], []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def tree_pss_mb(root: int) -> float:
    """The summed proportional set size of ``root`` and its descendants: shared memory
    (Ray's object store, shared libraries) counts once across the processes that map it."""
    total = 0
    for pid in _tree(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total / 1024


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of ``root`` and each live descendant, by pid.

    On a shared machine wall time moves with other people's load; the CPU time a
    piece of work consumed moves much less.
    """
    out = {}
    for pid in _tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two :func:`tree_cpu_s` readings (a process that exited
    in between is not counted; Ray keeps its workers)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


class MemorySampler:
    """Samples :func:`tree_pss_mb` of this process every ``every_s`` in a thread; the peak
    memory, wall and CPU seconds of each phase marked with :meth:`phase`."""

    def __init__(self, every_s: float = 0.25):
        self.every_s = every_s
        self.peaks: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.current: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def _sample(self) -> None:
        mb = tree_pss_mb(os.getpid())
        if self.current is not None:
            self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), mb)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def phase(self, name: str):
        self.current = name
        self._sample()
        cpu, start = tree_cpu_s(os.getpid()), time.perf_counter()
        try:
            yield
        finally:
            self.wall[name] = round(time.perf_counter() - start, 2)
            self.cpu[name] = round(cpu_since(cpu, tree_cpu_s(os.getpid())), 2)
            self._sample()
            self.current = None


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def ratio(a: float, b: float) -> float | None:
    """a / b, or None (JSON null) when b is 0: a phase too short to time."""
    return round(a / b, 3) if b else None


# A train.callbacks hook for Ray Train workers: each worker appends when it finished an
# epoch to the file named by TRAINFLOW_BENCH_EPOCH_LOG. Workers import it as
# "common:epoch_done" (benchmarks/ is on their PYTHONPATH, see :func:`workers_import_here`).

EPOCH_LOG = "TRAINFLOW_BENCH_EPOCH_LOG"


def epoch_done(epoch: int, metrics: dict, rank: int) -> None:
    """A Ray Train worker's epoch end, written to the file EPOCH_LOG names: its time, the
    worker's threads and CPU seconds, its device and torch.distributed's backend."""
    import ray.train.torch
    import torch
    import torch.distributed as dist

    row = {
        "epoch": epoch,
        "rank": rank,
        "time": time.time(),
        "threads": torch.get_num_threads(),
        "nice": os.nice(0),  # Ray starts its workers at a niceness of its own
        "cpu": time.process_time(),  # the worker process's CPU seconds so far: robust to others' load
        "device": str(ray.train.torch.get_device()),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
    }
    with open(os.environ[EPOCH_LOG], "a") as f:
        f.write(json.dumps(row) + "\n")


def workers_import_here() -> None:
    """Let Ray workers started from now on import the modules of benchmarks/."""
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{path}" if path else str(HERE)


# CPU seconds of a whole command: the command's process and everything it starts (Ray's
# GCS, raylet and workers, Prefect's server), including processes that re-parent or exit
# before the command does. Best: a cgroup of its own (the kernel counts every process in
# it, exact, exited ones included); else sampling /proc for the command's session.

CGROUP_ROOTS = (
    ("cgroup2", Path("/sys/fs/cgroup")),  # a pure cgroup v2 host
    ("cgroup2", Path("/sys/fs/cgroup/unified")),  # hybrid: v2 beside the v1 controllers
    ("cgroup1-cpuacct", Path("/sys/fs/cgroup/cpuacct")),
)


def _cgroup_for_run() -> tuple[str, Path] | None:
    """A new, empty cgroup this process may move a child into, or None."""
    for kind, root in CGROUP_ROOTS:
        stat = root / ("cpu.stat" if kind == "cgroup2" else "cpuacct.usage")
        if kind == "cgroup2" and not (root / "cgroup.controllers").is_file():
            continue  # not a v2 hierarchy (on a hybrid host /sys/fs/cgroup is a tmpfs)
        path = root / f"trainflow-bench-{os.getpid()}-{time.monotonic_ns()}"
        try:
            path.mkdir()
        except OSError:
            continue
        if (path / stat.name).is_file():
            return kind, path
        path.rmdir()
    return None


def _cgroup_cpu(kind: str, path: Path) -> tuple[float, float]:
    """(user, system) CPU seconds of every process that has been in the cgroup."""
    if kind == "cgroup2":
        stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
        return int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6
    total = int((path / "cpuacct.usage").read_text()) / 1e9
    user = int((path / "cpuacct.usage_user").read_text()) / 1e9
    return user, total - user


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


class _SessionSampler:
    """The fallback: every ``every_s``, each process whose session is the command's or
    whose parent is one already seen; keeps each one's last-seen utime + stime. A process
    that lives less than one interval between samples is missed (an undercount)."""

    def __init__(self, root: int, every_s: float = 0.2):
        self.root, self.every_s = root, every_s
        self.seen: dict[tuple[int, str], tuple[float, float]] = {}  # (pid, start time) -> (user, sys)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def live(self) -> list[int]:
        stats = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (f := _proc_stat(int(entry.name))) is not None:
                stats[int(entry.name)] = f
        known = {pid for pid, _ in self.seen} | {self.root}
        members: set[int] = set()
        changed = True
        while changed:  # a parent's membership makes its children members
            changed = False
            for pid, f in stats.items():
                if pid in members:
                    continue
                if int(f[3]) == self.root or pid in known or int(f[1]) in members:
                    members.add(pid)
                    changed = True
        for pid in members:
            f = stats[pid]
            self.seen[(pid, f[19])] = (int(f[11]) / CLOCK_TICKS, int(f[12]) / CLOCK_TICKS)
        return sorted(members)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.live()
            self._stop.wait(self.every_s)

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return sum(u for u, _ in self.seen.values()), sum(s for _, s in self.seen.values())


def run_measured(
    cmd: list[str],
    env: dict[str, str],
    cwd: Path,
    linger_s: float = 60.0,
    stderr_to_stdout: bool = True,
) -> dict[str, Any]:
    """Run ``cmd`` to its end in a session (and, where possible, a cgroup) of its own.

    Returns the wall seconds until the command exits; user, system and total CPU seconds
    of its whole process tree, counted until every process it started has exited too
    (``linger_s`` at most, then they are killed and counted as stragglers); the driver's
    peak RSS; the command's output (``stdout``, and ``stderr`` unless merged); how CPU was
    measured.
    """
    cgroup = _cgroup_for_run()

    def enter_cgroup() -> None:  # in the child, before exec: everything it starts inherits it
        if cgroup is not None:
            (cgroup[1] / "cgroup.procs").write_text(str(os.getpid()))

    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
        start_new_session=True,
        preexec_fn=enter_cgroup if cgroup is not None else None,
    )
    sampler = None if cgroup is not None else _SessionSampler(proc.pid)
    # Read both pipes in threads: a full pipe would stall the command.
    out: dict[str, bytes] = {}
    readers = [
        threading.Thread(target=lambda name=name, f=f: out.__setitem__(name, f.read()), daemon=True)
        for name, f in (("stdout", proc.stdout), ("stderr", proc.stderr))
        if f is not None
    ]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)

    # Ray's GCS and raylet, Prefect's server: wait until the whole tree has gone.
    deadline = time.monotonic() + linger_s
    stragglers: list[int] = []
    while True:
        pids = _cgroup_pids(cgroup[1]) if cgroup is not None else sampler.live()
        if not pids:
            break
        if time.monotonic() > deadline:
            stragglers = pids
            for pid in pids:  # processes this run started and left behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.5)
            break
        time.sleep(0.1)
    tree_exit = time.perf_counter() - start
    for r in readers:
        r.join(timeout=10)

    if cgroup is not None:
        user, system = _cgroup_cpu(*cgroup)
        for _ in range(50):  # the kernel frees the cgroup once its last process is reaped
            try:
                cgroup[1].rmdir()
                break
            except OSError:
                time.sleep(0.1)
        method = f"{cgroup[0]} cgroup of the command"
    else:
        user, system = sampler.stop()
        method = "/proc sampled every 0.2 s (the command's session and descendants)"
    return {
        "returncode": proc.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(user + system, 2),
        "cpu_user_s": round(user, 2),
        "cpu_system_s": round(system, 2),
        "tree_exit_s": round(tree_exit, 2),
        "stragglers_killed": len(stragglers),
        "driver_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        # What a shell's `time` reports: the command and the children it waited for.
        "waited_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "cpu_method": method,
        "stdout": out.get("stdout", b"").decode(errors="replace"),
        "stderr": out.get("stderr", b"").decode(errors="replace"),
    }


def load1() -> float:
    return round(os.getloadavg()[0], 2)
