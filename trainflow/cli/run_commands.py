"""``trainflow validate | run | sweep | predict``: a config checked, trained or swept, and a
registered model's batch predictions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.root import (
    ConfigArg,
    ResumeOpt,
    SetOpt,
    SmokeOpt,
    app,
    one_line_errors,
    read_config,
    render,
    runtime_errors,
)


@app.command()
def validate(config: ConfigArg = None, set_: SetOpt = None) -> None:
    """Check a config, its model and data, without Ray or Prefect.

    It reads the config, imports the model and inspects the data source; nothing starts.
    """
    from trainflow import run_checks

    cfg = read_config(config, set_)
    with one_line_errors():
        run_checks.model_kind(cfg)
        info = run_checks.source(cfg)
        run_checks.model_fits(cfg, info)
    typer.echo(f"ok: {cfg.name} (config hash {cfg.config_hash()}), source {cfg.data.source}")
    if info.missing_labels:
        rows = f"{info.missing_labels} row{'s' if info.missing_labels > 1 else ''}"
        typer.echo(f"note: {rows} without a label are dropped (data.missing=drop)")


@app.command()
def run(
    config: ConfigArg = None, set_: SetOpt = None, smoke: SmokeOpt = False, resume: ResumeOpt = False
) -> None:
    """Run the training pipeline flow and print a summary."""
    from trainflow import run_checks
    from trainflow.runtime import Command
    from trainflow.timeline import started, timeline

    timeline("command parsed")
    cfg = read_config(config, set_, smoke)
    command = Command(
        "training-pipeline",
        f"{cfg.name}-{cfg.config_hash()[:8]}",
        imports="trainflow.flows.training",
        cluster=cfg,
        config=cfg.model_dump(mode="json"),
    )
    with runtime_errors(), command:
        checked = command.check(lambda: run_checks.before_run(cfg, resume=resume))

        def train():
            from trainflow.flows.training import training_pipeline  # imported by the start-up

            return training_pipeline(config=cfg, resume=resume, checked=checked)

        result = command.call(train, warm=checked.warm)
    typer.echo("\n".join(["", *render().summary_lines(result, wall_s=time.monotonic() - started())]))


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="A YAML or JSON config with a sweep section.")],
    set_: SetOpt = None,
    best_config: Annotated[
        Path | None, typer.Option("--best-config", help="Also write the best trial's config here (YAML).")
    ] = None,
) -> None:
    """Sweep settings on Ray Tune and register the best trial's model."""
    from trainflow import run_checks
    from trainflow.runtime import Command

    cfg = read_config(config, set_)
    command = Command(
        "sweep-pipeline",
        f"{cfg.name}-sweep-{cfg.config_hash()[:8]}",
        imports="trainflow.flows.sweep",
        cluster=cfg,
        torch_processes=cfg.sweep.trials if cfg.sweep else 0,
        config=cfg.model_dump(mode="json"),
    )
    with runtime_errors(), command:
        checked = command.check(lambda: run_checks.before_run(cfg, sweep=True))

        def run_sweep():
            from trainflow.flows.sweep import sweep_pipeline  # imported by the start-up

            return sweep_pipeline(config=cfg, checked=checked)

        result = command.call(run_sweep, warm=checked.warm)
    if best_config is not None:
        import shutil

        from trainflow.files import replacing_file

        with replacing_file(best_config) as tmp:
            shutil.copyfile(result.best_config_path, tmp)
    typer.echo("\n".join(["", *render().sweep_lines(result, cfg.sweep.metric, best_config)]))


@app.command()
def predict(
    model: Annotated[str, typer.Argument(help="NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")],
    input: Annotated[Path, typer.Argument(help="A Parquet or CSV file, or a folder of them")],
    output: Annotated[Path, typer.Argument(help="A new folder for the Parquet predictions")],
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per batch.")] = 1024,
    concurrency: Annotated[int, typer.Option(min=1, help="Actors, each holding the model once.")] = 1,
    gpu: Annotated[bool, typer.Option("--gpu", help="One GPU per actor.")] = False,
) -> None:
    """Predict INPUT with a registered model; write Parquet to OUTPUT."""
    from trainflow import run_checks
    from trainflow.config import PipelineConfig
    from trainflow.runtime import Command

    command = Command(
        "batch-predict",
        f"predict-{model}",
        imports="trainflow.flows.batch_predict",
        # A local cluster, or RAY_ADDRESS's; the modules of the model come with its checks.
        cluster=PipelineConfig(),
        torch_processes=concurrency,
        model=model,
        input=str(input),
        output=str(output),
    )
    with runtime_errors(), command:
        # The model (pinned to its version), input, output and cluster, before Ray starts.
        checked = command.check(
            lambda: run_checks.before_predict(model, str(input), str(output), use_gpu=gpu)
        )
        ref = checked.model

        def run_predict():
            from trainflow.flows.batch_predict import batch_predict  # imported by the start-up

            return batch_predict(
                model=ref.uri,
                input=str(input),
                output=str(output),
                batch_size=batch_size,
                concurrency=concurrency,
                use_gpu=gpu,
                checked=checked,
            )

        result = command.call(run_predict, cluster=ref.cluster(), open_registry=False)
    typer.echo(render().predictions_line(ref.name, result.version, result.rows, str(output), result.seconds))
