"""The ``trainflow`` command's Typer app and what its commands share: the options, one-line
errors, and calling a flow once its start-up is ready."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from trainflow.config import ConfigError, PipelineConfig, RenamedKey, load_config, smoke_config

# Plain help, as the documentation's command reference prints it: Typer's Rich panels
# show every flag, --help too, as taking a <bool>.
app = typer.Typer(
    help="Train, evaluate and register PyTorch models on Ray, orchestrated by Prefect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        from trainflow.version import __version__

        typer.echo(f"trainflow {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """The options before any command."""


models_app = typer.Typer(
    help="List, show, promote, roll back and serve registered models.", no_args_is_help=True
)
app.add_typer(models_app, name="models")


ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="A YAML or JSON config; none runs the bundled digits job (configs/digits.yaml)."),
]


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a field: --set train.lr=0.01 (repeatable)."),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


SmokeOpt = Annotated[
    bool,
    typer.Option(
        "--smoke",
        help="A quick end-to-end check of the config: a data sample, one epoch, one worker, "
        "registered as NAME-smoke.",
    ),
]


def read_config(config: Path | None, overrides: list[str] | None, smoke: bool = False) -> PipelineConfig:
    """``config`` with ``overrides`` validated; a key spelled by its old name is one line
    of warning, once, and any other warning is shown as Python shows it."""
    shown = warnings.showwarning
    said: set[str] = set()

    def one_line(message, category, *args, **kwargs) -> None:
        if not issubclass(category, RenamedKey):
            shown(message, category, *args, **kwargs)
        elif str(message) not in said:
            said.add(str(message))
            typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", RenamedKey)
            warnings.showwarning = one_line
            cfg = load_config(config, overrides or [])
        return smoke_config(cfg) if smoke else cfg
    except ConfigError as e:
        raise fail(str(e)) from None


ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the latest unfinished training of this config and data (its process died, "
        "or it failed) from its latest checkpoint; without one, start a new training.",
    ),
]


def render():
    from trainflow.tasks import render

    return render


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A check that failed (bad config or data, a cluster too small or out of reach): the
    user fixes it from its message, printed as one line, exit code 2."""
    from trainflow.cluster.checks import PreflightError
    from trainflow.pipelines.data.schema import DataError

    try:
        yield
    except (ConfigError, DataError, PreflightError) as e:
        raise fail(str(e)) from None


@contextmanager
def runtime_errors() -> Iterator[None]:
    """A command's runtime (``runtime.Command``) ended early: its one line, its exit code."""
    from trainflow.runtime import Ended

    try:
        yield
    except Ended as e:
        if e.error:
            raise fail(e.line, e.code) from None
        typer.echo(e.line, err=True)
        raise typer.Exit(e.code) from None
