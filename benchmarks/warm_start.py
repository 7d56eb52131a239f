"""Warm start: the default digits job as `trainflow run` with the services of `trainflow up`
running (warm), as `trainflow run` alone (cold: it starts Prefect's temporary server and a
Ray cluster of its own), each also with `--set scaling.num_workers=0` (trained in the
flow's own process, no Ray Train workers), and as a plain PyTorch loop, alternating
(A B C ... A B C ...).

    python benchmarks/warm_start.py --rounds 3
    python benchmarks/warm_start.py --quick     # 2 epochs, 1 round, into results/quick

As a user iterating on a model meets it: each trainflow row has a TRAINFLOW_HOME of its own,
kept across its rounds, and a first run there off the clock (it creates the registry's and
Prefect's databases and caches the prepared splits, as any earlier run has). `trainflow up`
starts the warm row's services once, before the clock; `trainflow down` stops them at the
end. Wall seconds are each command's; CPU seconds its process tree's (for the warm rows, and
the forkserver child that ran it; not the services', which run apart). cold_ray_workers: a
cold run with TRAINFLOW_WORKER_FORKS=0. Writes benchmarks/results/warm_start.json and .md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from common import (
    add_results_arg,
    forkserver_children_cpu_s,
    load1,
    median,
    ratio,
    run_measured,
    trainflow_services,
    write_section,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ROWS = ("cold", "cold_ray_workers", "warm", "cold_no_workers", "warm_no_workers", "plain_torch")
TARGETS = {
    "warm_vs_plain_torch_wall": 1.5,
    "cold_vs_plain_torch_wall": 2.5,
    "warm_no_workers_vs_plain_torch_wall": 1.5,
    "cold_no_workers_vs_plain_torch_wall": 2.5,
}
NO_WORKERS = ("--set", "scaling.num_workers=0")
# A run must not inherit another cluster or server.
SCRUB = {"RAY_ADDRESS", "PREFECT_API_URL", "TRAINFLOW_TIMELINE"}


def command(row: str, epochs: int) -> list[str]:
    if row == "plain_torch":
        return [sys.executable, str(HERE / "plain_torch.py"), "--epochs", str(epochs)]
    extra = NO_WORKERS if row.endswith("_no_workers") else ()
    return [sys.executable, "-m", "trainflow.cli", "run", "--set", f"train.epochs={epochs}", *extra]


def run_once(row: str, epochs: int, env: dict[str, str]) -> dict:
    load_start = load1()
    home = Path(env["TRAINFLOW_HOME"])
    forked_before = forkserver_children_cpu_s(home) if row.startswith("warm") else 0.0
    result = run_measured(command(row, epochs), env, REPO)
    if row.startswith("warm"):
        result["cpu_s"] += forkserver_children_cpu_s(home) - forked_before
    result["load_1min"] = {"at_start": load_start, "at_end": load1()}
    if result["returncode"] != 0:
        sys.stderr.write(result["stdout"][-4000:])
        raise SystemExit(f"the {row} run failed ({result['returncode']})")
    if row.startswith("warm") and "using the services of trainflow up" not in result["stdout"]:
        raise SystemExit("the warm run did not use the services of trainflow up")
    return {k: result[k] for k in ("wall_s", "cpu_s", "load_1min")}


def measure(rounds: int, epochs: int, homes: Path) -> dict[str, list[dict]]:
    """Every row's timed runs, alternating, after each trainflow row's first run off the clock."""
    base = {k: v for k, v in os.environ.items() if k not in SCRUB}
    # Every cold row shares the cold row's home, every warm row the warm one's (and its services).
    base["RAY_USAGE_STATS_ENABLED"] = "0"
    envs = {row: {**base, "TRAINFLOW_HOME": str(homes / row.split("_")[0])} for row in ROWS}
    envs["cold_ray_workers"]["TRAINFLOW_WORKER_FORKS"] = "0"
    trainflow_services(envs["warm"], "up")
    try:
        for row in ("cold", "warm", "cold_no_workers", "warm_no_workers"):
            run_once(row, epochs, envs[row])
        runs: dict[str, list[dict]] = {row: [] for row in ROWS}
        for i in range(rounds):
            for row in ROWS:
                runs[row].append(run_once(row, epochs, envs[row]))
                print(f"round {i + 1}/{rounds} {row}: {runs[row][-1]}", flush=True)
    finally:
        trainflow_services(envs["warm"], "down")
    return runs


def markdown(figures: dict) -> str:
    runs = figures["runs"]
    med = figures["medians"]
    ratios = figures["ratios"]
    loads = [r["load_1min"][k] for rs in runs.values() for r in rs for k in ("at_start", "at_end")]
    rows = "\n".join(
        f"| {row} | {med[row]['wall_s']:.1f} | {med[row]['cpu_s']:.1f} | "
        + ", ".join(f"{r['wall_s']:.1f}" for r in runs[row])
        + " |"
        for row in ROWS
    )
    verdicts = "\n".join(
        f"- {key.split('_vs_')[0]} / plain PyTorch, wall: **{ratios[key]:.2f}x** (target at most "
        f"{target}x: {'met' if ratios[key] is not None and ratios[key] <= target else 'missed'})"
        for key, target in TARGETS.items()
    )
    verdicts += f"\n- warm / cold, wall: {ratios['warm_vs_cold_wall']:.2f}x"
    verdicts += (
        f"\n- cold / cold_ray_workers, wall: {ratios['cold_vs_cold_ray_workers_wall']:.2f}x, CPU: "
        f"{ratios['cold_vs_cold_ray_workers_cpu']:.2f}x (the command's own worker forkserver)"
    )
    quick = " (quick run)" if figures["quick"] else ""
    return (
        f"## Warm start: the digits job, {figures['epochs']} epochs, medians of {figures['rounds']} "
        f"alternating rounds{quick}\n\n"
        "| run | wall s (median) | CPU s (median) | every run's wall s |\n|---|---|---|---|\n"
        f"{rows}\n\n{verdicts}\n\n"
        "cold: `trainflow run` (Prefect's temporary server, a Ray cluster and a worker forkserver "
        "started by the command; its Ray workers are children of the forkserver). "
        "cold_ray_workers: the same with `TRAINFLOW_WORKER_FORKS=0` (Ray starts each worker "
        "itself), in the same home. warm: the same with `trainflow up` run before the clock "
        "(a Ray cluster, a "
        "Prefect server, a forkserver with a run's imports done and one with PyTorch imported for "
        "Ray's workers, in the background; the command runs in a child of the first forkserver "
        "and connects to the cluster and the server, and its Ray workers are children of the "
        "second). Each has a "
        "TRAINFLOW_HOME of its own, kept across rounds, after a first run off the clock: its "
        "registry and Prefect's database exist and the prepared splits are cached, as when a "
        "user iterates on a model. *_no_workers: the same with `--set scaling.num_workers=0` (the "
        "flow's own process trains; the default job has two Ray Train workers), in the same "
        "home. plain_torch: `benchmarks/plain_torch.py`, one process, no Ray. The warm rows' "
        "CPU seconds are the command's and its forkserver child's; they leave out the services' "
        "own processes, Ray's workers included. Load "
        "average (1 min) around the runs: "
        f"{min(loads):g} to {max(loads):g}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1 round; writes under results/quick")
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick:
        args.epochs = 2
        args.rounds = 1
    with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as homes:
        runs = measure(args.rounds, args.epochs, Path(homes))
    keys = ("wall_s", "cpu_s")
    med = {row: {k: round(median([r[k] for r in rs]), 2) for k in keys} for row, rs in runs.items()}
    plain = med["plain_torch"]["wall_s"]
    figures = {
        "benchmark": f"warm start: digits, default config, epochs={args.epochs}",
        "quick": args.quick,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "runs": runs,
        "medians": med,
        "ratios": {
            **{f"{row}_vs_plain_torch_wall": ratio(med[row]["wall_s"], plain) for row in ROWS[:-1]},
            "warm_vs_cold_wall": ratio(med["warm"]["wall_s"], med["cold"]["wall_s"]),
            "cold_vs_cold_ray_workers_wall": ratio(med["cold"]["wall_s"], med["cold_ray_workers"]["wall_s"]),
            "cold_vs_cold_ray_workers_cpu": ratio(med["cold"]["cpu_s"], med["cold_ray_workers"]["cpu_s"]),
        },
        "targets": TARGETS,
    }
    print(write_section("warm_start", figures, markdown(figures), args.results).read_text())


if __name__ == "__main__":
    main()
