"""GPU throughput: trainflow's own cnn (``model.kind: cnn``, ``image_shape: [3, 32, 32]``,
10 classes, the default channels and head) on 32x32 images in bf16, images/s.

Only a model trainflow builds is measured (``trainflow.pipelines.models.build``: mlp and cnn).
Runs when ``torch.cuda.is_available()``; otherwise records that the section was skipped
and why. Two loops over the same synthetic batches held on the GPU, on the same model:
trainflow's ``train_epoch`` with ``Precision("bf16-mixed")`` (what
``train.precision: bf16-mixed`` runs on each worker) and a plain PyTorch loop under
``torch.autocast(bfloat16)``.

    python benchmarks/gpu.py                 # 50 timed steps of batch 256 after 10 warm-up steps
    python benchmarks/gpu.py --quick         # 10 timed steps

Writes benchmarks/results/gpu.json and gpu.md.
"""

from __future__ import annotations

import argparse
import time

from common import add_results_arg, ratio, write_section


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

    return model_spec(ModelConfig(kind="cnn", image_shape=[3, 32, 32]), 3 * 32 * 32, 10)


def measure(steps: int, warmup: int, batch_size: int) -> dict:
    import torch

    from trainflow.pipelines.data.preprocess import FEATURES, LABEL
    from trainflow.pipelines.models.build import build_model
    from trainflow.pipelines.training.loop import Precision, train_epoch

    model_spec = spec()
    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(batch_size, 3 * 32 * 32, device=device)  # flat features, as trainflow feeds them
    y = torch.randint(0, 10, (batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def fresh():
        model = build_model(model_spec).to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def plain(n: int) -> None:
        model.train()
        for _ in range(n):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()

    def trainflow(n: int) -> None:
        train_epoch(model, ({FEATURES: x, LABEL: y} for _ in range(n)), optimizer, loss_fn, precision)

    out = {
        "device": torch.cuda.get_device_name(0),
        "model": model_spec,
        "batch_size": batch_size,
        "steps": steps,
    }
    precision = Precision("bf16-mixed", device)
    for name, loop in (("plain", plain), ("trainflow", trainflow)):
        model, optimizer = fresh()
        loop(warmup)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loop(steps)
        torch.cuda.synchronize()
        out[f"{name}_images_per_s"] = round(steps * batch_size / (time.perf_counter() - start), 1)
    out["ratio"] = ratio(out["trainflow_images_per_s"], out["plain_images_per_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="10 timed steps after 3 warm-up steps")
    add_results_arg(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 10, 3
    reason = skipped_reason()
    if reason:
        figures = {"quick": args.quick, "skipped": True, "reason": reason}
        md = f"## GPU: trainflow's cnn at 3x32x32 in bf16\n\nSkipped: {reason}.\n"
    else:
        m = measure(args.steps, args.warmup, args.batch_size)
        figures = {"quick": args.quick, "skipped": False, **m}
        md = "\n".join(
            [
                f"## GPU: trainflow's cnn at 3x32x32 in bf16{' (quick run)' if args.quick else ''}",
                "",
                f"{m['device']}; trainflow's cnn (`model.kind: cnn`, image_shape [3, 32, 32], channels "
                f"{m['model']['channels']}, hidden {m['model']['hidden_sizes']}, 10 classes), "
                f"batch {m['batch_size']} of synthetic "
                f"3x32x32 images held on the GPU, SGD, {m['steps']} timed steps after {args.warmup} warm-up "
                "steps. trainflow: `train_epoch` with `Precision('bf16-mixed')`; plain: the same step "
                "under `torch.autocast(dtype=torch.bfloat16)`.",
                "",
                "| loop | images/s |",
                "|---|---|",
                f"| plain PyTorch | {m['plain_images_per_s']:,.0f} |",
                f"| trainflow train_epoch | {m['trainflow_images_per_s']:,.0f} |",
                "",
                f"trainflow / plain: **{m['ratio']:.2f}x**.",
            ]
        )
    path = write_section("gpu", figures, md, args.results)
    print(path.read_text())


if __name__ == "__main__":
    main()
