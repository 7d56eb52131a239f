"""ResNet-18 on 32x32 images: samples/s of one TorchTrainer worker that trainflow runs
against the same model in a plain PyTorch loop on the same rows, in the same run.

The data: synthetic 32x32 RGB PNGs in 10 class folders, prepared by trainflow's own
engine (``pipelines.data.inspect_source`` and ``pipelines.prepare.prepare``: per-channel
normalized, flat, 80/10/10 train/val/test). trainflow: ``pipelines.training.run.run_training``,
the one function the train task calls, with ``model.kind: torchvision:resnet18``, one
worker, Adam; both small splits are read once into the worker's memory (what
``train.in_memory: auto`` picks). Every epoch trains, validates on the val split and
writes a checkpoint that Ray Train records, as every run does. A ``train.callbacks`` hook
logs when each epoch ends in the worker; the first epoch (start-up, warm-up) is left out
and start-up is reported on its own.

Plain PyTorch, in a fresh process: ``torchvision.models.resnet18(num_classes=10)`` (for
3-channel images trainflow keeps its first convolution as it is; the parameter count is
checked against trainflow's), the same optimizer, learning rate and batch size, a
shuffled tensor loop over the same prepared train rows in memory, then the same
validation and a ``torch.save`` of the model and optimizer every epoch. Its thread count
is the worker's: Ray sets OMP_NUM_THREADS to the worker's CPUs, so the baseline gets
``torch.set_num_threads`` and OMP_NUM_THREADS set to what the worker's torch reported.
Ray also starts its workers at a niceness of 15 (its ``worker_niceness``), which matters
on a machine others load: the baseline runs at the worker's niceness too. Besides wall
time, each side's CPU seconds per epoch: the worker process's (from the hook), the driver
with the whole Ray cluster (sampled), and the plain process's; others' load on a shared
machine moves them much less than wall time.

    python benchmarks/resnet.py                    # 5,000 images, 3 epochs, 2 alternating rounds
    python benchmarks/resnet.py --quick            # 400 images, 2 epochs, one round

Writes benchmarks/results/resnet.json and resnet.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (
    EPOCH_LOG,
    add_results_arg,
    median,
    ratio,
    start_ray,
    tree_cpu_s,
    workers_import_here,
    write_section,
)
from engine import write_image_folder

TARGET = 0.9  # trainflow's samples/s at least 0.9x plain PyTorch's
ARCH = "resnet18"
CLASSES = 10
SPLIT = {"val": 0.1, "test": 0.1}


def prepare_images(work: Path, rows: int):
    """The image folder, prepared by trainflow's engine; returns its PreparedSplits."""
    from trainflow.config import DataConfig, PreprocessConfig, SplitConfig
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.pipelines.training.settings import PreparedSplits

    folder = work / "images"
    write_image_folder(folder, rows, classes=CLASSES)
    info = inspect_source(DataConfig(source=str(folder)), work / "cache")
    entry = prepare(info, SplitConfig(**SPLIT), PreprocessConfig(), work / "cache")
    pre = entry.preprocessor
    prepared = PreparedSplits(str(entry.path), pre.to_dict(), pre.num_features, pre.num_outputs)
    return prepared, entry.counts


def config(args, source: Path):
    from trainflow.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "name": "bench-resnet",
            "data": {"source": str(source), "split": SPLIT},
            "model": {"kind": f"torchvision:{ARCH}"},
            "train": {
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "optimizer": "adam",
                "lr": args.lr,
                "callbacks": ["common:epoch_done"],
            },
            "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": args.cpus}},
            "checkpoint": {"keep": 1},
            "failure": {"max_failures": 0},
        }
    )


def trainflow_parameters(args, prepared) -> int:
    """How many parameters the model trainflow builds for the prepared data has."""
    from trainflow.pipelines.models.build import image_shape, model_spec

    cfg = config(args, Path(prepared.path))
    shape = image_shape(prepared.preprocessor)
    spec = model_spec(cfg.model, prepared.num_features, prepared.num_outputs, image_shape=shape)
    return spec["parameters"]["total"]


