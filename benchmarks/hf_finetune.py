"""A Hugging Face fine-tune through trainflow's loop against a plain PyTorch loop.

A BERT of width 256 and 4 layers (random weights, saved with ``save_pretrained`` as a hub
download is) fine-tuned to tell short texts apart by their label, tokenized to 64 tokens:
trainflow's ``run_training`` (``model.kind: hf:``, the splits prepared with
``preprocess.tokenizer``) on one Ray Train worker of 1 CPU, against the same model,
AdamW, batches and rows in one plain process with the worker's torch threads and
niceness. Both train, validate and write a checkpoint every epoch; the first epoch
(start-up, warm-up) is left out. Alternating rounds, each side a fresh process.

    python benchmarks/hf_finetune.py            # 2,000 texts, 3 epochs, 2 rounds
    python benchmarks/hf_finetune.py --quick    # 400 texts, 2 epochs, 1 round

Writes benchmarks/results/hf_finetune.json and hf_finetune.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import EPOCH_LOG, add_results_arg, median, ratio, start_ray, workers_import_here, write_section
from hf_models import make_tokenizer, write_texts

TARGET = 0.9  # trainflow's samples/s at least 0.9x the plain loop's
MAX_LENGTH, WIDTH, LAYERS = 64, 256, 4
SPLIT = {"val": 0.1, "test": 0.1}


def make_model(folder: Path) -> Path:
    """The tokenizer of the texts and a BERT of WIDTH and LAYERS on its vocabulary."""
    folder = make_tokenizer(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    save_bert(folder, vocab, WIDTH, LAYERS, positions=MAX_LENGTH + 2)
    return folder


def save_bert(folder: Path, vocab: int, width: int, layers: int, positions: int) -> None:
    """A BERT of ``width`` and ``layers`` (heads of 64), random weights seeded 0, written
    with ``save_pretrained`` as a hub download is."""
    import torch
    from transformers import BertConfig, BertModel

    from trainflow.pipelines.hf_hub import quiet

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        intermediate_size=width * 4,
        max_position_embeddings=positions,
    )
    with quiet():
        BertModel(config).save_pretrained(folder)


def config(args, source: Path, model: Path):
    from trainflow.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "name": "bench-hf",
            "data": {"source": str(source), "label_column": "library", "split": SPLIT},
            "preprocess": {"tokenizer": {"column": "text", "max_length": MAX_LENGTH}},
            "model": {"kind": f"hf:{model}"},
            "train": {
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "optimizer": "adamw",
                "lr": args.lr,
                "callbacks": ["common:epoch_done"],
            },
            "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": 1}},
            "checkpoint": {"keep": 1},
            "failure": {"max_failures": 0},
        }
    )


def prepare_texts(cfg, work: Path):
    """The texts prepared by trainflow's engine; their PreparedSplits and row counts."""
    from trainflow.pipelines.data.prepare import prepare
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.pipelines.data.tokenizer import transform_of
    from trainflow.pipelines.training.settings import PreparedSplits

    info = inspect_source(cfg.data, work / "cache", transform=transform_of(cfg))
    entry = prepare(info, cfg.data.split, cfg.preprocess, work / "cache")
    pre = entry.preprocessor
    return PreparedSplits(str(entry.path), pre.to_dict(), pre.num_features, pre.num_outputs), entry.counts


