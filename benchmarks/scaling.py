"""Scaling: the same job on 1x, 4x and 16x the data; wall time and peak memory of ingest,
preprocess and one epoch, and how they grow.

Each size runs in a fresh process with a local Ray cluster of 2 CPUs: trainflow's
``inspect_source`` and ``prepare`` (as the flow's ingest and preprocess steps call
them), then one epoch of ``build_trainer`` with the default scaling (two workers of half
a CPU) on the prepared splits, reading each split into memory or streaming it by the
train step's own rule (``train.in_memory: auto``: a split whose prepared Parquet is
under 1 GB per worker in memory), or, with ``--stream``, streaming both
(``train.in_memory: never``). Peak memory is the largest summed PSS of the process and
everything it started (Ray's GCS, raylet, workers and object store), sampled every
0.25 s; the driver's own is its peak resident set (``ru_maxrss``) over the three phases.

    python benchmarks/scaling.py                      # 500k, 2M, 8M rows x 64 features
    python benchmarks/scaling.py --stream             # the same, every split streamed
    python benchmarks/scaling.py --base-rows 100000
    python benchmarks/scaling.py --quick              # 5k, 20k, 80k rows

Writes benchmarks/results/scaling.json and scaling.md (scaling_streamed.* with --stream).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    MemorySampler,
    add_results_arg,
    ratio,
    raw_mb,
    start_ray,
    write_parquet_input,
    write_section,
)

FACTORS = (1, 4, 16)
# At 16x the data: at most 18x the time, 1.5x the peak memory, and the driver's flat (1.2x).
TIME_TARGET, MEMORY_TARGET, DRIVER_TARGET = 18.0, 1.5, 1.2
FEATURES = 64
PHASES = ("ingest", "preprocess", "epoch")


def measure(source: str, work: str, in_memory: str) -> dict:
    """Runs in its own process: ingest, preprocess and one epoch, each timed and sampled;
    ``in_memory``: the train step's ``train.in_memory``."""

    from trainflow.config import PipelineConfig
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.pipelines.training.inputs import split_inputs, splits_in_memory
    from trainflow.pipelines.training.run import build_trainer
    from trainflow.pipelines.training.settings import TrainSettings

    cfg = PipelineConfig.model_validate(
        {
            "name": "bench-scaling",
            "data": {"source": source},
            "model": {"kind": "mlp", "hidden_sizes": [128]},
            "train": {"epochs": 1, "batch_size": 256, "in_memory": in_memory},
            "checkpoint": {"keep": 1},
            "failure": {"max_failures": 0},
        }
    )
    cache = Path(work) / "cache"
    start_ray(num_cpus=2)
    with MemorySampler() as memory:
        with memory.phase("ingest"):
            info = inspect_source(cfg.data, cache)
        with memory.phase("preprocess"):
            entry = prepare(info, cfg.data.split, cfg.preprocess, cache)
        with memory.phase("epoch"):
            pre = entry.preprocessor
            in_memory = splits_in_memory(cfg, entry.path)
            memory_splits, datasets = split_inputs(entry.path, in_memory=in_memory)
            settings = TrainSettings.from_config(
                cfg,
                preprocessor=pre.to_dict(),
                num_features=pre.num_features,
                num_outputs=pre.num_outputs,
                memory_splits=memory_splits,
            )
            trainer = build_trainer(
                settings, datasets, run_name=f"bench-{time.time_ns()}", storage_path=f"{work}/runs"
            )
            trainer.fit()
    return {
        "rows": sum(entry.counts.values()),
        "in_memory": list(in_memory),
        "seconds": memory.wall,
        "cpu_s": memory.cpu,
        "peak_mb": {k: round(v, 1) for k, v in memory.peaks.items()},
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def markdown(sizes: list[dict], growth: dict, met: dict, quick: bool, note: str, stream: bool) -> str:
    rows = []
    for s in sizes:
        m = s["measured"]
        rows.append(
            f"| {s['factor']}x | {s['rows']:,} | {s['raw_mb']:.0f} | "
            + " | ".join(f"{m['seconds'][p]:.1f}" for p in PHASES)
            + f" | {sum(m['seconds'].values()):.1f} | {m['peak_mb_overall']:.0f}"
            + f" | {m['driver_peak_rss_mb']:.0f} | "
            + (", ".join(m["in_memory"]) or "none")
            + " |"
        )
    top = sizes[-1]["factor"]
    g = growth
    return "\n".join(
        [
            f"## Scaling{', every split streamed' if stream else ''}{' (quick run)' if quick else ''}",
            "",
            f"Synthetic Parquet, {FEATURES} float32 features and an int64 label per row; each size in "
            "a fresh process with a local Ray cluster of 2 CPUs. ingest: `inspect_source`; preprocess: "
            "`prepare` (row checks, split, fit, transform, write); epoch: one epoch of `build_trainer` "
            "(MLP 128, batch 256, two workers of half a CPU, Ray Train start-up included), each split "
            + (
                "streamed (`train.in_memory: never`)"
                if stream
                else "kept in memory or streamed by the train step's rule"
            )
            + ". Peak MB: the largest summed PSS of the driver and every Ray process it started (object "
            "store included), over the three phases; driver MB: the driver's own peak resident set.",
            "",
            "| data | rows | MB | ingest s | preprocess s | epoch s | total s | peak MB | driver MB "
            "| in memory |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Growth from 1x to {top}x: time **{g['time']:.2f}x** (preprocess {g['preprocess_time']:.2f}x, "
            f"epoch {g['epoch_time']:.2f}x), peak memory **{g['memory']:.2f}x**, the driver's "
            f"**{g['driver_memory']:.2f}x**. Targets at {top}x the data: time at most {TIME_TARGET:g}x "
            f"({'met' if met['time'] else 'missed'}), peak memory at most {MEMORY_TARGET:g}x "
            f"({'met' if met['memory'] else 'missed'}), the driver's at most {DRIVER_TARGET:g}x "
            f"({'met' if met['driver_memory'] else 'missed'}).",
            *([f"\nNote: {note}"] if note else []),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-rows", type=int, default=500_000, help="rows at 1x")
    parser.add_argument("--factors", type=int, nargs="+", default=list(FACTORS))
    parser.add_argument("--quick", action="store_true", help="5,000 rows at 1x")
    parser.add_argument("--stream", action="store_true", help="stream every split (train.in_memory: never)")
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    parser.add_argument(
        "--measure", nargs=4, metavar=("SOURCE", "WORK", "IN_MEMORY", "OUT"), help=argparse.SUPPRESS
    )
    add_results_arg(parser)
    args = parser.parse_args()
    if args.measure:
        source, work, in_memory, out = args.measure
        Path(out).write_text(json.dumps(measure(source, work, in_memory)))  # Ray Train prints to stdout too
        return
    base = 5_000 if args.quick else args.base_rows

    sizes = []
    for factor in args.factors:
        rows = base * factor
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-scaling-"))
        try:
            written = write_parquet_input(work / "input", rows, FEATURES)
            result = work / "measured.json"
            in_memory = "never" if args.stream else "auto"
            cmd = [
                sys.executable,
                __file__,
                "--measure",
                str(work / "input"),
                str(work),
                in_memory,
                str(result),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"{factor}x ({rows} rows) failed:\n{out.stderr[-4000:]}")
            m = json.loads(result.read_text())
            m["peak_mb_overall"] = max(m["peak_mb"].values())
            print(f"{factor}x ({rows:,} rows): {m}", flush=True)
            mb = round(raw_mb(rows), 1)
            sizes.append({"factor": factor, "rows": rows, "raw_mb": mb, "input": written, "measured": m})
        finally:
            shutil.rmtree(work, ignore_errors=True)

    first, last = sizes[0]["measured"], sizes[-1]["measured"]
    growth = {
        "time": ratio(sum(last["seconds"].values()), sum(first["seconds"].values())),
        "memory": ratio(last["peak_mb_overall"], first["peak_mb_overall"]),
        "driver_memory": ratio(last["driver_peak_rss_mb"], first["driver_peak_rss_mb"]),
        **{f"{p}_time": ratio(last["seconds"][p], first["seconds"][p]) for p in PHASES},
        **{f"{p}_memory": ratio(last["peak_mb"][p], first["peak_mb"][p]) for p in PHASES},
    }
    met = {
        "time": growth["time"] <= TIME_TARGET,
        "memory": growth["memory"] <= MEMORY_TARGET,
        "driver_memory": growth["driver_memory"] <= DRIVER_TARGET,
    }
    figures = {
        "quick": args.quick,
        "stream": args.stream,
        "note": args.note,
        "sizes": sizes,
        "growth": growth,
        "target": {
            "time_growth_at_most": TIME_TARGET,
            "memory_growth_at_most": MEMORY_TARGET,
            "driver_memory_growth_at_most": DRIVER_TARGET,
        },
        "met": met,
    }
    md = markdown(sizes, growth, met, args.quick, args.note, args.stream)
    path = write_section("scaling_streamed" if args.stream else "scaling", figures, md, args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