class CpuTrace:
    """The CPU seconds of this process and everything it started (the Ray cluster: GCS,
    raylet, Train's controller, the worker), read every ``every_s`` in a thread; read at
    any moment in between by interpolation. A process that exits keeps the CPU it was last
    seen with (the workers exit before ``run_training`` returns)."""

    def __init__(self, every_s: float = 0.25):
        self.every_s, self.points = every_s, []
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-trace", daemon=True)

    def _read(self) -> None:
        self._seen.update(tree_cpu_s(os.getpid()))
        self.points.append((time.time(), sum(self._seen.values())))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._read()

    def __enter__(self) -> CpuTrace:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def at(self, when: float) -> float:
        import numpy as np

        times, cpu = zip(*self.points, strict=True)
        return float(np.interp(when, times, cpu))


def run_trainflow(args, work: Path, prepared, train_rows: int) -> dict:
    """One ``run_training`` call, as the train task makes it; epoch ends from the worker's log."""
    from trainflow.pipelines.training.run import run_training

    cfg = config(args, work / "images")
    log = Path(os.environ[EPOCH_LOG])
    seen = len(log.read_text().splitlines()) if log.exists() else 0
    rows_seen: list[dict] = []
    with CpuTrace() as trace:
        start = time.time()
        result = run_training(
            cfg,
            prepared,
            run_name=f"bench-resnet-{time.time_ns()}",
            storage=str(work / "runs"),
            on_row=rows_seen.append,
        )
        returned = time.time()
    logged = [json.loads(line) for line in log.read_text().splitlines()[seen:]]
    ends = sorted(r["time"] for r in logged if r["rank"] == 0)
    epoch_s = [round(b - a, 2) for a, b in zip(ends, ends[1:], strict=False)]
    cpu = sorted(r["cpu"] for r in logged if r["rank"] == 0)
    epoch_cpu_s = [round(b - a, 2) for a, b in zip(cpu, cpu[1:], strict=False)]
    all_cpu = [trace.at(t) for t in ends]
    epoch_all_cpu_s = [round(b - a, 2) for a, b in zip(all_cpu, all_cpu[1:], strict=False)]
    steady = median(epoch_s)
    (plan,) = [r for r in rows_seen if r["kind"] == "plan"]
    return {
        "threads": sorted({r["threads"] for r in logged}),
        "nice": sorted({r["nice"] for r in logged}),
        "in_memory": plan["in_memory"],
        "parameters": plan["parameters"],  # "11,181,642 of 11,181,642 parameters train"
        "epoch_s": epoch_s,  # epochs 2..N
        "samples_per_s": round(train_rows * len(epoch_s) / sum(epoch_s), 1),
        "epoch_cpu_s": epoch_cpu_s,  # the worker process's CPU seconds, epochs 2..N
        "samples_per_cpu_s": round(train_rows * len(epoch_cpu_s) / sum(epoch_cpu_s), 1),
        # Of the driver and the whole Ray cluster (read every 0.25 s, so approximate).
        "epoch_all_cpu_s": epoch_all_cpu_s,
        "cpu_per_epoch_s": round(median(epoch_cpu_s), 2),
        "all_cpu_per_epoch_s": round(median(epoch_all_cpu_s), 2),
        # From the call to the end of epoch 1, less one steady epoch: the driver's model
        # check, the worker group's start, the worker's imports and reading the splits.
        "startup_s": round(ends[0] - start - steady, 1),
        "after_last_epoch_s": round(returned - ends[-1], 1),  # the last report, shutting the workers down
        "run_training_s": round(returned - start, 1),
        "train_loss": [round(h["train_loss"], 4) for h in result.history],
        "val_accuracy": [round(h["val_accuracy"], 4) for h in result.history],
    }