def run_trainflow(cfg, work: Path, prepared, train_rows: int) -> dict:
    """One ``run_training`` call, as the train task makes it; epoch ends from the worker's log."""
    from trainflow.pipelines.training.run import run_training

    log = Path(os.environ[EPOCH_LOG])
    seen = len(log.read_text().splitlines()) if log.exists() else 0
    rows: list[dict] = []
    start = time.time()
    run_training(
        cfg, prepared, run_name=f"bench-hf-{time.time_ns()}", storage=str(work / "runs"), on_row=rows.append
    )
    logged = [json.loads(line) for line in log.read_text().splitlines()[seen:] if '"rank": 0' in line]
    ends, cpu = [r["time"] for r in logged], [r["cpu"] for r in logged]
    epoch_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    epoch_cpu_s = [b - a for a, b in zip(cpu, cpu[1:], strict=False)]
    (plan,) = [r for r in rows if r["kind"] == "plan"]
    return {
        "threads": logged[0]["threads"],
        "nice": logged[0]["nice"],
        "in_memory": plan["in_memory"],
        "parameters": plan["parameters"],
        "epoch_s": [round(s, 2) for s in epoch_s],
        "samples_per_s": round(train_rows * len(epoch_s) / sum(epoch_s), 1),
        "samples_per_cpu_s": round(train_rows * len(epoch_cpu_s) / sum(epoch_cpu_s), 1),
        "startup_s": round(ends[0] - start - median(epoch_s), 1),
    }


