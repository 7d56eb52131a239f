"""Cold starts on a busy machine: five `trainflow run --smoke` in a row, each in a fresh
TRAINFLOW_HOME with an empty PREFECT_HOME, beside busy processes that push the load past
10 on two cores:

    make bench SECTIONS=cold_under_load     # or: python benchmarks/cold_under_load.py
    python benchmarks/cold_under_load.py --quick     # 1 run beside 4 processes, into results/quick

The busy processes (`python -c 'while True: pass'`, each ending itself after --max-minutes)
run in this script's own session, as a shell's background jobs or a CI job's other steps
would, and the commands run in it too: Linux shares the CPU between sessions first
(autogroup), so a command in a session of its own would not feel them. They start first,
until the 1-minute load average passes --load (or a minute goes by), and are ended by their
pids after the last run.

Each run's outcome (finished, or its one error line), wall seconds, the load around it,
whether it said it was waiting, and its summary's `steps` line go to
benchmarks/results/cold_under_load.json and .md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from common import HERE, add_results_arg, write_section

from trainflow.start_wait import START_TIMEOUT_ENV, start_timeout

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
WAITING = "waiting for "  # the start-up's one line when it is slow (trainflow/start_wait.py)
STEPS = re.compile(r"^steps\s+(.*)$", re.M)
TIMELINE = re.compile(r"^timeline\s+(\d+(?:\.\d*)?)\s+(\S.*?)\s*$", re.M)  # TRAINFLOW_TIMELINE=1
ERROR = re.compile(r"^error: (.*)$", re.M)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def start_busy(count: int, max_minutes: float) -> list[subprocess.Popen]:
    """``count`` spinning processes in this session, each ending itself after ``max_minutes``."""
    code = SPIN.format(seconds=max_minutes * 60)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def end_busy(busy: list[subprocess.Popen]) -> None:
    for p in busy:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def wait_for_load(target: float, at_most_s: float) -> float:
    """Until the 1-minute load average passes ``target`` (at most ``at_most_s``); the load then."""
    until = time.monotonic() + at_most_s
    while load1() < target and time.monotonic() < until:
        time.sleep(2)
    return load1()


def cold_run(timeout_s: float) -> dict:
    """One `trainflow run --smoke` in a fresh TRAINFLOW_HOME and empty PREFECT_HOME, in this session."""
    with tempfile.TemporaryDirectory(prefix="trainflow-cold-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
        env.update(TRAINFLOW_HOME=f"{tmp}/home", PREFECT_HOME=f"{tmp}/prefect", RAY_USAGE_STATS_ENABLED="0")
        env["TRAINFLOW_TIMELINE"] = "1"
        cmd = [sys.executable, "-m", "trainflow.cli", "run", "--smoke"]
        at_start, start = load1(), time.monotonic()
        try:
            done = subprocess.run(
                cmd, cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=timeout_s
            )
            code, out = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            code, out = None, f"{e.stdout or ''}{e.stderr or ''}"
        wall = round(time.monotonic() - start, 1)
    steps, error = STEPS.search(out), ERROR.search(out)
    marks = {name: float(at) for at, name in TIMELINE.findall(out)}
    outcome = "finished" if code == 0 else ("timed out" if code is None else f"failed ({code})")
    return {
        "outcome": outcome,
        "wall_s": wall,
        "load_1min": {"at_start": at_start, "at_end": load1()},
        "ray_start_s": _between(marks, "ray starting", "ray started"),
        "prefect_answered_at_s": marks.get("prefect server answered"),
        "said_waiting": [line.split(" - ", 1)[-1] for line in out.splitlines() if WAITING in line],
        "steps": steps[1] if steps else None,
        "error": error[1] if error else (None if code == 0 else out[-2000:]),
    }


def _between(marks: dict[str, float], first: str, then: str) -> float | None:
    return round(marks[then] - marks[first], 1) if first in marks and then in marks else None


def markdown(figures: dict) -> str:
    quick = " (quick run)" if figures["quick"] else ""
    runs = figures["runs"]
    lines = [
        f"## Cold start under load: {len(runs)} cold `trainflow run --smoke` in a row beside "
        f"{figures['busy_processes']} busy processes{quick}",
        "",
        "| run | outcome | wall s | Ray's start s | Prefect answered at s | load at start | load at end "
        "| said it was waiting | steps line / error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        said = "; ".join(r["said_waiting"]) or "no"
        detail = r["steps"] if r["outcome"] == "finished" else (r["error"] or "").splitlines()[-1:]
        detail = detail if isinstance(detail, str) else " ".join(detail)
        load = r["load_1min"]
        lines.append(
            f"| {i} | {r['outcome']} | {r['wall_s']} | {r['ray_start_s']} | {r['prefect_answered_at_s']} | "
            f"{load['at_start']} | {load['at_end']} | {said} | "
            f"{detail.replace('|', '/')} |"
        )
    finished = sum(r["outcome"] == "finished" for r in runs)
    lines += [
        "",
        f"- **{finished} of {len(runs)} finished**; start-up bound {figures['start_timeout_s']:g} s "
        f"({START_TIMEOUT_ENV}); load average (1 min) when the runs began: {figures['load_before_runs']}. "
        "Ray's start: `ray.init` of the run's local cluster (Ray's own wait for its node is 30 s); "
        "Prefect answered: seconds from the command's start until its temporary server did "
        "(TRAINFLOW_TIMELINE=1's marks).",
        "- The busy processes spin in this script's session, which the commands share (Linux "
        "shares the CPU between sessions first). Each run has a fresh TRAINFLOW_HOME and an "
        "empty PREFECT_HOME (Prefect's every migration, a new MLflow store).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=12, help="busy processes beside the runs")
    parser.add_argument("--load", type=float, default=10.0, help="the load average to reach first")
    parser.add_argument("--max-minutes", type=float, default=60.0, help="each busy process ends by then")
    parser.add_argument(
        "--quick", action="store_true", help="1 run beside 4 processes; writes under results/quick"
    )
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.busy, args.load, args.max_minutes = 1, 4, 3.0, 10.0
    busy = start_busy(args.busy, args.max_minutes)
    try:
        before = wait_for_load(args.load, 90 if not args.quick else 20)
        print(f"{args.busy} busy processes, load {before}", flush=True)
        runs = []
        for i in range(args.runs):
            runs.append(cold_run(timeout_s=args.max_minutes * 60 / max(args.runs, 1)))
            print(f"run {i + 1}/{args.runs}: {runs[-1]}", flush=True)
    finally:
        end_busy(busy)
    figures = {
        "benchmark": f"{args.runs} cold `trainflow run --smoke` beside {args.busy} busy processes",
        "quick": args.quick,
        "busy_processes": args.busy,
        "load_before_runs": before,
        "start_timeout_s": start_timeout(),
        "runs": runs,
        "finished": sum(r["outcome"] == "finished" for r in runs),
    }
    print(write_section("cold_under_load", figures, markdown(figures), args.results).read_text())


if __name__ == "__main__":
    main()
