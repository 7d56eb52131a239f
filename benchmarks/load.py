"""Load: the default digits job on a machine doing other work, against the same job on an
idle one. Whole commands, alternating (idle, loaded, idle, loaded ...):

    make bench SECTIONS=load        # or: python benchmarks/load.py --rounds 2
    python benchmarks/load.py --quick            # 2 epochs, 1 round, into results/quick
    python benchmarks/load.py --ray-default      # also one loaded run at Ray's own worker niceness

The load is two busy processes (`python -c 'while True: pass'`, at this process's
priority, as a test runner, a build or another flow would be) in the command's own
session, started with it and ended after it (see BESIDE). Each row is one command in a
fresh TRAINFLOW_HOME, run as benchmarks/overhead.py runs its rows:
- trainflow: `trainflow run --set train.epochs=N`; its train step is read from the
  summary's `steps` line;
- plain_torch: benchmarks/plain_torch.py, one process, no Ray: what a fair share of the
  CPU costs a process that competes as an equal (the baseline's own loaded / idle ratio);
- with --ray-default, trainflow loaded with `RAY_worker_niceness=15`, Ray's own setting,
  under which Ray's workers yield the CPU to every ordinary process.

Writes benchmarks/results/load.json and load.md: every run, the medians, and the loaded /
idle ratios against the target (at most 3x for trainflow's whole run).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

from common import add_results_arg, ratio, write_section
from overhead import commands, run_once

from trainflow.ray_internals import switches

TARGET = 3.0  # trainflow's loaded wall time at most this many times its idle one
BUSY = 2  # busy processes beside a loaded run: one per core on the 2-core machines here
STEPS = re.compile(r"^steps\s+(.*)$", re.M)


# A loaded run: the command beside ``argv[1]`` processes that spin until it ends, all in
# one session. Linux's scheduler shares the CPU fairly between sessions first (autogroup,
# on by default) and by priority within one: load in the command's own session is what a
# CI job, a script or a shell's background jobs put beside a run.
BESIDE = """
import subprocess, sys
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(sys.argv[1]))]
try:
    code = subprocess.call(sys.argv[2:])
finally:
    for p in busy:
        p.kill()
