"""The ``trainflow`` command's Typer app and what its commands share: the options, one-line
errors, and calling a flow once its start-up is ready."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from trainflow.config import ConfigError, PipelineConfig, RenamedKey, load_config, smoke_config

T = TypeVar("T")


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
def one_line_errors(failed: Callable[[str], None] = lambda message: None) -> Iterator[None]:
    """A check that failed (bad config or data, a cluster too small or out of reach): the
    user fixes it from its message, printed as one line, exit code 2; ``failed`` is told
    the message first."""
    from trainflow.cluster.checks import PreflightError
    from trainflow.pipelines.data.schema import DataError

    try:
        yield
    except (ConfigError, DataError, PreflightError) as e:
        failed(str(e))
        raise fail(str(e)) from None


def check_before_start(check: Callable[[], T], flow: str | None = None, run: str = "", **parameters) -> T:
    """What a run's checks found, before Ray and the flow start; a failed check (bad config
    or data, a cluster too small or out of reach) ends the command in its one line, and
    shows as a failed run ``run`` of the flow ``flow`` (with ``parameters``) on a Prefect
    server the environment names."""
    from trainflow.prefect_server import record_failed_run
    from trainflow.signals import raise_if_interrupted

    def failed(message: str) -> None:
        if flow is not None:
            record_failed_run(flow, run, message, parameters)

    try:
        with one_line_errors(failed):
            found = check()
        raise_if_interrupted()
    except KeyboardInterrupt as e:
        raise stopped(e) from None
    return found


def call_flow(what: str, starting: AbstractContextManager, call: Callable[[], T]) -> T:
    """``call()`` a flow once ``starting`` (a ``startup.started``) is ready. An expected
    failure (see ``tasks.logs``) ends in its one line, exit code 2; any other in one line
    naming the flow, exit code 1 (the flow's logs above hold the traceback)."""
    from trainflow import prefect_server
    from trainflow.signals import sigint_stops_the_run
    from trainflow.timeline import timeline

    try:
        # Ctrl-C ends the run in one line (stopped), wherever it lands.
        with sigint_stops_the_run(), starting:
            from trainflow.tasks.logs import drop_expected_errors_on_console

            # On the console, a flow's expected failure is this command's one ``error:``
            # line: Prefect's own records of it stay in the run's logs, one line each.
            drop_expected_errors_on_console()
            result = call()
            timeline("flow returned")
    except prefect_server.PrefectServerError as e:
        raise fail(str(e), code=1) from None
    except (KeyboardInterrupt, SystemExit) as e:
        raise stopped(e) from None
    except Exception as e:
        from trainflow.tasks.logs import EXPECTED_ERRORS

        if isinstance(e, EXPECTED_ERRORS):
            raise fail(str(e)) from None
        raise fail(f"the {what} flow failed: {type(e).__name__}: {e}", code=1) from None
    return result


def stopped(e: KeyboardInterrupt | SystemExit) -> typer.Exit:
    """A run stopped by Ctrl-C or a stop signal (``signals.stop_on_signals``): one line,
    the shell's exit code for the signal. Prefect's records of the crash stay in the
    run's logs (the flow run ends Crashed) and off this console (``tasks.logs``)."""
    import signal

    code = 128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.code
    try:
        stop = signal.Signals(code - 128)
    except (TypeError, ValueError):  # sys.exit() inside the flow, not a signal
        return fail(f"the flow ended with sys.exit({code!r})", code=1)
    typer.echo(f"stopped ({stop.name})", err=True)
    return typer.Exit(code)
