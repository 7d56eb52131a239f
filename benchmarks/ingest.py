"""Ingest and preprocess throughput: trainflow against a single-process floor.

On synthetic Parquet (float32 features, an int64 label), trainflow's figure is what the
training flow's ingest and preprocess steps run: ``inspect_source`` (schema checks,
fingerprint) then ``prepare`` (row checks, seeded split, fitting on train, transforming
and writing every split as Parquet), on a local Ray cluster of 2 CPUs started before the
clock: up to ``LOCAL_DRIVER_BYTES`` of input on the driver's threads, a larger one on Ray
tasks. The floor is ``pyarrow.parquet.read_table`` plus NumPy standardization in one
process. Each measurement runs in a fresh process; sizes alternate floor, trainflow.

    python benchmarks/ingest.py                      # 1M and 8M rows x 64 features
    python benchmarks/ingest.py --rows 1000000 16000000   # the floor needs ~17 GB at 16M
    python benchmarks/ingest.py --rows 1000000 4000000
    python benchmarks/ingest.py --quick              # 20,000 rows, one round
    python benchmarks/ingest.py --phases --rows 1000000   # where the time goes, pass by pass

Writes benchmarks/results/ingest.json and ingest.md. Needs about three times the largest
input in free disk (the input, Ray's spill, the prepared splits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    add_results_arg,
    cpu_since,
    median,
    ratio,
    raw_mb,
    start_ray,
    tree_cpu_s,
    write_parquet_input,
    write_section,
)

TARGET = 0.5  # trainflow's rows/s at least half the floor's, on 2 cores
TARGET_1M = 0.8  # and at 1M rows on a fresh cluster, at least 0.8x (issue #45)
FEATURES = 64


def floor(source: str) -> dict:
    """Read every file into one Arrow table, stack the features, standardize them."""
    import numpy as np
    import pyarrow.parquet as pq

    start, cpu = time.perf_counter(), time.process_time()
    table = pq.read_table(source)
    features = [c for c in table.column_names if c != "label"]
    x = np.stack([table.column(c).to_numpy() for c in features], axis=1)
    y = table.column("label").to_numpy()
    mean, std = x.mean(axis=0), x.std(axis=0)
    x -= mean
    x /= std
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert np.isfinite(x).all() and len(y) == len(x)
    return {"seconds": seconds, "cpu_s": round(cpu, 2), "rows": len(x)}


def trainflow_prepare(source: str, cache: str, warm: bool, tasks: bool = False) -> dict:
    """The flow's ingest and preprocess steps, as its tasks call them. ``warm``: the Ray
    worker processes that ``trainflow run`` starts beside its own start-up (by
    ``warm_workers``, none for an input prepared on the driver's threads) started before
    the clock; else they start during the first pass. ``tasks``: on Ray tasks whatever
    the input's size, as on a cluster of other machines."""
    import ray

    from trainflow.cluster.session import warm_workers
    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data import prepare as preparing
    from trainflow.pipelines.data.prepare import driver_threads, prepare, worker_modules
    from trainflow.pipelines.data.schema import inspect_source

    if tasks:
        preparing.LOCAL_DRIVER_BYTES = -1
    start_ray(num_cpus=2)
    modules = worker_modules(inspect_source(DataConfig(source=source)), local=True)
    if warm and modules:
        ray.get(warm_workers(modules))
    # No memory sampler runs beside the clock: reading every process's smaps_rollup four
    # times a second took about 10% of the preparation's CPU (benchmarks/analysis/ingest.md);
    # the driver's peak RSS is read once, after it.
    root = os.getpid()
    cpu_before, start = tree_cpu_s(root), time.perf_counter()
    info = inspect_source(DataConfig(source=source), Path(cache))
    ingest_s = time.perf_counter() - start
    entry = prepare(info, SplitConfig(), PreprocessConfig(), Path(cache))
    seconds = time.perf_counter() - start
    cpu_s = cpu_since(cpu_before, tree_cpu_s(root))
    return {
        "seconds": seconds,
        "cpu_s": round(cpu_s, 2),
        "ingest_s": round(ingest_s, 3),
        "rows": sum(entry.counts.values()),
        "counts": entry.counts,
        "driver_threads": driver_threads(info),
    }


def phases(source: str, cache: str) -> None:
    """Where trainflow's time goes: ``prepare``'s passes over a tabular input one by one
    (as it runs them on Ray tasks, for an input above LOCAL_DRIVER_BYTES or on a cluster
    of other machines: split by row hash, a scan then a write, one Ray task per
    fragment), each pass's wall and CPU seconds, and the CPU of the per-batch functions
    alone."""

    import pyarrow.parquet as pq
    from common import tree_cpu_s

    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data import prepare, preprocess, readers, runner
    from trainflow.pipelines.data import schema as data
    from trainflow.pipelines.data import split as sp
    from trainflow.pipelines.data.stats import FitStats, RowCounts

    start_ray(num_cpus=2)
    clock, cpu = time.perf_counter(), tree_cpu_s(os.getpid())

    def lap(name: str) -> None:
        nonlocal clock, cpu
        now, after = time.perf_counter(), tree_cpu_s(os.getpid())
        driver = after[os.getpid()] - cpu[os.getpid()]
        new = sum(v for pid, v in after.items() if pid not in cpu)
        total = sum(v - cpu.get(pid, 0.0) for pid, v in after.items())
        print(
            f"{name:<18} wall {now - clock:6.2f} s  CPU {total:6.2f} s (driver {driver:.2f}, "
            f"processes started in this pass {new:.2f}, other Ray processes {total - driver - new:.2f})",
            flush=True,
        )
        clock, cpu = now, after

    split, cfg = SplitConfig(), PreprocessConfig()
    info = data.inspect_source(DataConfig(source=source), Path(cache))
    lap("inspect_source")
    fragments = readers.plan_fragments(info)
    lap(f"plan: {len(fragments)} fragments")
    scans = runner.run(prepare.scan_fragment, [(info, f, split, cfg.scaler, False) for f in fragments])
    counts, train = RowCounts(), FitStats()
    for s in scans:
        counts.merge(s.counts)
        train.merge(s.train)
    counts.check(info)
    pre = train.preprocessor(info, counts.sorted_labels(), cfg)
    lap("scan + fit")
    calls = [
        (info, f, split, s.codes, pre.to_dict(), f"{cache}/phases", f"part-{f.index:05d}.parquet")
        for f, s in zip(fragments, scans, strict=True)
    ]
    runner.run(prepare.write_fragment, calls)
    lap("write 3 splits")

    table = pq.read_table(info.files[0])
    frame = table.to_pandas()
    for name, fn in (
        ("arrow to pandas", lambda: table.to_pandas()),
        ("RowCounts.add", lambda: RowCounts().add(frame, info)),
        ("split by row hash", lambda: sp.hash_split_codes(sp.row_keys(frame, info, 0), val=0.1, test=0.2)),
        ("transform_batch", lambda: preprocess.transform_batch(frame, state=pre.to_dict())),
    ):
        spent = time.process_time()
        fn()
        print(f"{name:<22} {time.process_time() - spent:6.3f} s CPU for {len(frame):,} rows", flush=True)


def run_measure(kind: str, source: str, work: Path) -> dict:
    cmd = [sys.executable, __file__, "--measure", kind, source, str(work / f"cache-{time.time_ns()}")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"{kind} on {source} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(results: list[dict], note: str, quick: bool) -> str:
    rows = []
    for r in results:
        f = r["floor"]
        for kind, label in (("trainflow", "cold"), ("trainflow_warm", "warm"), ("trainflow_tasks", "cold")):
            if kind not in r:
                continue
            t = r[kind]
            threads = r["runs"][kind][0].get("driver_threads", 0)
            where = f"driver, {threads} threads" if threads else "Ray tasks"
            rows.append(
                f"| {r['rows']:,} | {r['raw_mb']:.0f} | {len(r['runs']['floor'])} | {f['seconds']:.2f} | "
                f"{f['rows_per_s']:,.0f} | {f['cpu_s']:.1f} | {where} | {label} | {t['seconds']:.2f} | "
                f"{t['rows_per_s']:,.0f} | {t['mb_per_s']:.0f} | {t['cpu_s']:.1f} | "
                f"**{r['ratio'][kind]:.2f}x** | {r['cpu_ratio'][kind]:.2f}x |"
            )
    met = {kind: all(r["ratio"][kind] >= TARGET for r in results) for kind in ("trainflow", "trainflow_warm")}
    at_1m = [r["ratio"]["trainflow"] for r in results if r["rows"] == 1_000_000]
    return "\n".join(
        [
            f"## Ingest and preprocess throughput{' (quick run)' if quick else ''}",
            "",
            f"Synthetic Parquet, {FEATURES} float32 features and an int64 label per row (MB: the rows "
            "in memory). trainflow: `inspect_source` + `prepare` as the flow's ingest and preprocess "
            "steps run them (schema checks, row checks, seeded split, fit on train, transform, write "
            "every split as Parquet) on a local Ray cluster of 2 CPUs started before the clock, "
            "on the driver's threads up to `LOCAL_DRIVER_BYTES` (512 MB) of input, else on Ray "
            "tasks: cold, their worker processes start during the first pass; warm, the workers "
            "`trainflow run` starts beside its own start-up were started before the clock "
            "(`trainflow.cluster.session.warm_workers`; none for the driver's threads). An input "
            "prepared on the driver's threads is also prepared on Ray tasks in the same rounds, "
            "as on a cluster of other machines, with cold workers. "
            "Floor: `pyarrow.parquet.read_table` + NumPy standardization in one process. The input "
            "is in the page cache for both; each run is a fresh process, floor and trainflow "
            "alternating; figures are medians. CPU s: user + system seconds of the process and "
            "everything it started (Ray's workers), which moves less than wall time with other "
            "load on the machine.",
            "",
            "| rows | MB | rounds | floor s | floor rows/s | floor CPU s | prepared on | Ray workers "
            "| trainflow s "
            "| trainflow rows/s | trainflow MB/s | trainflow CPU s | trainflow / floor (wall) "
            "| floor / trainflow (CPU) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Target: trainflow at least {TARGET}x the floor's throughput: with warm workers "
            f"**{'met' if met['trainflow_warm'] else 'missed'}**, with cold workers "
            f"**{'met' if met['trainflow'] else 'missed'}**."
            + (
                f" At 1M rows on a fresh cluster at least {TARGET_1M}x: "
                f"**{'met' if all(v >= TARGET_1M for v in at_1m) else 'missed'}**."
                if at_1m
                else ""
            ),
            *([f"\nNote: {note}"] if note else []),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # The floor holds its input about four times over (16.9 GB of RSS at 16M rows), more
    # than many machines can spare: 8M is the default large size; --rows 1000000 16000000
    # measures the sizes the results give (on a machine with 24 GB and nothing else running).
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 8_000_000])
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per size; medians reported")
    parser.add_argument("--large-rounds", type=int, default=1, help="rounds for sizes above 4M rows")
    parser.add_argument("--quick", action="store_true", help="20,000 rows, one round")
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    parser.add_argument(
        "--phases", action="store_true", help="print where trainflow's time goes, pass by pass; write nothing"
    )
    parser.add_argument("--measure", nargs=3, metavar=("KIND", "SOURCE", "CACHE"), help=argparse.SUPPRESS)
    add_results_arg(parser)
    args = parser.parse_args()
    if args.measure:
        kind, source, cache = args.measure
        if kind == "floor":
            r = floor(source)
        else:
            r = trainflow_prepare(source, cache, warm=kind == "trainflow_warm", tasks=kind.endswith("tasks"))
        r["driver_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(json.dumps(r))
        return

    from trainflow.pipelines.data.prepare import LOCAL_DRIVER_BYTES

    sizes = [20_000] if args.quick else args.rows
    if args.phases:
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-ingest-"))
        try:
            write_parquet_input(work / "input", sizes[0], FEATURES)
            print(f"{sizes[0]:,} rows x {FEATURES} features")
            phases(str(work / "input"), str(work / "cache"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    results = []
    for rows in sizes:
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-ingest-"))
        try:
            written = write_parquet_input(work / "input", rows, FEATURES)
            mb = raw_mb(rows, FEATURES)
            runs: dict[str, list[dict]] = {"floor": [], "trainflow": [], "trainflow_warm": []}
            # An input on the driver's threads for this cluster alone: on Ray tasks too.
            if written["files"] > 1 and written["file_mb"] * 2**20 <= LOCAL_DRIVER_BYTES:
                runs["trainflow_tasks"] = []
            rounds = 1 if args.quick else args.rounds if rows <= 4_000_000 else args.large_rounds
            for i in range(rounds):
                for kind in runs:
                    r = run_measure(kind, str(work / "input"), work)
                    r["seconds"] = round(r["seconds"], 2)
                    runs[kind].append(r)
                    print(f"{rows:,} rows, round {i + 1}, {kind}: {r}", flush=True)
            entry = {"rows": rows, "raw_mb": round(mb, 1), "input": written, "runs": runs}
            for kind, rs in runs.items():
                seconds, cpu = median([r["seconds"] for r in rs]), median([r["cpu_s"] for r in rs])
                entry[kind] = {
                    "seconds": seconds,
                    "cpu_s": cpu,
                    "rows_per_s": round(rows / seconds),
                    "mb_per_s": round(mb / seconds, 1),
                    "driver_peak_rss_mb": median([r["driver_peak_rss_mb"] for r in rs]),
                }
            kinds = [k for k in runs if k != "floor"]
            entry["ratio"] = {k: ratio(entry[k]["rows_per_s"], entry["floor"]["rows_per_s"]) for k in kinds}
            entry["cpu_ratio"] = {k: ratio(entry["floor"]["cpu_s"], entry[k]["cpu_s"]) for k in kinds}
            results.append(entry)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    figures = {
        "quick": args.quick,
        "note": args.note,
        "sizes": results,
        "target": {"trainflow_vs_floor_throughput_at_least": TARGET, "cold_at_1m_rows_at_least": TARGET_1M},
        "met": {k: all(r["ratio"][k] >= TARGET for r in results) for k in ("trainflow", "trainflow_warm")},
    }
    path = write_section("ingest", figures, markdown(results, args.note, args.quick), args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
