"""Each epoch's checkpoint, as the loop saves it in its caller's process (a sweep's trial,
``scaling.num_workers: 0``), against what a PyTorch user writes at the end of each epoch,
with the run's history ever longer.

trainflow's figure is ``trainflow.pipelines.training.loop.report_epoch`` for a run of a
small regression MLP (scikit-learn's diabetes shape: 10 features, 16 hidden units, SGD with
momentum): the model, its spec, preprocessor, config and metrics with the whole history,
the train state, written under a temporary name and renamed, the best ``checkpoint.keep``
and the latest kept. The baseline is one ``torch.save`` of the model's and optimizer's
state, the epoch and the history to a temporary file, then renamed. Each figure is the
median of ``--saves`` saves after the history reached its length.

    python benchmarks/epoch_save.py             # histories of 20, 200 and 1000 epochs
    python benchmarks/epoch_save.py --quick     # 20 and 200, fewer saves

Writes benchmarks/results/epoch_save.json and epoch_save.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import types
from pathlib import Path

import torch
from common import add_results_arg, median, ratio, write_section
from torch import nn

from trainflow.config import load_config
from trainflow.pipelines.models.build import initial_model, model_spec
from trainflow.pipelines.training.loop import TrainingParts, report_epoch
from trainflow.pipelines.training.optim import Precision, make_optimizer, make_scheduler

CONFIG = Path(__file__).resolve().parent / "configs" / "diabetes-many.yaml"
FEATURES = 10


def epoch_row(epoch: int) -> dict[str, float]:
    return {
        "epoch": epoch,
        "train_loss": 1.0 / epoch,
        "val_loss": 1.0 / epoch + 0.01 * (epoch % 7),
        "lr": 0.01,
    }


def trainflow_saves(history_len: int, saves: int, folder: Path) -> tuple[list[float], dict]:
    """Seconds of each of ``saves`` epochs' report_epoch, the last at ``history_len``; the
    checkpoints kept, and the epochs of history in the latest."""
    config = load_config(str(CONFIG))
    spec = model_spec(config.model, FEATURES, 1)
    model = initial_model(spec)
    optimizer = make_optimizer(
        config.train.optimizer, model.parameters(), config.train.lr, config.train.weight_decay, 0.9
    )
    parts = TrainingParts(
        device=torch.device("cpu"),
        model=model,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, config.train),
        precision=Precision("32", torch.device("cpu")),
        loss_fn=nn.MSELoss(),
        grad_clip_norm=None,
        classify=False,
        stopping=None,
    )
    _one_step(model, optimizer)
    preprocessor = {"features": [f"x{i}" for i in range(FEATURES)], "mean": [0.0] * FEATURES}
    settings = types.SimpleNamespace(  # what report_epoch reads of a run's TrainSettings
        own_folder=str(folder), model_spec=spec, preprocessor=preprocessor, config=config, to_tune=None
    )
    saved_config = config.model_dump(mode="json")
    history = [epoch_row(e) for e in range(1, history_len - saves + 1)]
    times = []
    for epoch in range(history_len - saves + 1, history_len + 1):
        metrics = epoch_row(epoch)
        history.append(metrics)
        start = time.perf_counter()
        report_epoch(metrics, history, parts, settings, saved_config, 0, None)
        times.append(time.perf_counter() - start)
    latest = folder / f"checkpoint_epoch_{history_len:06d}"
    saved = {
        "kept": sorted(p.name for p in folder.glob("checkpoint_epoch_*")),
        "latest_history": len(json.loads((latest / "metrics.json").read_text())["history"]),
    }
    return times, saved


def plain_saves(history_len: int, saves: int, folder: Path) -> list[float]:
    """Seconds of each of ``saves`` plain saves of the same model, optimizer and history."""
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    _one_step(model, optimizer)
    history = [epoch_row(e) for e in range(1, history_len - saves + 1)]
    times = []
    for epoch in range(history_len - saves + 1, history_len + 1):
        history.append(epoch_row(epoch))
        start = time.perf_counter()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save({**state, "history": history}, folder / "last.pt.tmp")
        os.replace(folder / "last.pt.tmp", folder / "last.pt")
        times.append(time.perf_counter() - start)
    return times


def _one_step(model: nn.Module, optimizer) -> None:
    """One update, so that the optimizer holds its momentum as it would after an epoch."""
    model(torch.randn(4, FEATURES)).sum().backward()
    optimizer.step()


def markdown(rows: list[dict], saves: int, note: str) -> str:
    lines = [
        "## Each epoch's checkpoint, as the history grows",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.2f}; `python benchmarks/epoch_save.py`. trainflow's loop saving an epoch's "
        "checkpoint in its caller's process (`report_epoch`: the model, spec, preprocessor, config, "
        "metrics with the whole history and train state, written under a temporary name and renamed, "
        "the best and the latest kept), against one `torch.save` of the model, optimizer, epoch and "
        f"history renamed into place; a small regression MLP; medians of {saves} saves.",
        "",
        "| epochs of history | trainflow ms | plain torch.save ms | trainflow / plain |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['history']} | {row['trainflow_ms']:.2f} | {row['plain_ms']:.2f} | {row['ratio']:.2f}x |"
        )
    first, last = rows[0], rows[-1]
    lines += [
        "",
        f"From {first['history']} to {last['history']} epochs of history, trainflow's save grows "
        f"{last['trainflow_ms'] / first['trainflow_ms']:.2f}x, the plain save "
        f"{last['plain_ms'] / first['plain_ms']:.2f}x.",
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="histories of 20 and 200 epochs, 10 saves each")
    parser.add_argument("--saves", type=int, default=None, help="saves measured per history length (20)")
    parser.add_argument("--note", default="", help="a line added under the table")
    add_results_arg(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = (20, 200) if args.quick else (20, 200, 1000)
    saves = args.saves or (10 if args.quick else 20)
    rows = []
    for length in lengths:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            times, saved = trainflow_saves(length, saves, Path(a))
            mine = median(times) * 1e3
            plain = median(plain_saves(length, saves, Path(b))) * 1e3
        rows.append(
            {"history": length, "trainflow_ms": mine, "plain_ms": plain, "ratio": ratio(mine, plain), **saved}
        )
        print(f"history {length}: trainflow {mine:.2f} ms, plain {plain:.2f} ms")
    figures = {"quick": args.quick, "saves": saves, "rows": rows}
    print(write_section("epoch_save", figures, markdown(rows, saves, args.note), args.results))


if __name__ == "__main__":
    main()
