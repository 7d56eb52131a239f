"""The preparation engine's substrate: Ray tasks per fragment against Ray Data, on the same
input in the same run, alternating.

Both run the engine's two passes with the same per-batch functions (the row checks'
counts, the split by row hash, the train statistics; the transform) on a local Ray
cluster of 2 CPUs whose workers were started before the clock:

- scan: per fragment a Ray task reading it with pyarrow (tasks), against
  ``ray.data.read_parquet`` / ``read_images`` -> ``map_batches`` (Ray Data); the
  per-batch statistics merged in the driver;
- write: per fragment a Ray task that transforms its rows and writes each split's
  Parquet (tasks), against ``read_*`` -> ``map_batches`` (transform, split column) ->
  ``write_parquet(partition_cols=[split])`` (Ray Data).

The rule: the engine runs on Ray Data unless Ray Data is more than RULE times slower
than Ray tasks at the largest table.

    python benchmarks/engine.py                     # 1M and 16M rows x 64 features, an image folder
    python benchmarks/engine.py --quick             # 50,000 rows, 2,000 images, one round

Each measurement runs in a fresh process. Writes benchmarks/results/engine.json and
engine.md; the generated inputs and outputs are deleted after each size. Needs about
twice the largest input in free disk (9 GB at 16M rows).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    MemorySampler,
    add_results_arg,
    median,
    ratio,
    raw_mb,
    start_ray,
    write_parquet_input,
    write_section,
)

RULE = 1.3  # Ray Data preferred unless its wall time is more than this times the tasks'
FEATURES = 64
SUBSTRATES = ("tasks", "ray_data")
IMAGE_SIZE = 32
SPLIT_COLUMN = "split"


def write_image_folder(root: Path, images: int, classes: int = 10, seed: int = 0) -> dict:
    """``images`` PNGs of IMAGE_SIZE x IMAGE_SIZE RGB noise in ``classes`` class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:06d}.png")
    size = sum(p.stat().st_size for p in root.rglob("*.png"))
    return {"images": images, "classes": classes, "file_mb": round(size / 2**20, 1)}


# The passes, as each substrate runs them.


def _scan_batch(batch, *, info, split, scaler, shape) -> dict:
    """One batch's row-check counts and train statistics, pickled into one row."""
    import pickle

    import numpy as np

    from trainflow.pipelines.data import split as sp
    from trainflow.pipelines.data import stats as st

    counts, fitted = st.RowCounts(), st.FitStats()
    counts.add(batch, info)
    codes = sp.hash_split_codes(sp.row_keys(batch, info, split.seed), val=split.val, test=split.test)
    fitted.add(batch[codes == 0], info, scaler, shape)
    # Object arrays: NumPy's bytes type would drop a pickle's trailing zero bytes.
    return {
        "counts": np.array([pickle.dumps(counts)], dtype=object),
        "train": np.array([pickle.dumps(fitted)], dtype=object),
    }


def _write_batch(batch, *, info, split, state) -> dict:
    import numpy as np

    from trainflow.pipelines.data import split as sp
    from trainflow.pipelines.data.preprocess import FEATURES as X
    from trainflow.pipelines.data.preprocess import LABEL, Preprocessor

    pre = Preprocessor.from_dict(state)
    codes = sp.hash_split_codes(sp.row_keys(batch, info, split.seed), val=split.val, test=split.test)
    names = np.array(sp.SPLIT_NAMES)[codes]
    return {X: pre.features(batch), LABEL: pre.labels(batch[info.label_column]), SPLIT_COLUMN: names}


def ray_data_dataset(info):
    import ray.data

    from trainflow.pipelines.data.readers import image_labels
    from trainflow.pipelines.data.schema import filesystem

    fs = filesystem(info)
    if info.is_images:
        ds = ray.data.read_images(info.files, filesystem=fs, mode=info.image_mode, include_paths=True)
        return ds.map_batches(
            image_labels, fn_kwargs={"label_column": info.label_column}, batch_format="pandas"
        )
    columns = [*info.input_columns, info.label_column]
    return ray.data.read_parquet(info.files, filesystem=fs).select_columns(columns)


def ray_data_scan(info, split, scaler, shape):
    import pickle

    from trainflow.pipelines.data import stats as st

    rows = (
        ray_data_dataset(info)
        .map_batches(
            _scan_batch,
            fn_kwargs={"info": info, "split": split, "scaler": scaler, "shape": shape},
            batch_format="pandas",
            batch_size=None,
        )
        .take_all()
    )  # one small row per block
    counts, fitted = st.RowCounts(), st.FitStats()
    for row in rows:
        counts.merge(pickle.loads(row["counts"]))
        fitted.merge(pickle.loads(row["train"]))
    return counts, fitted


