"""The ``trainflow`` console script: every command, and an exit without the interpreter's
teardown. It imports the commands only once ``trainflow up``'s forkserver did not take the
command over (:func:`main`): a warm command's own process imports little more than Python's
standard library."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path


def commands():
    """The Typer app, every command added to it."""
    from trainflow.cli import models, run_commands, scheduling, stack, ui  # noqa: F401 - each adds its commands
    from trainflow.cli.root import app

    return app


def __getattr__(name: str):
    if name == "click_command":  # the command as Click sees it, for the documentation's command reference
        import typer

        return typer.main.get_command(commands())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _exit_without_teardown(code: int) -> None:
    """End the process as the interpreter would, less its teardown.

    Done here: wait for the threads that are not daemons, then run every exit hook (Ray's
    shutdown, Prefect's server stopped with its logs sent, logging's flush, the timeline's
    last mark). Skipped: freeing every module and object, which writes nothing and is the
    longest phase of a command's exit (benchmarks/results.md, overhead). Where this Python
    lacks those hooks, the process ends the usual way."""
    import atexit
    import os
    import threading

    wait_for_threads = getattr(threading, "_shutdown", None)
    run_exit_hooks = getattr(atexit, "_run_exitfuncs", None)
    if wait_for_threads is None or run_exit_hooks is None:
        return
    wait_for_threads()
    run_exit_hooks()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            pass
    os._exit(code)


def main() -> None:
    from trainflow.stack import forkserver
    from trainflow.timeline import started

    if sys.argv[1:2] == [forkserver.SERVE]:  # the forkserver of `trainflow up`
        commands()  # imported once, for every child
        forkserver.serve(Path(sys.argv[2]), command=_forked)
        return
    code = forkserver.forwarded(sys.argv, started())
    if code is not None:  # run by the forkserver, in a child that took this terminal
        raise SystemExit(code)
    if sys.argv[1:2] and sys.argv[1] in forkserver.COMMANDS:
        # No collection while the run's imports pile up objects: the start-up freezes them
        # and turns it back on once the flow is imported (runtime.collect_from_here).
        gc.disable()
    _run()


def _forked() -> None:
    """The command in a child of the forkserver, which imported Prefect before this
    command's environment and terminal were its own: its settings and console read again."""
    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import setup_logging

    refresh_global_settings_context()
    setup_logging(incremental=False)
    _run()


def _run() -> None:
    import atexit
    import signal
    import warnings

    from trainflow.signals import on_sigint
    from trainflow.timeline import timeline

    atexit.register(timeline, "exit")  # registered first, so it runs after every other exit hook
    # requests hides urllib3's notice that SOCKS proxies need PySocks once imported; a
    # thread importing requests.adapters while another imports requests can see it first.
    warnings.filterwarnings("ignore", message="SOCKS support in urllib3 requires")
    signal.signal(signal.SIGINT, on_sigint)  # a Ctrl-C that lands where it is swallowed still stops a run
    # A config's own code (model.kind, train.loss, ...: package.module:name) imports from the
    # current folder, as under `python -m`; a console script's path starts at its own folder.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        commands()(prog_name="trainflow")  # ends in SystemExit, as every click command does
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            _exit_without_teardown(e.code or 0)
        raise
