"""Overhead: the default digits job through trainflow against the same job as a bare
Ray script and as a plain PyTorch loop, run side by side, alternating (A B C A B C ...).

    make bench SECTIONS=overhead    # or: python benchmarks/overhead.py --rounds 3

Writes benchmarks/results/overhead.json and overhead.md (assembled into results.md by
report.py): each run's wall time and its driver process's peak RSS, the medians, the
ratios, the machine and the versions.
trainflow's figure is the whole `trainflow run` command: a temporary Prefect server,
a Ray cluster, ingest, preprocess, training, evaluation and registration.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARGET = 0.6  # issue 4: trainflow at most 0.6x the bare Ray script's wall time


def commands(epochs: int, home: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "trainflow": [py, "-m", "trainflow.cli", "run", "--set", f"train.epochs={epochs}"],
        "bare_ray": [py, str(HERE / "bare_ray.py"), "--epochs", str(epochs)],
        "plain_torch": [py, str(HERE / "plain_torch.py"), "--epochs", str(epochs)],
    }


def run_once(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.stderr.write(out.decode(errors="replace")[-4000:])
        raise SystemExit(f"benchmark command failed: {' '.join(cmd)}")
    return {"wall_s": round(wall, 2), "driver_peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    args = parser.parse_args()

    runs: dict[str, list[dict[str, float]]] = {}
    for i in range(args.rounds):
        for name, cmd in commands(args.epochs, Path()).items():
            with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as home:
                env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
                env["TRAINFLOW_HOME"] = home
                env["RAY_USAGE_STATS_ENABLED"] = "0"
                result = run_once(cmd, env)
            runs.setdefault(name, []).append(result)
            print(f"round {i + 1}/{args.rounds} {name}: {result}", flush=True)

    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()
    }
    ratio = medians["trainflow"]["wall_s"] / medians["bare_ray"]["wall_s"]
    figures = {
        "benchmark": f"overhead: digits, default config, epochs={args.epochs}",
        "rounds": args.rounds,
        "note": args.note,
        "runs": runs,
        "medians": medians,
        "ratios": {
            "trainflow_vs_bare_ray_wall": round(ratio, 3),
            "trainflow_vs_plain_torch_wall": round(
                medians["trainflow"]["wall_s"] / medians["plain_torch"]["wall_s"], 2
            ),
        },
        "target": {"trainflow_vs_bare_ray_wall_at_most": TARGET, "met": ratio <= TARGET},
    }
    rows = "\n".join(
        f"| {name} | {m['wall_s']:.1f} | {m['driver_peak_rss_mb']:.0f} | "
        + ", ".join(f"{r['wall_s']:.1f}" for r in runs[name])
        + " |"
        for name, m in medians.items()
    )
    markdown = (
        f"## Overhead: the digits job, {args.epochs} epochs, "
        f"medians of {args.rounds} alternating rounds\n\n"
        + (f"Note: {args.note}\n\n" if args.note else "")
        + "| command | wall s (median) | driver peak RSS MB | every run's wall s |\n|---|---|---|---|\n"
        f"{rows}\n\n"
        f"trainflow / bare Ray script: **{ratio:.2f}x** the wall time "
        f"(target at most {TARGET}x: {'met' if ratio <= TARGET else 'missed'}).\n\n"
        "trainflow's figure covers the whole `trainflow run` command (temporary Prefect server, "
        "Ray start-up, ingest, preprocess, training, evaluation on the test split, MLflow "
        "registration); the bare Ray script only trains and reports a checkpoint per epoch. "
        "Peak RSS is the driver process's alone; Ray's workers and Prefect's server run in "
        "processes of their own.\n"
    )
    print(write_section("overhead", figures, markdown).read_text())


if __name__ == "__main__":
    main()
