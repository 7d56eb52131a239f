"""Memory of large images: a folder of 224x224 RGB JPEGs prepared and trained on by a
torchvision resnet18, and the time to convert a torchvision dataset of MNIST's size.

For each ``train.in_memory`` setting asked (``auto``: the train split sits in the
worker's memory while it is small; ``never``: it streams from Ray Data), a fresh
process with its own local Ray cluster runs trainflow's own steps (``inspect_source``,
``prepare``, ``run_training``: 1 epoch, 1 worker) on a folder of random JPEGs of two
classes, while a thread samples the resident memory of every process it started. It
reports the driver's peak, the train worker's, the preparing tasks' and Ray Data's
(streaming) processes', with the prepared splits' sizes. The conversion part writes
MNIST's own file format (random pixels) and times ``sources.torchvision_parquet``.

    .venv/bin/python benchmarks/image_memory.py                 # 500 JPEGs, auto and never
    .venv/bin/python benchmarks/image_memory.py --images 300 --settings never
    .venv/bin/python benchmarks/image_memory.py --quick          # 120 JPEGs, 10,000 MNIST rows

Writes benchmarks/results/image_memory.json and image_memory.md (quick runs: under
results/quick).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import _tree, add_results_arg, load1, write_section

# What a Ray worker's process title says it runs, by role.
ROLES = {
    "train worker": ("RayTrainWorker", "TrainWorker"),
    "preparing tasks": ("scan_fragment", "fit_fragment", "write_fragment", "count_rows"),
    "Ray Data": ("ReadParquet", "MapBatches", "SplitCoordinator", "Map(", "ReadFiles"),
}


def write_jpegs(root: Path, images: int, size: int) -> int:
    """``images`` random RGB JPEGs of ``size`` x ``size`` in two class folders; their bytes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    total = 0
    for i in range(images):
        folder = root / ("bright" if i % 2 else "dark")
        folder.mkdir(parents=True, exist_ok=True)
        base = 150 if i % 2 else 90
        pixels = np.clip(rng.normal(base, 40, size=(size, size, 3)), 0, 255).astype(np.uint8)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        total += path.stat().st_size
    return total


