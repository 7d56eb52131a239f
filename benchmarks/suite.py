"""The test suite's wall time and its real CPU time, whole and test by test.

Runs `python -m pytest` as `make test` does (the test files on parallel pytest-xdist
workers, one per core up to 4: :data:`WORKERS`; ``--serial`` runs them in one process) in a
cgroup of its own, so that its CPU
seconds count every process the suite makes work: Ray's workers and actors, the `trainflow`
commands the end-to-end tests start and the clusters and servers those start. A shell's
`time` (which .ci/run prints) counts only the processes pytest itself waits for, and
misses most of that; both are reported, side by side. Each test's CPU seconds are the
suite's while it ran (its setup, call and teardown; a module's shared fixture counts
towards its first test), from benchmarks/suite_plugin.py; with several workers a test's
CPU seconds include what the other workers' tests spent meanwhile, so only the whole
suite's CPU is that of its own processes.

    python benchmarks/suite.py                       # the whole suite
    python benchmarks/suite.py --quick               # the fast tier, -m "not slow"
    python benchmarks/suite.py -- tests/e2e          # arguments after -- go to pytest

Writes benchmarks/results/suite.json and suite.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from common import HERE, add_results_arg, load1, run_measured, write_section

TARGET_MIN = 5.0  # issue #14: about 5 minutes on this machine type
# What the Makefile's test target passes pytest (WORKERS=auto): keep the two the same.
WORKERS = ["-n", "auto", "--maxprocesses=4", "--dist", "loadfile", "--no-loadscope-reorder"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_results_arg(parser)
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument("--quick", action="store_true", help='the fast tier only (-m "not slow")')
    parser.add_argument("--serial", action="store_true", help="in one pytest process, no workers")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()
    if args.quick:
        args.pytest_args = ["-m", "not slow", *args.pytest_args]
    args.pytest_args = [*(["-n", "0"] if args.serial else WORKERS), *args.pytest_args]

    with tempfile.TemporaryDirectory(prefix="trainflow-suite-") as tmp:
        log = Path(tmp) / "tests.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
        env["TRAINFLOW_SUITE_LOG"] = str(log)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        load_before = load1()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_plugin", "-p", "no:cacheprovider"]
        measured = run_measured([*cmd, *args.pytest_args], env, HERE.parent)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    load_after = load1()
    out = measured.pop("stdout")
    print(out[-3000:])
    summary = next(
        (line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", line)), ""
    )
    if not rows:
        raise SystemExit("the suite recorded no test (see its output above)")

    wall_min, cpu_min = measured["wall_s"] / 60, measured["cpu_s"] / 60
    cpus = os.cpu_count() or 1
    per_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        f = per_file[row["test"].split("::")[0]]
        f[0] += row["wall_s"]
        f[1] += row["cpu_s"]
        f[2] += 1
    files = sorted(per_file.items(), key=lambda kv: -kv[1][0])
    slowest = sorted(rows, key=lambda r: -r["wall_s"])[: args.top]
    figures = {
        "quick": args.quick,
        "pytest_args": args.pytest_args,
        "returncode": measured["returncode"],
        "summary": summary.strip("= "),
        "wall_s": measured["wall_s"],
        "cpu_s": measured["cpu_s"],
        "cpu_method": measured["cpu_method"],
        "waited_cpu_s": measured["waited_cpu_s"],
        "busy_cpus": round(measured["cpu_s"] / measured["wall_s"], 2),
        "load_1min": [load_before, load_after],
        "tests": rows,
        "files": {
            name: {"wall_s": round(w, 1), "cpu_s": round(c, 1), "tests": n} for name, (w, c, n) in files
        },
    }
    lines = [
        "## The test suite: wall time and CPU",
        "",
        f"`python -m pytest{' ' if args.pytest_args else ''}{' '.join(args.pytest_args)}` "
        f"({figures['summary']}): **{wall_min:.1f} wall-minutes**, **{cpu_min:.1f} CPU-minutes** "
        f"({figures['busy_cpus']} of the {cpus} CPUs busy on average; target about {TARGET_MIN:g} "
        f"wall-minutes on this machine type). CPU counted by the {measured['cpu_method']}, "
        f"every process the suite started. The CPU a shell's `time` reports for the same run "
        f"(what pytest waited for) is {measured['waited_cpu_s'] / 60:.1f} minutes. "
        f"Load average (1 min) {load_before:g} before, {load_after:g} after.",
        "",
        *(
            []
            if args.serial
            else [
                "The test files ran on parallel pytest-xdist workers: a test's CPU seconds below "
                "are the suite's while it ran, what the other workers' tests spent meanwhile "
                "included.",
                "",
            ]
        ),
        "| test file | tests | wall s | CPU s |",
        "|---|---|---|---|",
        *[f"| {name} | {n} | {w:.1f} | {c:.1f} |" for name, (w, c, n) in files],
        "",
        f"The {len(slowest)} slowest tests (setup, call and teardown):",
        "",
        "| test | wall s | CPU s |",
        "|---|---|---|",
        *[f"| {r['test']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} |" for r in slowest],
    ]
    print(write_section("suite", figures, "\n".join(lines), args.results))
    if measured["returncode"] != 0:
        raise SystemExit(f"the suite failed ({summary.strip('= ')})")


if __name__ == "__main__":
    main()
