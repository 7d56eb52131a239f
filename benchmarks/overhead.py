"""Overhead: the default digits job through trainflow against the same job as a bare Ray
script at Ray's defaults, the bare script given trainflow's own tunings, and a plain
PyTorch loop, run side by side, alternating (A B C D A B C D ...).

    make bench SECTIONS=overhead      # or: python benchmarks/overhead.py --rounds 3
    python benchmarks/overhead.py --quick     # 2 epochs, 1 round, into results/quick
    python benchmarks/overhead.py --phases    # first, warm and smoke runs, phase by phase

The four rows, each a whole command in a fresh TRAINFLOW_HOME:
- trainflow: `trainflow run --set train.epochs=N` (a temporary Prefect server, a Ray
  cluster, ingest, preprocess, training, evaluation, the gate and registration);
- bare_ray_default: benchmarks/bare_ray.py as Ray's getting-started guide writes it
  (Ray Data streams both splits every epoch, Ray's default controller poll of 2 s);
- bare_ray_tuned: the same script with trainflow's tunings, `--in-memory` (both splits
  read into the workers once) and the Ray settings trainflow sets for itself
  (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05, see tuned_env);
- plain_torch: benchmarks/plain_torch.py, one process, no Ray.

Each run's wall time is the command's; its CPU seconds (user + system) are those of its
whole process tree (Ray's GCS, raylet and workers, Prefect's server), counted in a
cgroup of its own where the machine allows one (else /proc sampled every 0.2 s) until
the last of those processes has exited. Writes benchmarks/results/overhead.json and
overhead.md (assembled into results.md by report.py): every run, the medians, the ratios
against their targets, the load average around each run, the machine and the versions.

--phases sets TRAINFLOW_TIMELINE=1, under which `trainflow run` prints to stderr lines
`timeline <seconds since the process started> <phase name>`; it tabulates each phase
from its mark to the next (the last one to the command's exit) into
results/overhead_phases.json and .md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

from common import add_results_arg, load1, ratio, run_measured, write_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ROWS = ("trainflow", "bare_ray_default", "bare_ray_tuned", "plain_torch")
# issue 14: ratios measured in one alternating run on the same machine.
TARGETS = {
    "trainflow_vs_bare_ray_default_wall": 0.5,
    "trainflow_vs_bare_ray_tuned_wall": 1.2,
    "trainflow_vs_bare_ray_tuned_cpu": 1.2,
}


def tuned_env() -> dict[str, str]:
    """The Ray settings trainflow gives its own runs (trainflow/cluster/quiet.py), for the tuned
    bare script: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05, and whatever else trainflow sets
    for Ray (a local cluster's settings included) when it sets more."""
    from trainflow.cluster import quiet

    env = {k: v for k, v in quiet.QUIET_ENV.items() if k.startswith("RAY_")}
    env.update(quiet.LOCAL_CLUSTER_ENV)
    return env


# The environment a run must not inherit: another cluster or server, or a tuning that
# belongs to only one of the rows.
SCRUB = {"RAY_ADDRESS", "PREFECT_API_URL", "TRAINFLOW_TIMELINE", *tuned_env()}


def commands(epochs: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    py = sys.executable
    bare = [py, str(HERE / "bare_ray.py"), "--epochs", str(epochs)]
    return {
        "trainflow": ([py, "-m", "trainflow.cli", "run", "--set", f"train.epochs={epochs}"], {}),
        "bare_ray_default": (bare, {}),
        "bare_ray_tuned": ([*bare, "--in-memory"], tuned_env()),
        "plain_torch": ([py, str(HERE / "plain_torch.py"), "--epochs", str(epochs)], {}),
    }


def run_once(cmd: list[str], extra_env: dict[str, str], stderr_to_stdout: bool = True) -> dict:
    import os

    with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as home:
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env.update({"TRAINFLOW_HOME": home, "RAY_USAGE_STATS_ENABLED": "0", **extra_env})
        load_start = load1()
        result = run_measured(cmd, env, REPO, stderr_to_stdout=stderr_to_stdout)
        result["load_1min"] = {"at_start": load_start, "at_end": load1()}
    if result["returncode"] != 0:
        sys.stderr.write((result["stdout"] + result["stderr"])[-4000:])
        raise SystemExit(f"benchmark command failed ({result['returncode']}): {' '.join(cmd)}")
    return result


# --phases: the timeline `trainflow run` prints under TRAINFLOW_TIMELINE=1.

TIMELINE = re.compile(r"^timeline\s+(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s+(\S.*?)\s*$")


def parse_timeline(text: str) -> list[tuple[float, str]]:
    """The ``timeline <seconds> <phase>`` lines of ``text``, in time order; every other
    line (logs, progress bars, a malformed mark) is ignored."""
    marks = []
    for line in text.replace("\r", "\n").splitlines():
        m = TIMELINE.match(line.strip())
        if m:
            marks.append((float(m[1]), m[2]))
    return sorted(marks, key=lambda mark: mark[0])


def phase_durations(marks: list[tuple[float, str]], end_s: float) -> list[dict]:
    """Each phase from its mark to the next mark (``until``); the last one to ``end_s``
    (the command's exit, measured from its start). Naming both ends makes the table
    read right whether a mark names what starts there or what has just finished."""
    if marks and marks[0][0] > 0:
        marks = [(0.0, "(process start)"), *marks]
    out = []
    for i, (at, name) in enumerate(marks):
        last = i + 1 == len(marks)
        until, next_name = (max(end_s, at), "(command exits)") if last else marks[i + 1]
        out.append(
            {"phase": name, "until": next_name, "start_s": round(at, 2), "duration_s": round(until - at, 2)}
        )
    return out


def phases(epochs: int, quick: bool, results: Path | None) -> Path:
    import os

    py = sys.executable
    run = [py, "-m", "trainflow.cli", "run", "--set", f"train.epochs={epochs}"]
    # name: (command, a fresh PREFECT_HOME?): the first run on a machine creates Prefect's
    # database (every migration) while Ray and torch start beside it.
    runs = {
        "first run": (run, True),
        "run": (run, False),
        "smoke": ([py, "-m", "trainflow.cli", "run", "--smoke"], False),
    }
    figures: dict = {"quick": quick, "epochs": epochs, "runs": {}}
    md = [
        f"## Overhead, phase by phase{' (quick run)' if quick else ''}",
        "",
        "One `trainflow run` of the digits job "
        f"(`--set train.epochs={epochs}`) with an empty PREFECT_HOME (a machine's first run), "
        "the same again, and one `trainflow run --smoke`, each in a fresh "
        "TRAINFLOW_HOME with `TRAINFLOW_TIMELINE=1`, one after another: each row is the time "
        "from one timeline mark to the next (the last, to the command's exit). Marks count from "
        "the process's start; wall and CPU are the whole command's, measured as in the overhead section.",
    ]
    for name, (cmd, fresh_prefect_home) in runs.items():
        with tempfile.TemporaryDirectory(prefix="trainflow-bench-prefect-") as prefect_home:
            env = {"TRAINFLOW_TIMELINE": "1"}
            if fresh_prefect_home:
                env["PREFECT_HOME"] = prefect_home
            elif "PREFECT_HOME" in os.environ:
                env["PREFECT_HOME"] = os.environ["PREFECT_HOME"]
            r = run_once(cmd, env, stderr_to_stdout=False)
        summary = r["stdout"][r["stdout"].find("model       ") :].rstrip()
        marks = parse_timeline(r["stderr"])
        table = phase_durations(marks, r["wall_s"])
        keep = ("wall_s", "cpu_s", "cpu_user_s", "cpu_system_s", "tree_exit_s", "driver_peak_rss_mb")
        figures["runs"][name] = {
            "command": " ".join(cmd[1:]),
            **{k: r[k] for k in keep},
            "cpu_method": r["cpu_method"],
            "load_1min": r["load_1min"],
            "fresh_prefect_home": fresh_prefect_home,
            "phases": table,
            "summary": summary,
        }
        print(f"{name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU, {len(marks)} timeline marks", flush=True)
        md += [
            "",
            f"### {name}, `{' '.join(cmd[2:])}`"
            + (" with an empty PREFECT_HOME" if fresh_prefect_home else "")
            + f": {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
            f"(load {r['load_1min']['at_start']:g} to {r['load_1min']['at_end']:g})",
            "",
            "```",
            summary,
            "```",
            "",
        ]
        if table:
            md += ["| from mark | to the next mark | at s | lasts s |", "|---|---|---|---|"]
            md += [
                f"| {p['phase']} | {p['until']} | {p['start_s']:.2f} | {p['duration_s']:.2f} |" for p in table
            ]
        else:
            md.append(
                "No `timeline` lines on stderr: this trainflow does not print them under "
                "TRAINFLOW_TIMELINE=1 yet."
            )
    return write_section("overhead_phases", figures, "\n".join(md), results)


# The alternating comparison.


def medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    keys = ("wall_s", "cpu_s", "cpu_user_s", "cpu_system_s", "driver_peak_rss_mb")
    return {
        name: {k: round(statistics.median(r[k] for r in rs), 2) for k in keys} for name, rs in runs.items()
    }


def markdown(figures: dict) -> str:
    runs, med, ratios = figures["runs"], figures["medians"], figures["ratios"]
    loads = [r["load_1min"][k] for rs in runs.values() for r in rs for k in ("at_start", "at_end")]
    rows = "\n".join(
        f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['driver_peak_rss_mb']:.0f} | "
        + ", ".join(f"{r['wall_s']:.1f}" for r in runs[name])
        + " | "
        + ", ".join(f"{r['cpu_s']:.1f}" for r in runs[name])
        + " |"
        for name, m in med.items()
    )
    what = {
        "trainflow_vs_bare_ray_default_wall": "trainflow / bare Ray at Ray's defaults, wall",
        "trainflow_vs_bare_ray_tuned_wall": "trainflow / bare Ray with trainflow's tunings, wall",
        "trainflow_vs_bare_ray_tuned_cpu": "trainflow / bare Ray with trainflow's tunings, CPU",
    }
    verdicts = "\n".join(
        f"- {what[key]}: **{ratios[key]:.2f}x** (target at most {target}x: "
        f"{'met' if figures['targets'][key]['met'] else 'missed'})"
        for key, target in TARGETS.items()
    )
    quick = " (quick run)" if figures["quick"] else ""
    note = f"Note: {figures['note']}\n\n" if figures["note"] else ""
    return (
        f"## Overhead: the digits job, {figures['epochs']} epochs, "
        f"medians of {figures['rounds']} alternating rounds{quick}\n\n"
        f"{note}"
        "| command | wall s (median) | CPU s (median) | driver peak RSS MB | every run's wall s | "
        "every run's CPU s |\n|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"{verdicts}\n"
        f"- trainflow / plain PyTorch, wall: {ratios['trainflow_vs_plain_torch_wall']:.2f}x "
        "(for reference)\n\n"
        "trainflow's row is the whole `trainflow run` command (temporary Prefect server, Ray "
        "start-up, ingest, preprocess, training, evaluation on the test split, the gate, MLflow "
        "registration); the bare Ray rows only train and report a checkpoint per epoch. "
        "`bare_ray_default` is `benchmarks/bare_ray.py` as Ray's guide writes it (Ray Data "
        "streams both splits every epoch; Ray's 2 s controller poll); `bare_ray_tuned` is the "
        "same script with `--in-memory` (both splits passed to the workers once, kept as "
        "tensors) and the Ray settings trainflow gives itself ("
        + ", ".join(f"`{k}={v}`" for k, v in figures["commands"]["bare_ray_tuned"]["env"].items())
        + "). "
        f"CPU seconds are user + system of each command's whole process tree ({figures['cpu_method']}), "
        "Ray's and Prefect's processes included, until the last of them exited. Peak RSS is the "
        "driver process's alone. Load average (1 min) around the runs: "
        f"{min(loads):g} to {max(loads):g}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1 round; writes under results/quick")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="instead: a first run (empty PREFECT_HOME), a warm one and a smoke run, phase by phase",
    )
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.rounds = 2, 1
    if args.phases:
        print(phases(args.epochs, args.quick, args.results).read_text())
        return

    runs: dict[str, list[dict]] = {name: [] for name in ROWS}
    for i in range(args.rounds):
        for name, (cmd, extra_env) in commands(args.epochs).items():
            r = run_once(cmd, extra_env)
            keep = ("wall_s", "cpu_s", "cpu_user_s", "cpu_system_s", "tree_exit_s", "stragglers_killed")
            runs[name].append({**{k: r[k] for k in keep}, "driver_peak_rss_mb": r["driver_peak_rss_mb"],
                               "load_1min": r["load_1min"], "cpu_method": r["cpu_method"]})  # fmt: skip
            print(f"round {i + 1}/{args.rounds} {name}: {runs[name][-1]}", flush=True)

    med = medians(runs)
    tf, default, tuned = med["trainflow"], med["bare_ray_default"], med["bare_ray_tuned"]
    ratios = {
        "trainflow_vs_bare_ray_default_wall": ratio(tf["wall_s"], default["wall_s"]),
        "trainflow_vs_bare_ray_tuned_wall": ratio(tf["wall_s"], tuned["wall_s"]),
        "trainflow_vs_bare_ray_tuned_cpu": ratio(tf["cpu_s"], tuned["cpu_s"]),
        "trainflow_vs_bare_ray_default_cpu": ratio(tf["cpu_s"], default["cpu_s"]),
        "trainflow_vs_plain_torch_wall": ratio(tf["wall_s"], med["plain_torch"]["wall_s"]),
    }
    figures = {
        "benchmark": f"overhead: digits, default config, epochs={args.epochs}",
        "quick": args.quick,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "note": args.note,
        "commands": {
            name: {"argv": " ".join(cmd[1:]), "env": extra_env}
            for name, (cmd, extra_env) in commands(args.epochs).items()
        },
        "cpu_method": runs["trainflow"][0]["cpu_method"],
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "targets": {
            key: {"at_most": target, "met": ratios[key] is not None and ratios[key] <= target}
            for key, target in TARGETS.items()
        },
    }
    print(write_section("overhead", figures, markdown(figures), args.results).read_text())


if __name__ == "__main__":
    main()
