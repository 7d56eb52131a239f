"""GPU throughput: trainflow's own cnn (``model.kind: cnn``, ``image_shape: [3, 32, 32]``,
10 classes, the default channels and head) on 32x32 images in bf16, images/s, against
plain PyTorch on the same GPU.

Runs when ``torch.cuda.is_available()``; otherwise records that the section was skipped
and why. Three parts, each against a plain PyTorch loop over the same model and batches:

1. The loop alone: trainflow's ``train_epoch`` with ``Precision("bf16-mixed")`` (what
   ``train.precision: bf16-mixed`` runs on each worker) against a plain step under
   ``torch.autocast(bfloat16)``, over synthetic batches held on the GPU.
2. The Ray Train path: one worker with one GPU (``scaling.resources_per_worker: {GPU: 1}``)
   running ``build_trainer`` as the train step does, on prepared Parquet splits of
   synthetic images: trainflow's loop with the train split read once onto the GPU
   (``train.in_memory: always``) and streamed from Ray Data every epoch (``never``,
   batches pinned and copied to the GPU), and a training function of the user's own
   (``train.loop``, benchmarks/gpu_loop.py: Ray's ``prepare_model`` and
   ``iter_torch_batches``). Each row records the device its worker trained on and
   torch.distributed's backend (nccl on a GPU). Plain PyTorch: the same model, Adam and
   batch size in this process, from a pinned ``DataLoader`` (against the streamed rows)
   and from tensors on the GPU (against ``always``). The first epoch (start-up) is left
   out.
3. A transformer: an ``hf:`` BERT (width 256, 4 layers, 128 tokens) through ``train_epoch``
   under ``train.precision: auto`` (bf16 on a GPU that has it) against the same
   transformers model in a plain step under the same autocast, over batches on the GPU.

    python benchmarks/gpu.py                 # part 1: 50 steps of batch 256; part 2: 20,000 images, 4 epochs
    python benchmarks/gpu.py --quick         # 10 steps; 4,000 images, 3 epochs
    python benchmarks/gpu.py --cpu-check     # both parts on the CPU, tiny: the script's own check

``--cpu-check`` runs every path on the CPU (gloo, no pinning) on 64 images of batch 16, so
a machine without a GPU shows that the script runs; its figures say nothing of a GPU and
go to benchmarks/results/quick. Writes benchmarks/results/gpu.json and gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import EPOCH_LOG, add_results_arg, ratio, start_ray, workers_import_here, write_section

SHAPE, CLASSES = (3, 32, 32), 10
# Part 3's transformer: a BERT of this width and depth over texts of TOKENS tokens.
BERT_WIDTH, BERT_LAYERS, TOKENS, VOCAB = 256, 4, 128, 8_000
FEATURES = SHAPE[0] * SHAPE[1] * SHAPE[2]
# Part 2's runs: (what runs, train.in_memory, train.loop, the plain loop it is held against).
PATHS = [
    ("trainflow's loop, train split on the device", "always", None, "on_device"),
    ("trainflow's loop, train split streamed from Ray Data", "never", None, "pinned_loader"),
    ("a train.loop of the user's own, streamed", "never", "gpu_loop:train_func", "pinned_loader"),
]
BASELINES = {
    "on_device": "plain PyTorch, tensors on the device",
    "pinned_loader": "plain PyTorch, a pinned DataLoader",
}


def skipped_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} sees no CUDA device on this machine "
            "(torch.cuda.is_available() is False)"
        )
    return None


def spec() -> dict:
    from trainflow.config import ModelConfig
    from trainflow.pipelines.models.build import model_spec

    return model_spec(ModelConfig(kind="cnn", image_shape=list(SHAPE)), FEATURES, CLASSES)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_loop(device_name: str, steps: int, warmup: int, batch_size: int) -> dict:
    """Part 1: trainflow's train_epoch against a plain step, over batches on the device."""
    import torch

    from trainflow.pipelines.data.preprocess import FEATURES as X
    from trainflow.pipelines.data.preprocess import LABEL
    from trainflow.pipelines.models.build import build_model
    from trainflow.pipelines.training.loop import train_epoch
    from trainflow.pipelines.training.optim import Precision

    model_spec, device = spec(), torch.device(device_name)
    torch.manual_seed(0)
    x = torch.randn(batch_size, FEATURES, device=device)  # flat features, as trainflow feeds them
    y = torch.randint(0, CLASSES, (batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def fresh():
        model = build_model(model_spec).to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def plain(n: int) -> None:
        model.train()
        for _ in range(n):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()

    def trainflow(n: int) -> None:
        train_epoch(model, ({X: x, LABEL: y} for _ in range(n)), optimizer, loss_fn, precision)

    out = {"model": model_spec, "batch_size": batch_size, "steps": steps}
    precision = Precision("bf16-mixed", device)
    for name, loop in (("plain", plain), ("trainflow", trainflow)):
        model, optimizer = fresh()
        out[f"{name}_images_per_s"] = timed(loop, device, steps, warmup, batch_size)
    out["ratio"] = ratio(out["trainflow_images_per_s"], out["plain_images_per_s"])
    return out


def timed(loop, device, steps: int, warmup: int, batch_size: int) -> float:
    """Rows per second of ``loop(steps)`` after ``loop(warmup)``, the device synchronized."""
    loop(warmup)
    synchronize(device)
    start = time.perf_counter()
    loop(steps)
    synchronize(device)
    return round(steps * batch_size / (time.perf_counter() - start), 1)


def measure_transformer(device_name: str, steps: int, warmup: int, batch_size: int) -> dict:
    """Part 3: an ``hf:`` BERT through trainflow's ``train_epoch`` under
    ``Precision("auto")`` (bf16 on a GPU that has it, fp32 elsewhere) against the same
    transformers model in a plain step under the same autocast, over token batches on the device."""
    import torch
    from hf_finetune import save_bert
    from transformers import AutoModelForSequenceClassification

    from trainflow.config import ModelConfig
    from trainflow.pipelines.data.preprocess import LABEL
    from trainflow.pipelines.models.build import build_model, model_spec
    from trainflow.pipelines.training.loop import train_epoch
    from trainflow.pipelines.training.optim import Precision, resolved_precision

    device = torch.device(device_name)
    precision = Precision("auto", device)
    folder = Path(tempfile.mkdtemp(prefix="gpu-bert-"))
    try:
        save_bert(folder, VOCAB, BERT_WIDTH, BERT_LAYERS, positions=TOKENS)
        inputs = {name: {"shape": [TOKENS], "dtype": "int64"} for name in ("input_ids", "attention_mask")}
        spec = model_spec(ModelConfig(kind=f"hf:{folder}"), 2 * TOKENS, 2, inputs=inputs, classes=["a", "b"])
        plain_model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    batch = {
        "input_ids": torch.randint(0, VOCAB, (batch_size, TOKENS), device=device),
        "attention_mask": torch.ones(batch_size, TOKENS, dtype=torch.int64, device=device),
    }
    y = torch.randint(0, 2, (batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def plain(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad(set_to_none=True)
            with precision.autocast():
                loss = loss_fn(model(**batch).logits, y)
            loss.backward()
            optimizer.step()

    def trainflow(n: int) -> None:
        train_epoch(model, ({**batch, LABEL: y} for _ in range(n)), optimizer, loss_fn, precision)

    out = {
        "width": BERT_WIDTH,
        "layers": BERT_LAYERS,
        "tokens": TOKENS,
        "batch_size": batch_size,
        "steps": steps,
        "precision": resolved_precision("auto", device),
    }
    for name, model in (
        ("plain", plain_model.to(device).train()),
        ("trainflow", build_model(spec).to(device)),
    ):
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
        out[f"{name}_texts_per_s"] = timed(
            plain if name == "plain" else trainflow, device, steps, warmup, batch_size
        )
    out["ratio"] = ratio(out["trainflow_texts_per_s"], out["plain_texts_per_s"])
    return out


def synthetic_images(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Prepared rows as trainflow's preprocess step writes images: flat pixels and a class."""
    ids = batch["id"]
    rng = np.random.default_rng(int(ids[0]))
    return {
        "features": rng.standard_normal((len(ids), FEATURES), dtype=np.float32),
        "label": (ids % CLASSES).astype(np.int64),
    }


def write_prepared(folder: Path, rows: int) -> None:
    import ray

    for name, n in (("train", rows), ("val", max(rows // 20, 64))):
        ds = ray.data.range(n, override_num_blocks=4).map_batches(synthetic_images, batch_format="numpy")
        ds.write_parquet(str(folder / name))


def run_ray_train(args, folder: Path, in_memory: str, loop: str | None, gpu: bool) -> dict:
    """One TorchTrainer run as the train step builds it; images/s from the workers' log."""
    from trainflow.config import PipelineConfig
    from trainflow.pipelines.training.inputs import split_inputs
    from trainflow.pipelines.training.run import build_trainer
    from trainflow.pipelines.training.settings import TrainSettings

    train = {"epochs": args.epochs, "batch_size": args.batch_size}
    if loop:  # the user's loop runs its own precision (bf16 autocast)
        train["loop"] = loop
    else:
        train |= {"precision": "bf16-mixed", "in_memory": in_memory, "callbacks": ["common:epoch_done"]}
    cfg = PipelineConfig.model_validate(
        {
            "name": "bench-gpu",
            "model": {"kind": "cnn", "image_shape": list(SHAPE)},
            "train": train,
            "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": 1, **({"GPU": 1} if gpu else {})}},
            "checkpoint": {"keep": 1},
            "failure": {"max_failures": 0},
        }
    )
    log = Path(os.environ[EPOCH_LOG])
    seen = len(log.read_text().splitlines()) if log.exists() else 0
    memory_splits, datasets = split_inputs(
        folder, in_memory=("train", "val") if in_memory == "always" else ()
    )
    settings = TrainSettings.from_config(
        cfg, preprocessor={}, num_features=FEATURES, num_outputs=CLASSES, memory_splits=memory_splits
    )
    trainer = build_trainer(
        settings, datasets, run_name=f"bench-{time.time_ns()}", storage_path=str(folder / "runs")
    )
    trainer.fit()
    rows = [json.loads(line) for line in log.read_text().splitlines()[seen:]]
    ends = sorted(r["time"] for r in rows)
    epoch_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "device": rows[0]["device"],
        "backend": rows[0]["backend"],
        "epoch_s": [round(s, 2) for s in epoch_s],
        "images_per_s": round(args.rows * len(epoch_s) / sum(epoch_s), 1),
    }


def plain_torch(args, device_name: str) -> dict:
    """The same model, Adam and batch size in this process: from a pinned DataLoader over
    host tensors (copied to the device as they come), and from tensors on the device."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainflow.pipelines.models.build import build_model

    device = torch.device(device_name)
    x, y = torch.randn(args.rows, FEATURES), torch.arange(args.rows) % CLASSES
    on_device = (x.to(device), y.to(device))
    loader = DataLoader(
        TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, pin_memory=device.type == "cuda"
    )

    def batches(kind: str):
        if kind == "pinned_loader":
            for xb, yb in loader:
                yield xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        else:
            for idx in torch.randperm(args.rows, device=device).split(args.batch_size):
                yield on_device[0][idx], on_device[1][idx]

    out = {}
    for kind in BASELINES:
        torch.manual_seed(0)
        model = build_model(spec()).to(device)
        optimizer, loss_fn = torch.optim.Adam(model.parameters(), lr=1e-3), torch.nn.CrossEntropyLoss()
        ends = []
        for _ in range(args.epochs):
            model.train()
            for xb, yb in batches(kind):
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = loss_fn(model(xb), yb)
                loss.backward()
                optimizer.step()
            synchronize(device)
            ends.append(time.perf_counter())
        epoch_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        out[kind] = round(args.rows * len(epoch_s) / sum(epoch_s), 1)
    return out


def measure_ray_train(args, gpu: bool) -> list[dict]:
    """Part 2: each of PATHS through Ray Train on one worker, then plain PyTorch."""
    import ray
    import torch

    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-gpu-"))
    try:
        workers_import_here()
        os.environ[EPOCH_LOG] = str(work / "epochs.jsonl")  # the workers inherit it
        start_ray(num_cpus=max(2, os.cpu_count() or 2), **({} if gpu else {"num_gpus": 0}))
        write_prepared(work, args.rows)
        runs = [
            {"path": path, "baseline": baseline, **run_ray_train(args, work, in_memory, loop, gpu)}
            for path, in_memory, loop, baseline in PATHS
        ]
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not gpu:
        torch.set_num_threads(1)  # what a worker of one CPU gets
    plain = plain_torch(args, "cuda" if gpu else "cpu")
    for run in runs:
        run["baseline_images_per_s"] = plain[run["baseline"]]
        run["ratio"] = ratio(run["images_per_s"], run["baseline_images_per_s"])
    return runs


def markdown(args, loop: dict, runs: list[dict], device: str) -> str:
    title = "## GPU: trainflow's cnn at 3x32x32 in bf16"
    if args.cpu_check:
        title += " (CPU check: the script's paths on the CPU, no GPU figures)"
    elif args.quick:
        title += " (quick run)"
    rows = [
        f"| {r['path']} | {r['device']} | {r['backend']} | {r['images_per_s']:,.0f} "
        f"| {BASELINES[r['baseline']]}: {r['baseline_images_per_s']:,.0f} | **{r['ratio']:.2f}x** |"
        for r in runs
    ]
    return "\n".join(
        [
            title,
            "",
            f"{device}; trainflow's cnn (`model.kind: cnn`, image_shape [3, 32, 32], channels "
            f"{loop['model']['channels']}, hidden {loop['model']['hidden_sizes']}, 10 classes).",
            "",
            f"The loop alone: batch {loop['batch_size']} of synthetic images held on the device, SGD, "
            f"{loop['steps']} timed steps after {args.warmup} warm-up steps. trainflow's `train_epoch` with "
            f"`Precision('bf16-mixed')`: {loop['trainflow_images_per_s']:,.0f} images/s; the same step "
            f"under `torch.autocast(dtype=torch.bfloat16)`: {loop['plain_images_per_s']:,.0f}; "
            f"**{loop['ratio']:.2f}x**.",
            "",
            f"The Ray Train path: one worker, `build_trainer` on prepared Parquet splits of {args.rows:,} "
            f"synthetic images, batch {args.batch_size}, Adam, `train.precision: bf16-mixed`, "
            f"{args.epochs} epochs of which the first (start-up) is left out; plain PyTorch in one "
            "process on the same device.",
            "",
            "| run | worker's device | process group | images/s | plain PyTorch images/s | ratio |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )


def transformer_markdown(out: dict) -> str:
    return (
        f"\n\nA transformer (`model.kind: hf:`): a BERT of width {out['width']} and {out['layers']} layers, "
        f"batch {out['batch_size']} of {out['tokens']} tokens held on the device, AdamW, "
        f"{out['steps']} timed steps. `train.precision: auto` ran `{out['precision']}`. trainflow's "
        f"`train_epoch`: {out['trainflow_texts_per_s']:,.0f} texts/s; the same transformers model in "
        f"a plain step under the same autocast: {out['plain_texts_per_s']:,.0f}; **{out['ratio']:.2f}x**.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--text-batch-size", type=int, default=64, help="texts per batch in part 3")
    parser.add_argument("--rows", type=int, default=20_000, help="images in the Ray Train path's train split")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="10 timed steps; 4,000 images, 3 epochs")
    parser.add_argument(
        "--cpu-check", action="store_true", help="every path on the CPU, tiny (no GPU figures)"
    )
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick or args.cpu_check:
        args.steps, args.warmup, args.rows, args.epochs = 10, 3, 4_000, 3
    if args.cpu_check:
        args.steps, args.batch_size, args.rows, args.epochs = 3, 16, 64, 2
        args.text_batch_size = 8
    reason = None if args.cpu_check else skipped_reason()
    if reason:
        figures = {"quick": args.quick, "skipped": True, "reason": reason}
        md = f"## GPU: trainflow's cnn at 3x32x32 in bf16\n\nSkipped: {reason}.\n"
    else:
        import torch

        device = "CPU (check)" if args.cpu_check else torch.cuda.get_device_name(0)
        device_name = "cpu" if args.cpu_check else "cuda"
        loop = measure_loop(device_name, args.steps, args.warmup, args.batch_size)
        transformer = measure_transformer(device_name, args.steps, args.warmup, args.text_batch_size)
        runs = measure_ray_train(args, gpu=not args.cpu_check)
        figures = {
            "quick": args.quick or args.cpu_check,
            "cpu_check": args.cpu_check,
            "skipped": False,
            "device": device,
            "loop": loop,
            "transformer": transformer,
            "ray_train": {
                "rows": args.rows,
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "runs": runs,
            },
        }
        md = markdown(args, loop, runs, device) + transformer_markdown(transformer)
    path = write_section("gpu", figures, md, args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
