"""``trainflow stack up | status | env | down``: a team's services on this machine
(:mod:`trainflow.stack`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.root import app, fail

stack_app = typer.Typer(
    help="Start, check and stop a team's services on this machine.\n\nPostgreSQL, an MLflow server, a "
    "Prefect server, a Ray cluster and a Prefect worker, on loopback.",
    no_args_is_help=True,
)
app.add_typer(stack_app, name="stack")


FolderOpt = Annotated[
    Path | None,
    typer.Option(
        "--folder",
        help="The stack's folder (its data, logs and state); default: TRAINFLOW_STACK, else "
        "~/.local/share/trainflow/stack.",
    ),
]


def _folder(folder: Path | None) -> Path:
    from trainflow.stack import default_folder

    return (folder or default_folder()).expanduser().resolve()


@stack_app.command("up")
def up(
    folder: FolderOpt = None,
    node_cpus: Annotated[
        float | None,
        typer.Option(
            min=0.5, help="The CPUs each of Ray's two nodes offers; default: half the machine's, at least 2."
        ),
    ] = None,
    deployments: Annotated[
        Path | None,
        typer.Option(
            help="The Prefect deployments to apply; default: deployments/prefect.yaml when it is here."
        ),
    ] = None,
    no_deployments: Annotated[bool, typer.Option("--no-deployments", help="Apply no deployments.")] = False,
) -> None:
    """Start the stack's services, wait until each answers, show them.

    A service already running is left as it is. The first start makes the folder,
    PostgreSQL's databases, Ray's token and, once per machine, MLflow's server environment
    (a minute or two); later starts reuse them.
    """
    from trainflow.stack import StackError
    from trainflow.stack import up as stack_up

    if deployments is None and not no_deployments and Path("deployments/prefect.yaml").is_file():
        deployments = Path("deployments/prefect.yaml")
    if deployments is not None and not deployments.is_file():
        raise fail(f"--deployments {deployments}: no such file")
    try:
        chosen = None if no_deployments else deployments
        stack_up(_folder(folder), node_cpus=node_cpus, deployments=chosen, say=typer.echo)
    except StackError as e:
        raise fail(str(e), code=1) from None
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
        raise typer.Exit(130) from None
    _show(_folder(folder))
    typer.echo('Use it from a shell: eval "$(trainflow stack env)"')


@stack_app.command("status")
def status(folder: FolderOpt = None) -> None:
    """Show each service's address and whether it answers.

    The exit code is 1 when one does not."""
    if not _show(_folder(folder)):
        raise typer.Exit(1)


def _show(folder: Path) -> bool:
    from trainflow.stack import StackError
    from trainflow.stack import status as stack_status

    try:
        services = stack_status(folder)
    except StackError as e:
        raise fail(str(e)) from None
    typer.echo(f"stack: {folder}")
    for s in services:
        state = "up" if s.healthy else "DOWN"
        typer.echo(f"  {s.name:<9} {state:<5} {s.url}" + (f"  ({s.detail})" if s.detail else ""))
    return all(s.healthy for s in services)


@stack_app.command("env")
def env(folder: FolderOpt = None) -> None:
    """Print the exports that point a shell at the stack's services.

    They point trainflow, MLflow, Prefect and Ray there. Use them as `eval "$(trainflow stack env)"`."""
    from trainflow.stack import StackError, env_lines

    try:
        typer.echo("\n".join(env_lines(_folder(folder))))
    except StackError as e:
        raise fail(str(e)) from None


@stack_app.command("down")
def down(
    folder: FolderOpt = None,
    delete: Annotated[
        bool, typer.Option("--delete", help="Also delete the stack's data: registry, runs, artifacts.")
    ] = False,
) -> None:
    """Stop the stack's services; the data stays for the next up.

    What the services left running stops too."""
    from trainflow.stack import StackError
    from trainflow.stack import down as stack_down

    try:
        stack_down(_folder(folder), delete=delete, say=typer.echo)
    except StackError as e:
        raise fail(str(e), code=1) from None
    if not delete:  # with --delete, the last line says what was deleted
        typer.echo("stack stopped; its data stays for the next trainflow stack up")


@app.command("up")
def warm_up(
    idle_minutes: Annotated[
        float,
        typer.Option(min=0.05, help="Stop the services once no command has used them this long."),
    ] = 30.0,
) -> None:
    """Keep Ray and a Prefect server running for this workspace's runs.

    A local Ray cluster and a Prefect server, in the background: `trainflow run`, `sweep`
    and `predict` started with the same TRAINFLOW_HOME use them instead of starting their
    own, and start in a fork of a process that has done their imports. `trainflow down`
    stops them."""
    from trainflow.stack import StackError, warm
    from trainflow.workspace import workspace

    home = workspace().home
    try:
        services = warm.up(home, idle_minutes, say=typer.echo)
    except StackError as e:
        raise fail(str(e), code=1) from None
    typer.echo(f"Ray       {services.ray_address}")
    typer.echo(f"Prefect   {services.prefect_api.removesuffix('/api')}")
    typer.echo(f"for the commands of {home}, until `trainflow down` or {idle_minutes:g} idle minutes")


@app.command("down")
def warm_down() -> None:
    """Stop what `trainflow up` started for this workspace."""
    from trainflow.stack import warm
    from trainflow.workspace import workspace

    home = workspace().home
    typer.echo("stopped" if warm.down(home) else f"nothing was up for {home}")