sys.exit(code)
"""


def train_step_s(output: str) -> float | None:
    """The train step's seconds from a run's summary (`steps  ingest 0.0s, ..., train 16.1s, ...`)."""
    m = STEPS.search(output)
    step = re.search(r"\btrain (\d+(?:\.\d+)?)s", m[1]) if m else None
    return float(step[1]) if step else None


def measure(name: str, cmd: list[str], env: dict[str, str], loaded: bool) -> dict:
    r = run_once([sys.executable, "-c", BESIDE, str(BUSY), *cmd] if loaded else cmd, env)
    row = {k: r[k] for k in ("wall_s", "load_1min")}
    if name.startswith("trainflow"):
        row["train_step_s"] = train_step_s(r["stdout"])
    print(f"{name}{' (loaded)' if loaded else ''}: {row}", flush=True)
    return row


def median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def markdown(figures: dict) -> str:
    runs, med, ratios = figures["runs"], figures["medians"], figures["ratios"]
    quick = " (quick run)" if figures["quick"] else ""
    lines = [
        f"## Load: the digits job, {figures['epochs']} epochs, beside {BUSY} busy processes, "
        f"medians of {figures['rounds']} alternating rounds{quick}",
        "",
        "| command | idle wall s | loaded wall s | loaded / idle | idle train step s | loaded train step s |",
        "|---|---|---|---|---|---|",
    ]
    for name in med:
        m = med[name]
        step = (
            f"{m['idle_train_step_s']} | {m['loaded_train_step_s']}" if "idle_train_step_s" in m else "— | —"
        )
        lines.append(
            f"| {name} | {m['idle_wall_s']} | {m['loaded_wall_s']} | {ratios[name + '_wall']} | {step} |"
        )
    met = figures["target"]["met"]
    lines += [
        "",
        f"- trainflow loaded / idle, whole run: **{ratios['trainflow_wall']}x** (target at most "
        f"{TARGET:g}x: {'met' if met else 'missed'}); train step: {ratios['trainflow_train_step']}x",
        f"- plain PyTorch loaded / idle (a process that shares the CPU as an equal): "
        f"{ratios['plain_torch_wall']}x",
    ]
    if "trainflow_ray_default" in med:
        lines.append(
            "- trainflow loaded at Ray's own worker niceness (`RAY_worker_niceness=15`) / idle: "
            f"{ratios['trainflow_ray_default_wall']}x the whole run, "
            f"{ratios['trainflow_ray_default_train_step']}x the train step (one run)"
        )
    loads = [r["load_1min"][k] for rs in runs.values() for r in rs for k in ("at_start", "at_end")]
    lines += [
        "",
        f"The load is {BUSY} processes spinning at this script's priority in the command's own "
        "session (Linux shares the CPU between sessions first, by priority within one), started "
        "with each loaded run and ended after it. Each command runs in a fresh TRAINFLOW_HOME; "
        "wall is the command's (benchmarks/overhead.py's method). trainflow "
        "starts its local cluster's workers at the driver's priority "
        "(`trainflow/cluster/quiet.py`, `RAY_worker_niceness=0`). Load average (1 min) around "
        f"the runs: {min(loads):g} to {max(loads):g}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1 round; writes under results/quick")
    parser.add_argument(
        "--ray-default",
        action="store_true",
        help="also one loaded trainflow run at Ray's own worker niceness (slow: minutes)",
    )
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.rounds = 2, 1

    cmds = commands(args.epochs)
    rows = {"trainflow": cmds["trainflow"], "plain_torch": cmds["plain_torch"]}
    runs: dict[str, list[dict]] = {}
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", flush=True)
        for name, (cmd, env) in rows.items():
            for loaded in (False, True):
                runs.setdefault(f"{name}_{'loaded' if loaded else 'idle'}", []).append(
                    measure(name, cmd, env, loaded)
                )
    if args.ray_default:
        cmd, env = cmds["trainflow"]
        runs["trainflow_ray_default_loaded"] = [
            measure("trainflow_ray_default", cmd, {**env, switches.WORKER_NICENESS: "15"}, loaded=True)
        ]

    # Each loaded row against the idle runs of its command.
    idle_of = {"trainflow": "trainflow", "plain_torch": "plain_torch", "trainflow_ray_default": "trainflow"}
    med: dict[str, dict] = {}
    ratios: dict[str, float | None] = {}
    for name, idle_name in idle_of.items():
        if f"{name}_loaded" not in runs:
            continue
        idle, loaded = runs[f"{idle_name}_idle"], runs[f"{name}_loaded"]
        med[name] = {}
        for key in ("wall_s", "train_step_s") if name.startswith("trainflow") else ("wall_s",):
            med[name][f"idle_{key}"] = median_of(idle, key)
            med[name][f"loaded_{key}"] = median_of(loaded, key)
            both = med[name][f"loaded_{key}"], med[name][f"idle_{key}"]
            ratios[f"{name}_{key.removesuffix('_s')}"] = ratio(*both) if None not in both else None
    figures = {
        "benchmark": f"load: digits, default config, epochs={args.epochs}, beside {BUSY} busy processes",
        "quick": args.quick,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "busy_processes": BUSY,
        "commands": {name: {"argv": " ".join(cmd[1:]), "env": env} for name, (cmd, env) in rows.items()},
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "target": {
            "trainflow_wall_at_most": TARGET,
            "met": ratios["trainflow_wall"] is not None and ratios["trainflow_wall"] <= TARGET,
        },
    }
    print(write_section("load", figures, markdown(figures), args.results).read_text())


if __name__ == "__main__":
    main()
