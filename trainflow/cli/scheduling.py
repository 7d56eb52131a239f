"""``trainflow schedule | deploy``: the training flow on a schedule, from this process or as
the deployments of ``deployments/prefect.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.root import SetOpt, SmokeOpt, app, fail, read_config


def _require_server(command: str) -> None:
    """Schedules and deployments live on a Prefect server; the temporary one refuses them."""
    import os

    if not os.environ.get("PREFECT_API_URL"):
        raise fail(
            f"{command} needs a Prefect server: run `prefect server start` and "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )


ScheduleConfigArg = Annotated[
    str, typer.Argument(help="The config the scheduled runs use, a path relative to where they run.")
]


NameOpt = Annotated[str, typer.Option(help="The deployment's name.")]


CronOpt = Annotated[str | None, typer.Option(help="A cron schedule, such as '0 2 * * *'.")]


IntervalOpt = Annotated[int | None, typer.Option(help="Seconds between runs.")]


@app.command()
def schedule(
    config: ScheduleConfigArg = "configs/digits.yaml",
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    name: NameOpt = "scheduled",
    cron: CronOpt = None,
    interval: IntervalOpt = None,
) -> None:
    """Run the training flow on a schedule from this process.

    No work pool is needed. Needs a Prefect server (PREFECT_API_URL); runs go on until you
    stop this command.
    """
    read_config(Path(config), set_, smoke)  # refuse a bad config now, not at the first scheduled run
    _require_server("schedule")
    if (cron is None) == (interval is None):
        raise fail("give one schedule: --cron '0 2 * * *' or --interval SECONDS")

    from trainflow.cluster.quiet import apply_quiet_env
    from trainflow.flows.training import training_pipeline

    apply_quiet_env()
    training_pipeline.serve(
        name=name,
        cron=cron,
        interval=interval,
        parameters={"config": config, "overrides": set_ or [], "smoke": smoke},
        limit=1,
    )


@app.command(hidden=True)
def serve(
    config: ScheduleConfigArg = "configs/digits.yaml",
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    name: NameOpt = "served",
    cron: CronOpt = None,
    interval: IntervalOpt = None,
) -> None:
    """The former name of `trainflow schedule`; it goes in the next release."""
    typer.echo("trainflow serve is now trainflow schedule; serve goes in the next release", err=True)
    schedule(config, set_, smoke, name, cron, interval)


@app.command()
def deploy(
    prefect_file: Annotated[Path, typer.Option(help="The deployments to create.")] = Path(
        "deployments/prefect.yaml"
    ),
) -> None:
    """Create or update the deployments of deployments/prefect.yaml.

    Every deployment in it, from this checkout: the same as `prefect deploy --all
    --prefect-file deployments/prefect.yaml` with TRAINFLOW_CHECKOUT (this folder),
    TRAINFLOW_GIT_URL (origin, else this folder) and TRAINFLOW_HOME (default ./.trainflow)
    set for the deployments' pull steps and runs.
    """
    import subprocess

    from trainflow.stack.control import deploy_command, deploy_env

    if not prefect_file.is_file():
        raise fail(f"{prefect_file}: no such file; run trainflow deploy from the trainflow checkout")
    _require_server("deploy")
    raise typer.Exit(subprocess.run(deploy_command(prefect_file), env=deploy_env(Path.cwd())).returncode)