def plain_torch(path: str, model: str, epochs: int, batch: int, lr: float, threads: int, nice: int, out: str):
    """What a PyTorch user writes for the same job: the pretrained model with a head for
    the classes, the prepared rows as tensors, a shuffled loop with AdamW, validation and a
    checkpoint every epoch."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from trainflow.pipelines.training.inputs import read_shard

    os.nice(nice - os.nice(0))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x, y = read_shard(f"{path}/train", 0, 1, equal=False)
    xv, yv = read_shard(f"{path}/val", 0, 1, equal=False)
    classes = len(json.loads((Path(path) / "preprocessor.json").read_text())["classes"])
    net = AutoModelForSequenceClassification.from_pretrained(model, num_labels=classes)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    ends, cpu = [], []
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(y)).split(batch):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(**{k: v[idx] for k, v in x.items()}).logits, y[idx])
            loss.backward()
            optimizer.step()
        net.eval()
        with torch.no_grad():
            for i in range(0, len(yv), batch):
                net(**{k: v[i : i + batch] for k, v in xv.items()}).logits.argmax(1)
        torch.save(
            {"model": net.state_dict(), "optimizer": optimizer.state_dict()}, Path(out) / "checkpoint.pt"
        )
        ends.append(time.perf_counter())
        cpu.append(time.process_time())
    epoch_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    epoch_cpu_s = [b - a for a, b in zip(cpu, cpu[1:], strict=False)]
    return {
        "threads": torch.get_num_threads(),
        "nice": os.nice(0),
        "parameters": sum(p.numel() for p in net.parameters()),
        "epoch_s": [round(s, 2) for s in epoch_s],
        "samples_per_s": round(len(y) * len(epoch_s) / sum(epoch_s), 1),
        "samples_per_cpu_s": round(len(y) * len(epoch_cpu_s) / sum(epoch_cpu_s), 1),
    }


def run_plain(prepared, model: Path, args, worker: dict, work: Path) -> dict:
    """The plain loop in a fresh process, with the trainflow worker's threads and niceness."""
    out = Path(tempfile.mkdtemp(prefix="plain-", dir=work))
    cmd = [sys.executable, __file__, "--plain", prepared.path, str(model), str(args.epochs)]
    cmd += [str(args.batch_size), str(args.lr), str(worker["threads"]), str(worker["nice"]), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(worker["threads"])}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        sys.exit(f"plain PyTorch failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(figures: dict, args) -> str:
    t, p, counts = figures["trainflow"], figures["plain"], figures["counts"]
    return "\n".join(
        [
            f"## A Hugging Face fine-tune{' (quick run)' if args.quick else ''}",
            "",
            f"A BERT of width {WIDTH} and {LAYERS} layers ({t['parameters']}, random weights saved "
            f"with `save_pretrained`), {figures['classes']} classes, on {args.rows:,} short texts "
            f"tokenized to {MAX_LENGTH} tokens by trainflow's preparation ({counts['train']:,} train, "
            f"{counts['val']:,} val rows); batch {args.batch_size}, AdamW at lr {args.lr:g}, "
            f"{args.epochs} epochs, the first left out. trainflow: `run_training` with `model.kind: "
            f"hf:` on one TorchTrainer worker of 1 CPU, torch threads {t['threads']}, splits "
            f"{', '.join(t['in_memory']) or 'none'} in memory; plain PyTorch: "
            "`AutoModelForSequenceClassification` of the same folder, the same rows as tensors, in "
            f"one process with {p['threads']} torch thread(s) at the worker's niceness ({p['nice']}). "
            "Both train, validate and write a checkpoint every epoch. Medians of "
            f"{len(figures['rounds'])} alternating round(s).",
            "",
            "| | samples/s | samples per CPU-second |",
            "|---|---|---|",
            f"| trainflow | {t['samples_per_s']:,.1f} | {t['samples_per_cpu_s']:,.1f} |",
            f"| plain PyTorch | {p['samples_per_s']:,.1f} | {p['samples_per_cpu_s']:,.1f} |",
            "",
            f"trainflow / plain: **{figures['ratio']:.2f}x** the samples/s (target at least {TARGET}x: "
            f"**{'met' if figures['met'] else 'missed'}**), {figures['cpu_ratio']:.2f}x the samples per "
            f"CPU-second; trainflow's start-up (the call to the end of epoch 1, less a steady epoch): "
            f"{t['startup_s']:.1f} s.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--epochs", type=int, default=3, help="at least 2: the first is left out")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="400 texts, 2 epochs, one round")
    parser.add_argument("--plain", nargs=8, help=argparse.SUPPRESS)
    add_results_arg(parser)
    args = parser.parse_args()
    if args.plain:
        path, model, epochs, batch, lr, threads, nice, out = args.plain
        print(
            json.dumps(
                plain_torch(path, model, int(epochs), int(batch), float(lr), int(threads), int(nice), out)
            )
        )
        return
    if args.quick:
        args.rows, args.epochs, args.rounds = 400, 2, 1
    if args.epochs < 2 or args.rows < 100:
        parser.error("--epochs must be at least 2 (the first is left out), --rows at least 100")

    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-hf-finetune-"))
    try:
        workers_import_here()
        os.environ[EPOCH_LOG] = str(work / "epochs.jsonl")  # the workers inherit it
        start_ray(num_cpus=2)
        source, model = write_texts(work / "input", args.rows), make_model(work / "model")
        cfg = config(args, source, model)
        prepared, counts = prepare_texts(cfg, work)
        rounds = []
        for i in range(args.rounds):
            if i % 2 == 0:  # alternating which goes first
                t = run_trainflow(cfg, work, prepared, counts["train"])
                p = run_plain(prepared, model, args, t, work)
            else:
                p = run_plain(prepared, model, args, rounds[0]["trainflow"], work)
                t = run_trainflow(cfg, work, prepared, counts["train"])
            print(f"round {i + 1}: trainflow {t}\n         plain {p}", flush=True)
            rounds.append({"trainflow": t, "plain": p})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    trainflow, plain = {**rounds[0]["trainflow"]}, {**rounds[0]["plain"]}
    for key in ("samples_per_s", "samples_per_cpu_s", "startup_s"):
        trainflow[key] = median([r["trainflow"][key] for r in rounds])
    for key in ("samples_per_s", "samples_per_cpu_s"):
        plain[key] = median([r["plain"][key] for r in rounds])
    if f"{plain['parameters']:,} of" not in trainflow["parameters"]:
        theirs = trainflow["parameters"]
        sys.exit(f"plain PyTorch's model has {plain['parameters']:,} parameters, trainflow's {theirs}")
    figures = {
        "quick": args.quick,
        "rows": args.rows,
        "counts": counts,
        "classes": prepared.num_outputs,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "trainflow": trainflow,
        "plain": plain,
        "rounds": rounds,
        "ratio": ratio(trainflow["samples_per_s"], plain["samples_per_s"]),
        "cpu_ratio": ratio(trainflow["samples_per_cpu_s"], plain["samples_per_cpu_s"]),
        "target": {"trainflow_vs_plain_samples_per_s_at_least": TARGET},
    }
    figures["met"] = figures["ratio"] is not None and figures["ratio"] >= TARGET
    path = write_section("hf_finetune", figures, markdown(figures, args), args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