def plain_torch(
    path: str, epochs: int, batch_size: int, lr: float, threads: int, nice: int, out: str
) -> dict:
    """What a PyTorch user writes for the same job: the model, in-memory tensors of the
    prepared rows, a shuffled loop, validation and a checkpoint every epoch; run with
    ``threads`` torch threads at the niceness ``nice`` (the worker's)."""
    import torch
    import torchvision

    from trainflow.pipelines.training.inputs import read_shard

    os.nice(nice - os.nice(0))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = json.loads((Path(path) / "preprocessor.json").read_text())["image"]["shape"]
    x, y = read_shard(f"{path}/train", 0, 1, equal=False)
    xv, yv = read_shard(f"{path}/val", 0, 1, equal=False)
    x, xv = x.view(-1, *spec), xv.view(-1, *spec)
    model = torchvision.models.get_model(ARCH, weights=None, num_classes=CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    ends, cpu, parts, losses = [], [], [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        loss_sum = 0.0
        for idx in torch.randperm(len(y)).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
        t1 = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(yv), batch_size):
                correct += (model(xv[i : i + batch_size]).argmax(1) == yv[i : i + batch_size]).sum().item()
        t2 = time.perf_counter()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}
        torch.save(state, Path(out) / "checkpoint.pt")
        t3 = time.perf_counter()
        ends.append(t3)
        cpu.append(time.process_time())
        parts.append((t1 - t0, t2 - t1, t3 - t2))
        losses.append((round(loss_sum / len(y), 4), round(correct / max(len(yv), 1), 4)))
    epoch_s = [round(b - a, 2) for a, b in zip(ends, ends[1:], strict=False)]
    epoch_cpu_s = [round(b - a, 2) for a, b in zip(cpu, cpu[1:], strict=False)]
    steady = parts[1:]
    return {
        "threads": torch.get_num_threads(),
        "nice": os.nice(0),
        "parameters": sum(p.numel() for p in model.parameters()),
        "epoch_s": epoch_s,
        "samples_per_s": round(len(y) * len(epoch_s) / sum(epoch_s), 1),
        "epoch_cpu_s": epoch_cpu_s,
        "samples_per_cpu_s": round(len(y) * len(epoch_cpu_s) / sum(epoch_cpu_s), 1),
        # Of a steady epoch, seconds: training, validation, the checkpoint.
        "train_s": round(median([p[0] for p in steady]), 2),
        "val_s": round(median([p[1] for p in steady]), 2),
        "checkpoint_s": round(median([p[2] for p in steady]), 2),
        "train_loss": [loss for loss, _ in losses],
        "val_accuracy": [acc for _, acc in losses],
    }