def ray_data_write(info, split, pre, out: Path) -> None:
    ds = ray_data_dataset(info).map_batches(
        _write_batch,
        fn_kwargs={"info": info, "split": split, "state": pre.to_dict()},
        batch_format="pandas",
        batch_size=None,
    )
    ds.write_parquet(str(out), partition_cols=[SPLIT_COLUMN])


def tasks_scan(info, split, scaler, shape):
    from trainflow.pipelines.data import prepare as pp
    from trainflow.pipelines.data import readers, runner
    from trainflow.pipelines.data import stats as st

    fragments = readers.plan_fragments(info)
    scans = runner.run(pp.scan_fragment, [(info, f, split, scaler, False, shape) for f in fragments])
    counts, fitted = st.RowCounts(), st.FitStats()
    for s in scans:
        counts.merge(s.counts)
        fitted.merge(s.train)
    return counts, fitted, fragments, scans


def tasks_write(info, split, pre, out: Path, fragments, scans) -> None:
    from trainflow.pipelines.data import prepare as pp
    from trainflow.pipelines.data import runner

    calls = [
        (info, f, split, s.codes, pre.to_dict(), str(out), f"part-{f.index:05d}.parquet")
        for f, s in zip(fragments, scans, strict=True)
    ]
    runner.run(pp.write_fragment, calls)


def measure(substrate: str, source: str, out: str) -> dict:
    """Both passes on one substrate, in this (fresh) process: wall and CPU seconds each."""
    import ray

    from trainflow.cluster.session import warm_workers
    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data.prepare import image_shape
    from trainflow.pipelines.data.schema import inspect_source

    start_ray(num_cpus=2)
    ray.get(warm_workers(["trainflow.pipelines.data.prepare"]))
    split, cfg = SplitConfig(), PreprocessConfig()
    info = inspect_source(DataConfig(source=source), Path(out) / "cache")
    shape = image_shape(info, cfg)
    with MemorySampler() as memory:
        start = time.perf_counter()
        with memory.phase("scan"):
            if substrate == "tasks":
                counts, fitted, fragments, scans = tasks_scan(info, split, cfg.scaler, shape)
            else:
                counts, fitted = ray_data_scan(info, split, cfg.scaler, shape)
            counts.check(info)
            pre = fitted.preprocessor(info, info.classes or counts.sorted_labels(), cfg, shape)
        scan_s = time.perf_counter() - start
        with memory.phase("write"):
            if substrate == "tasks":
                tasks_write(info, split, pre, Path(out) / "written", fragments, scans)
            else:
                ray_data_write(info, split, pre, Path(out) / "written")
        seconds = time.perf_counter() - start
    written = sum(p.stat().st_size for p in (Path(out) / "written").rglob("*.parquet"))
    return {
        "scan_s": round(scan_s, 2),
        "write_s": round(seconds - scan_s, 2),
        "seconds": round(seconds, 2),
        "scan_cpu_s": round(memory.cpu.get("scan", 0.0), 1),
        "write_cpu_s": round(memory.cpu.get("write", 0.0), 1),
        "rows": counts.rows,
        "written_mb": round(written / 2**20, 1),
        "peak_tree_pss_mb": round(max(memory.peaks.values()), 1),
    }