class RoleSampler:
    """Samples the resident memory (VmRSS) of this process and of every process it started,
    naming each by its process title; the peak per role."""

    def __init__(self, every_s: float = 0.2):
        self.every_s = every_s
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        for pid in _tree(me):
            try:
                title = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            rss = next(
                (int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0
            )
            role = (
                "driver"
                if pid == me
                else next((r for r, marks in ROLES.items() if any(m in title for m in marks)), None)
            )
            if role:
                self.peaks[role] = round(max(self.peaks.get(role, 0.0), rss))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> RoleSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(source: str, work: str, in_memory: str, size: int, batch_size: int) -> dict:
    """Runs in its own process: one local Ray cluster, one prepare and one training run."""
    import ray

    from trainflow.cluster.quiet import configure_ray_data
    from trainflow.cluster.session import ray_init_kwargs
    from trainflow.config import load_config
    from trainflow.pipelines.data.entry import split_bytes
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.pipelines.training.inputs import splits_in_memory
    from trainflow.pipelines.training.run import run_training
    from trainflow.pipelines.training.settings import PreparedSplits

    config = load_config(
        {
            "name": "image-memory",
            "data": {"source": source, "split": {"val": 0.1, "test": 0.1}},
            "preprocess": {"image_size": [size, size]},
            "model": {"kind": "torchvision:resnet18"},
            "train": {"epochs": 1, "batch_size": batch_size, "in_memory": in_memory},
            "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": 1}},
        }
    )
    ray.init(address="local", num_cpus=2, **ray_init_kwargs())
    configure_ray_data()
    out: dict = {"in_memory_setting": in_memory}
    with RoleSampler() as sampler:
        start = time.perf_counter()
        info = inspect_source(config.data)
        entry = prepare(info, config.data.split, config.preprocess, Path(work) / "cache")
        out["prepare_s"] = round(time.perf_counter() - start, 1)
        out["driver_after_prepare_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        pre = entry.preprocessor
        out["prepared_mb"] = {n: round(split_bytes(entry.split_path(n)) / 2**20, 1) for n in entry.counts}
        out["rows"] = entry.counts
        out["in_memory"] = list(splits_in_memory(config, entry.path))
        start = time.perf_counter()
        prepared = PreparedSplits(str(entry.path), pre.to_dict(), pre.num_features, pre.num_outputs)
        run_training(config, prepared, run_name="image-memory", storage=str(Path(work) / "runs"))
        out["train_s"] = round(time.perf_counter() - start, 1)
    out["driver_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    out["peak_rss_mb"] = sampler.peaks
    ray.shutdown()
    return out


def time_conversion(rows: int) -> dict:
    """Seconds to convert a torchvision MNIST of ``rows`` images (MNIST's own files, random
    pixels; six sevenths train, as MNIST's) into what the image path reads."""
    import numpy as np

    from trainflow.pipelines.data import sources

    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-"))
    try:
        raw = work / "MNIST" / "raw"
        raw.mkdir(parents=True)
        rng = np.random.default_rng(0)
        train = rows * 6 // 7
        for prefix, n in (("train", train), ("t10k", rows - train)):
            images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
            (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
                struct.pack(">iiii", 2051, n, 28, 28) + images.tobytes()
            )
            labels = (np.arange(n) % 10).astype(np.uint8)
            (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, n) + labels.tobytes())
        import ray.data  # noqa: F401  imported by any run before it converts; not counted

        start = time.perf_counter()
        out = sources.torchvision_parquet("MNIST", work)
        seconds = time.perf_counter() - start
        size = sum(p.stat().st_size for p in out.glob("*.parquet"))
        return {"rows": rows, "seconds": round(seconds, 2), "parquet_mb": round(size / 2**20, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--settings", nargs="+", default=["auto", "never"], choices=["auto", "never", "always"]
    )
    parser.add_argument("--mnist-rows", type=int, default=70_000)
    parser.add_argument(
        "--quick", action="store_true", help="120 JPEGs, 10,000 MNIST rows; under results/quick"
    )
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    add_results_arg(parser)
    parser.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        source, work, setting, size, batch = args.measure
        print(json.dumps(measure(source, work, setting, int(size), int(batch))))
        return
    if args.quick:
        args.images, args.mnist_rows = 120, 10_000
    conversion = time_conversion(args.mnist_rows)
    c = conversion
    print(f"converting {c['rows']:,} MNIST images: {c['seconds']} s, {c['parquet_mb']} MB")
    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-"))
    runs = []
    try:
        jpeg_bytes = write_jpegs(work / "images", args.images, args.size)
        print(f"{args.images} JPEGs of {args.size}x{args.size}: {jpeg_bytes / 2**20:.1f} MB")
        for setting in args.settings:
            shutil.rmtree(work / setting, ignore_errors=True)
            what = [str(work / "images"), str(work / setting), setting, str(args.size), str(args.batch_size)]
            command = [sys.executable, __file__, "--measure", *what]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"train.in_memory={setting} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["load_1min_after"] = load1()
            runs.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {
        "benchmark": "image_memory: 224x224 JPEGs prepared and trained on by a resnet18; MNIST's conversion",
        "quick": args.quick,
        "note": args.note,
        "images": args.images,
        "size": args.size,
        "jpeg_mb": round(jpeg_bytes / 2**20, 1),
        "batch_size": args.batch_size,
        "conversion": conversion,
        "runs": runs,
    }
    print(write_section("image_memory", figures, markdown(figures), args.results).read_text())


def markdown(figures: dict) -> str:
    def peak(run: dict, role: str) -> str:
        return f"{run['peak_rss_mb'][role]} MB" if role in run["peak_rss_mb"] else "-"

    rows = [
        f"| {r['in_memory_setting']} | {', '.join(r['in_memory']) or 'none'} | "
        f"{r['prepared_mb']['train']} MB | {r['prepare_s']} s | {r['train_s']} s | "
        f"{r['driver_peak_rss_mb']} MB | "
        f"{peak(r, 'preparing tasks')} | {peak(r, 'train worker')} | {peak(r, 'Ray Data')} |"
        for r in figures["runs"]
    ]
    c = figures["conversion"]
    note = f" Note: {figures['note']}." if figures["note"] else ""
    return "\n".join(
        [
            f"## Large images: memory of preparing and training on 224x224 JPEGs"
            f"{' (quick run)' if figures['quick'] else ''}",
            "",
            f"A folder of {figures['images']} random RGB JPEGs of {figures['size']}x{figures['size']} "
            f"({figures['jpeg_mb']} MB, two classes) prepared (`preprocess.image_size` "
            f"[{figures['size']}, {figures['size']}], float32 rows) and trained on by a "
            f"`torchvision:resnet18` (1 epoch, 1 worker of 1 CPU, batch {figures['batch_size']}), each "
            "`train.in_memory` setting in a fresh process with its own local Ray cluster (2 CPUs); peak "
            "resident memory (VmRSS) per process, "
            f"sampled every 0.2 s (the driver's: its own maximum).{note}",
            "",
            "| train.in_memory | in memory | prepared train | prepare | train | driver peak | "
            "preparing task peak | train worker peak | Ray Data process peak |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Converting a torchvision MNIST of {c['rows']:,} images (random pixels in MNIST's own files) "
            f"to the Parquet the image path reads: {c['seconds']} s, {c['parquet_mb']} MB.",
        ]
    )


if __name__ == "__main__":
    main()
