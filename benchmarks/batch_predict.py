"""Batch prediction: `trainflow predict` over N digits-shaped rows against what a user
would write without it, one process: ``trainflow.load_model(...).predict_proba`` on the
pandas frame, then the same columns written as Parquet. Alternating, in one run.

    python benchmarks/batch_predict.py                  # 100,000 rows, 3 rounds
    python benchmarks/batch_predict.py --rows 1000000
    python benchmarks/batch_predict.py --quick          # 10,000 rows, 1 round, into results/quick

Before the clock, in a fresh TRAINFLOW_HOME: `trainflow run --smoke` registers a model of
the default config (`digits-smoke/1`, trainflow's cnn on 64 pixels), and N rows shaped
like digits (the real images tiled, with noise, and an id) are written as one Parquet
file. Each timed figure is a whole command: `trainflow predict digits-smoke/1 input
out/ --batch-size 4096` (model resolution, a temporary Prefect server, a Ray cluster, a
Ray Data actor pool of one actor, Parquet written and renamed into place) and the
one-process baseline (`--baseline`). CPU seconds are the command's whole process tree's,
measured as in overhead.py. Writes benchmarks/results/batch_predict.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import add_results_arg, load1, ratio, run_measured, smoke_model_env, write_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL = "digits-smoke/1"
BATCH_SIZE = 4096


def baseline(model: str, source: str, output: str) -> None:
    """What a user writes without trainflow's flow: load the model, predict the frame."""
    import numpy as np
    import pandas as pd

    import trainflow

    predictor = trainflow.load_model(model)
    frame = pd.read_parquet(source)
    proba = predictor.predict_proba(frame)
    out = frame[["id"]].copy()
    out["prediction"] = np.asarray(predictor.classes)[proba.argmax(axis=1)]
    for i, c in enumerate(predictor.classes):
        out[f"proba_{c}"] = proba[:, i]
    out["model_version"] = predictor.version
    Path(output).mkdir(parents=True)
    out.to_parquet(Path(output) / "part-0.parquet", index=False)
    print(f"{len(out)} predictions in {output}")


def same_predictions(a: Path, b: Path) -> bool:
    """Both outputs hold the same ids and predicted classes."""
    import pandas as pd

    x, y = (
        pd.read_parquet(p, columns=["id", "prediction"]).sort_values("id").reset_index(drop=True)
        for p in (a, b)
    )
    return len(x) == len(y) and bool((x.to_numpy() == y.to_numpy()).all())


def digits_rows(n: int, path: Path) -> None:
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    pixels = load_digits().data.astype(np.float32)
    rng = np.random.default_rng(0)
    x = np.tile(pixels, (-(-n // len(pixels)), 1))[:n]
    x = (x + rng.normal(0, 0.5, x.shape)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"pixel_{i}" for i in range(x.shape[1])])
    frame.insert(0, "id", np.arange(n, dtype=np.int64))
    frame.to_parquet(path, index=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="10,000 rows, 1 round; writes under results/quick"
    )
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    parser.add_argument("--baseline", nargs=3, metavar=("MODEL", "INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    add_results_arg(parser)
    args = parser.parse_args()
    if args.baseline:
        baseline(*args.baseline)
        return
    if args.quick:
        args.rows, args.rounds = 10_000, 1

    py = sys.executable
    runs: dict[str, list[dict]] = {"trainflow": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="trainflow-bench-predict-") as tmp:
        home = Path(tmp)
        env = smoke_model_env(home, "predicted with")
        source = home / "input.parquet"
        digits_rows(args.rows, source)
        for i in range(args.rounds):
            commands = {
                "trainflow": [py, "-m", "trainflow.cli", "predict", MODEL, str(source), str(home / f"tf-{i}"),
                              "--batch-size", str(BATCH_SIZE)],
                "baseline": [py, str(HERE / "batch_predict.py"), "--baseline", MODEL, str(source),
                             str(home / f"base-{i}")],
            }  # fmt: skip
            for name, cmd in commands.items():
                load_start = load1()
                r = run_measured(cmd, env, REPO)
                if r["returncode"] != 0:
                    sys.stderr.write(r["stdout"][-4000:])
                    raise SystemExit(f"benchmark command failed: {' '.join(cmd)}")
                keep = ("wall_s", "cpu_s", "cpu_user_s", "cpu_system_s", "driver_peak_rss_mb", "cpu_method")
                runs[name].append(
                    {**{k: r[k] for k in keep}, "load_1min": {"at_start": load_start, "at_end": load1()}}
                )
                print(
                    f"round {i + 1}/{args.rounds} {name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU",
                    flush=True,
                )
            if not same_predictions(home / f"tf-{i}", home / f"base-{i}"):
                raise SystemExit("trainflow predict and the baseline disagree: they did not do the same work")

    med = {
        name: {
            k: round(statistics.median(r[k] for r in rs), 2)
            for k in ("wall_s", "cpu_s", "driver_peak_rss_mb")
        }
        for name, rs in runs.items()
    }
    figures = {
        "benchmark": f"batch_predict: {args.rows} digits-shaped rows, trainflow predict vs load_model",
        "quick": args.quick,
        "note": args.note,
        "rows": args.rows,
        "rounds": args.rounds,
        "model": MODEL,
        "batch_size": BATCH_SIZE,
        "runs": runs,
        "same_predictions": True,  # checked every round: same ids, same predicted classes
        "medians": med,
        "rows_per_s": {name: round(args.rows / m["wall_s"]) for name, m in med.items()},
        "ratios": {
            "trainflow_vs_baseline_wall": ratio(med["trainflow"]["wall_s"], med["baseline"]["wall_s"]),
            "trainflow_vs_baseline_cpu": ratio(med["trainflow"]["cpu_s"], med["baseline"]["cpu_s"]),
        },
    }
    loads = [r["load_1min"][k] for rs in runs.values() for r in rs for k in ("at_start", "at_end")]
    table = "\n".join(
        f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {figures['rows_per_s'][name]:,} | "
        + ", ".join(f"{r['wall_s']:.1f}" for r in runs[name])
        + " |"
        for name, m in med.items()
    )
    md = (
        f"## Batch prediction: {args.rows:,} rows, medians of {args.rounds} alternating rounds"
        f"{' (quick run)' if args.quick else ''}\n\n"
        + (f"Note: {args.note}\n\n" if args.note else "")
        + "| command | wall s (median) | CPU s (median) | rows/s (whole command) | every run's wall s |\n"
        "|---|---|---|---|---|\n"
        f"{table}\n\n"
        f"trainflow / baseline: **{figures['ratios']['trainflow_vs_baseline_wall']:.2f}x** the wall time, "
        f"{figures['ratios']['trainflow_vs_baseline_cpu']:.2f}x the CPU time.\n\n"
        f"trainflow: `trainflow predict {MODEL} input.parquet out/ --batch-size {BATCH_SIZE}` (one actor; "
        "a temporary Prefect server and a Ray cluster included). Baseline: one process, "
        "`trainflow.load_model(...)` then `predict_proba` on the pandas frame and the same columns written "
        "as Parquet (`benchmarks/batch_predict.py --baseline`). Both read the same Parquet file of "
        "digits-shaped rows (64 float features and an id) with the model of `trainflow run --smoke`, "
        "and every round checks that both predicted the same class for every id. "
        f"Load average (1 min) around the runs: {min(loads):g} to {max(loads):g}.\n"
    )
    print(write_section("batch_predict", figures, md, args.results).read_text())


if __name__ == "__main__":
    main()