def run_plain(path: str, args, worker: dict, work: Path) -> dict:
    """Plain PyTorch in a fresh process, with the torch threads and niceness that the
    trainflow run's ``worker`` had."""
    threads, nice = max(worker["threads"]), max(worker["nice"])
    out = Path(tempfile.mkdtemp(prefix="plain-", dir=work))
    cmd = [sys.executable, __file__, "--plain", path, str(args.epochs), str(args.batch_size)]
    cmd += [str(args.lr), str(threads), str(nice), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        sys.exit(f"plain PyTorch failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(figures: dict, args) -> str:
    t, p = figures["trainflow"], figures["plain"]
    rounds = figures["rounds"]

    def row(name: str, t: dict, p: dict) -> str:
        return (
            f"| {name} | {t['samples_per_s']:,.0f} | {p['samples_per_s']:,.0f} "
            f"| {t['samples_per_cpu_s']:,.0f} | {p['samples_per_cpu_s']:,.0f} | {t['startup_s']:.1f} |"
        )

    lines = [row(str(i + 1), r["trainflow"], r["plain"]) for i, r in enumerate(rounds)]
    return "\n".join(
        [
            f"## ResNet-18 on 32x32 images{' (quick run)' if args.quick else ''}",
            "",
            f"`torchvision:{ARCH}` ({t['parameters']}), 10 classes, on {figures['rows']:,} synthetic "
            f"32x32 RGB PNGs prepared by trainflow's engine ({figures['counts']['train']:,} train, "
            f"{figures['counts']['val']:,} val rows); batch {args.batch_size}, Adam at lr {args.lr:g}, "
            f"{args.epochs} epochs, the first (start-up, warm-up) left out. trainflow: `run_training` "
            f"with one TorchTrainer worker of {args.cpus:g} CPU, torch threads {t['threads']}, splits "
            f"{', '.join(t['in_memory']) or 'none'} in memory; plain PyTorch: the same model, optimizer "
            f"and rows in memory in one process with {p['threads']} torch thread(s) (OMP_NUM_THREADS and "
            f"`torch.set_num_threads` set to the worker's) at the worker's niceness ({p['nice']}, "
            "Ray's for its workers). Both sides train, validate and write a "
            "checkpoint every epoch. Samples/s: train rows per epoch over seconds per epoch; per "
            "CPU-second: over the CPU seconds of the training process (the Ray worker's, all its "
            "threads), which others' load on the machine moves much less than wall time; medians of "
            f"{len(rounds)} alternating round(s).",
            "",
            "| round | trainflow samples/s | plain PyTorch samples/s | trainflow samples per CPU-s "
            "| plain samples per CPU-s | trainflow start-up s |",
            "|---|---|---|---|---|---|",
            *lines,
            row("median", t, p),
            "",
            f"trainflow / plain: **{figures['ratio']:.2f}x** the samples/s (target at least {TARGET}x: "
            f"**{'met' if figures['met'] else 'missed'}**), {figures['cpu_ratio']:.2f}x the samples per "
            f"CPU-second. A steady plain epoch: {p['train_s']:.2f} s "
            f"training ({figures['counts']['train'] / p['train_s']:,.0f} samples/s), "
            f"{p['val_s']:.2f} s validation, "
            f"{p['checkpoint_s']:.2f} s checkpoint. A steady trainflow epoch cost the worker "
            f"{t['cpu_per_epoch_s']:.2f} CPU-seconds, and the driver with the whole Ray cluster "
            f"(Train's controller, GCS, raylet, the worker) {t['all_cpu_per_epoch_s']:.2f}. "
            "trainflow's start-up (the call to the end of epoch "
            "1, less a steady epoch: the driver's model check, the worker group, its imports and "
            f"reading the splits): {t['startup_s']:.1f} s; after the last epoch until `run_training` "
            f"returned: {t['after_last_epoch_s']:.1f} s.",
            *([f"\nNote: {args.note}"] if args.note else []),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000, help="images (80%% of them train)")
    parser.add_argument("--epochs", type=int, default=3, help="at least 2: the first is left out")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cpus", type=float, default=1.0, help="the worker's CPUs (its torch threads)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="400 images, 2 epochs, one round")
    parser.add_argument("--note", default="", help="conditions worth recording, such as other load")
    parser.add_argument("--plain", nargs=7, help=argparse.SUPPRESS)
    add_results_arg(parser)
    args = parser.parse_args()
    if args.plain:
        path, epochs, batch, lr, threads, nice, out = args.plain
        print(json.dumps(plain_torch(path, int(epochs), int(batch), float(lr), int(threads), int(nice), out)))
        return
    if args.quick:
        args.rows, args.epochs, args.rounds = 400, 2, 1
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is left out")
    if args.rows < 100 or args.rounds < 1 or args.cpus <= 0:
        parser.error(
            "--rows must be at least 100 (10 per class and split), --rounds at least 1, --cpus above 0"
        )

    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-resnet-"))
    try:
        workers_import_here()
        os.environ[EPOCH_LOG] = str(work / "epochs.jsonl")  # the workers inherit it
        start_ray(num_cpus=max(2, math.ceil(args.cpus)))
        prepared, counts = prepare_images(work, args.rows)
        rounds = []
        for i in range(args.rounds):
            # Alternating which goes first, so neither always meets the other's leftovers.
            if i % 2 == 0:
                t = run_trainflow(args, work, prepared, counts["train"])
                p = run_plain(prepared.path, args, t, work)
            else:  # the worker's threads and niceness, as round 1 found them
                p = run_plain(prepared.path, args, rounds[0]["trainflow"], work)
                t = run_trainflow(args, work, prepared, counts["train"])
            print(f"round {i + 1}: trainflow {t}\n         plain {p}", flush=True)
            rounds.append({"trainflow": t, "plain": p})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    trainflow = {**rounds[0]["trainflow"]}
    for key in (
        "samples_per_s",
        "samples_per_cpu_s",
        "cpu_per_epoch_s",
        "all_cpu_per_epoch_s",
        "startup_s",
        "after_last_epoch_s",
    ):
        trainflow[key] = median([r["trainflow"][key] for r in rounds])
    plain = {**rounds[0]["plain"]}
    for key in ("samples_per_s", "samples_per_cpu_s", "train_s", "val_s", "checkpoint_s"):
        plain[key] = median([r["plain"][key] for r in rounds])
    if plain["parameters"] != (ours := trainflow_parameters(args, prepared)):
        sys.exit(f"plain PyTorch's model has {plain['parameters']:,} parameters, trainflow's {ours:,}")
    figures = {
        "quick": args.quick,
        "note": args.note,
        "model": f"torchvision:{ARCH}",
        "image_shape": [3, 32, 32],
        "rows": args.rows,
        "counts": counts,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "worker_cpus": args.cpus,
        "trainflow": trainflow,
        "plain": plain,
        "rounds": rounds,
        "ratio": ratio(trainflow["samples_per_s"], plain["samples_per_s"]),
        "cpu_ratio": ratio(trainflow["samples_per_cpu_s"], plain["samples_per_cpu_s"]),
        "target": {"trainflow_vs_plain_samples_per_s_at_least": TARGET},
    }
    figures["met"] = figures["ratio"] is not None and figures["ratio"] >= TARGET
    path = write_section("resnet", figures, markdown(figures, args), args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
