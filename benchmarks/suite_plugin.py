"""A pytest plugin for benchmarks/suite.py: each test's wall seconds and the CPU seconds
the whole suite spent while it ran (setup, call and teardown), one JSON line per test in
the file that TRAINFLOW_SUITE_LOG names.

CPU is read from the cgroup the suite runs in (benchmarks/suite.py gives it one of its
own), so it counts every process a test makes work: Ray's workers and actors, the
subprocess commands and the servers they start, which a shell's `time` misses once they
re-parent. Outside a cgroup of its own it falls back to this process and the children it
has reaped, and says so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest


def _cgroup_cpu_file() -> Path | None:
    """cpu.stat (cgroup v2) or cpuacct.usage (v1) of the cgroup this process is in."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2, on a pure or a hybrid host
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (f := root / rel / "cpu.stat").is_file() and rel:
                    return f
        elif "cpuacct" in controllers.split(","):
            for name in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
                if (f := Path("/sys/fs/cgroup") / name / rel / "cpuacct.usage").is_file() and rel:
                    return f
    return None


CPU_FILE = _cgroup_cpu_file()
METHOD = (
    f"the suite's cgroup ({CPU_FILE.parent.name})"
    if CPU_FILE
    else "this process and the children it reaped (no cgroup of its own)"
)


def cpu_s() -> float:
    if CPU_FILE is None:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    text = CPU_FILE.read_text()
    if CPU_FILE.name == "cpu.stat":
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
    return int(text) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, cpu = time.perf_counter(), cpu_s()
    yield
    row = {
        "test": item.nodeid,
        "wall_s": round(time.perf_counter() - start, 3),
        "cpu_s": round(cpu_s() - cpu, 3),
        "cpu_method": METHOD,
    }
    with open(os.environ["TRAINFLOW_SUITE_LOG"], "a") as f:
        f.write(json.dumps(row) + "\n")
