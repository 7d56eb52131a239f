"""Preparing Parquet inputs many times larger than Ray's object store, in bounded memory.

For each size this writes a Parquet folder of random float32 features and an integer
label, then runs trainflow's own preparation (row checks, split, fit, transform, write:
``trainflow.pipelines.data.preprocess.prepare``) in a fresh process whose local Ray cluster
has a small object store, and prints the time and the driver's peak resident memory.
The driver's peak should stay flat as the input grows: every pass streams.

    .venv/bin/python benchmarks/large_prepare.py                       # 300, 600, 1200 MB
    .venv/bin/python benchmarks/large_prepare.py --sizes-mb 100 200 --object-store-mb 80
    .venv/bin/python benchmarks/large_prepare.py --quick               # 50 and 100 MB

Writes benchmarks/results/large_prepare.json and large_prepare.md (quick runs: under
results/quick). Needs about three times the largest size in free disk (input, Ray's
spill, output).
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

from common import add_results_arg, load1, write_section

COLUMNS = 32
ROWS_PER_FILE = 200_000


def write_input(folder: Path, megabytes: int) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    rows_wanted = megabytes * (1 << 20) // (4 * COLUMNS + 8)
    rng = np.random.default_rng(0)
    written, part = 0, 0
    while written < rows_wanted:
        n = min(ROWS_PER_FILE, rows_wanted - written)
        x = rng.normal(size=(n, COLUMNS)).astype(np.float32)
        label = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
        table = pa.table({**{f"f{j}": x[:, j] for j in range(COLUMNS)}, "label": label})
        pq.write_table(table, folder / f"part-{part:04d}.parquet", compression="none")
        written, part = written + n, part + 1
    return written


def measure(source: str, cache: str, object_store_mb: int) -> dict:
    """Runs in its own process: one local Ray cluster, one prepare, the driver's peak RSS."""
    import ray

    from trainflow.cluster.quiet import configure_ray_data
    from trainflow.cluster.session import ray_init_kwargs
    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source

    ray.init(address="local", num_cpus=2, object_store_memory=object_store_mb << 20, **ray_init_kwargs())
    configure_ray_data()
    start = time.perf_counter()
    info = inspect_source(DataConfig(source=source))
    entry = prepare(info, SplitConfig(), PreprocessConfig(), Path(cache))
    seconds = time.perf_counter() - start
    ray.shutdown()
    return {
        "seconds": round(seconds, 1),
        "rows": sum(entry.counts.values()),
        "counts": entry.counts,
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[300, 600, 1200])
    parser.add_argument("--object-store-mb", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="50 and 100 MB; writes under results/quick")
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    add_results_arg(parser)
    parser.add_argument("--measure", nargs=3, metavar=("SOURCE", "CACHE", "STORE_MB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        source, cache, store = args.measure
        print(json.dumps(measure(source, cache, int(store))))
        return
    if args.quick:
        args.sizes_mb = [50, 100]
    print(f"object store {args.object_store_mb} MB, {COLUMNS} float32 features + label")
    sizes = []
    print(f"{'input MB':>9} {'rows':>10} {'x store':>8} {'seconds':>8} {'driver peak RSS MB':>19}")
    for mb in args.sizes_mb:
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-"))
        try:
            write_input(work / "input", mb)
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(work / "input"), str(work / "cache"),
                 str(args.object_store_mb)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode:
                sys.exit(f"{mb} MB failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            sizes.append({"input_mb": mb, "x_object_store": round(mb / args.object_store_mb, 1), **r,
                          "load_1min_after": load1()})  # fmt: skip
            print(
                f"{mb:>9} {r['rows']:>10} {mb / args.object_store_mb:>8.1f} {r['seconds']:>8} "
                f"{r['driver_peak_rss_mb']:>19}",
                flush=True,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    figures = {
        "benchmark": "large_prepare: trainflow's prepare on Parquet inputs larger than Ray's object store",
        "quick": args.quick,
        "note": args.note,
        "object_store_mb": args.object_store_mb,
        "features": COLUMNS,
        "sizes": sizes,
    }
    print(write_section("large_prepare", figures, markdown(figures), args.results).read_text())


def markdown(figures: dict) -> str:
    rows = [
        f"| {s['input_mb']} MB | {s['rows'] / 1e6:.1f} M | {s['x_object_store']:g} | {s['seconds']:.1f} s | "
        f"{s['driver_peak_rss_mb']} MB |"
        for s in figures["sizes"]
    ]
    note = f" Note: {figures['note']}." if figures["note"] else ""
    return "\n".join(
        [
            f"## Large inputs: preparing Parquet larger than Ray's object store"
            f"{' (quick run)' if figures['quick'] else ''}",
            "",
            f"trainflow's `prepare` (row checks, split, fit, transform, write) on uncompressed Parquet of "
            f"{figures['features']} float32 features and a label, each size in a fresh process whose local "
            f"Ray cluster (2 CPUs) has a {figures['object_store_mb']} MB object store; the time excludes "
            f"Ray's start-up.{note}",
            "",
            "| Parquet input | rows | x object store | prepare | driver peak RSS |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )


if __name__ == "__main__":
    main()