def run_measure(substrate: str, source: Path, work: Path) -> dict:
    out = work / f"out-{time.time_ns()}"
    cmd = [sys.executable, __file__, "--measure", substrate, str(source), str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{substrate} on {source} failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def compare(name: str, source: Path, work: Path, rounds: int, size: dict) -> dict:
    runs: dict[str, list[dict]] = {s: [] for s in SUBSTRATES}
    for i in range(rounds):
        # Alternating, and the other substrate first on every other round.
        for substrate in SUBSTRATES if i % 2 == 0 else SUBSTRATES[::-1]:
            r = run_measure(substrate, source, work)
            runs[substrate].append(r)
            print(f"{name}, round {i + 1}, {substrate}: {r}", flush=True)
    entry = {"input": name, **size, "rounds": rounds, "runs": runs}
    for substrate, rs in runs.items():
        entry[substrate] = {k: median([r[k] for r in rs]) for k in ("scan_s", "write_s", "seconds")}
        entry[substrate] |= {k: median([r[k] for r in rs]) for k in ("scan_cpu_s", "write_cpu_s")}
        entry[substrate]["peak_mb"] = median([r["peak_tree_pss_mb"] for r in rs])
    entry["ray_data_over_tasks"] = {
        k: ratio(entry["ray_data"][k], entry["tasks"][k]) for k in ("scan_s", "write_s", "seconds")
    }
    return entry


def markdown(results: list[dict], decision: dict, quick: bool, note: str) -> str:
    rows = []
    for r in results:
        for s in SUBSTRATES:
            t = r[s]
            rows.append(
                f"| {r['input']} | {r.get('file_mb', '')} | {s} | {t['scan_s']:.2f} | {t['write_s']:.2f} | "
                f"**{t['seconds']:.2f}** | {t['scan_cpu_s']:.1f} | {t['write_cpu_s']:.1f} "
                f"| {t['peak_mb']:.0f} |"
            )
        ratios = r["ray_data_over_tasks"]
        rows.append(
            f"| {r['input']} | | Ray Data / tasks | {ratios['scan_s']:.2f}x | {ratios['write_s']:.2f}x | "
            f"**{ratios['seconds']:.2f}x** | | | |"
        )
    return "\n".join(
        [
            f"## Preparation engine: Ray tasks against Ray Data{' (quick run)' if quick else ''}",
            "",
            "The engine's two passes over the same input, on each substrate, each run a fresh process "
            "(a local Ray cluster of 2 CPUs, its workers started before the clock), the substrates "
            f"alternating, medians of the rounds. Tables: synthetic Parquet of {FEATURES} float32 "
            "features and an int64 label, split by row hash; image folder: "
            f"{IMAGE_SIZE}x{IMAGE_SIZE} RGB PNGs in 10 class folders. Scan: row checks' counts, split "
            "by row hash, train statistics, merged in the driver; write: split, transform, Parquet per "
            "split. Tasks: one Ray task per fragment reading it with pyarrow (images: PIL). Ray Data: "
            "`read_parquet` / `read_images` -> `map_batches`, and `map_batches` -> "
            "`write_parquet(partition_cols=[split])`. CPU s: user + system of the process tree. Peak "
            "MB: the tree's proportional set size.",
            "",
            "| input | file MB | substrate | scan s | write s | total s | scan CPU s | write CPU s "
            "| peak MB |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Rule: Ray Data unless it is more than {RULE}x slower than Ray tasks at "
            f"{decision['rows']:,} rows. Ray Data / tasks there: **{decision['ratio']:.2f}x**: "
            f"the engine runs on **{decision['substrate']}**.",
            *([f"\nNote: {note}"] if note else []),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 16_000_000])
    parser.add_argument("--images", type=int, default=20_000, help="images in the image folder (0: none)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds per input; medians reported"
    )
    parser.add_argument("--quick", action="store_true", help="50,000 rows and 2,000 images, one round")
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    parser.add_argument("--measure", nargs=3, metavar=("SUBSTRATE", "SOURCE", "OUT"), help=argparse.SUPPRESS)
    add_results_arg(parser)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    sizes = [50_000] if args.quick else args.rows
    images = 2_000 if args.quick else args.images
    rounds = 1 if args.quick else args.rounds
    results = []
    for rows in sizes:
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-engine-"))
        try:
            written = write_parquet_input(work / "input", rows, FEATURES)
            size = {"rows": rows, "raw_mb": round(raw_mb(rows, FEATURES), 1), "file_mb": written["file_mb"]}
            results.append(compare(f"{rows:,} rows", work / "input", work, rounds, size))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if images:
        work = Path(tempfile.mkdtemp(prefix="trainflow-bench-engine-"))
        try:
            written = write_image_folder(work / "images", images)
            results.append(compare(f"{images:,} images", work / "images", work, rounds, written))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    largest = max((r for r in results if "rows" in r), key=lambda r: r["rows"])
    slower = largest["ray_data_over_tasks"]["seconds"]
    decision = {
        "rows": largest["rows"],
        "ratio": slower,
        "rule": f"Ray Data unless more than {RULE}x slower than Ray tasks at the largest table",
        "substrate": "Ray Data" if slower <= RULE else "Ray tasks",
    }
    figures = {"quick": args.quick, "note": args.note, "inputs": results, "decision": decision}
    path = write_section("engine", figures, markdown(results, decision, args.quick, args.note), args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
