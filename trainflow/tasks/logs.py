"""Expected failures read as one line in Prefect's logs.

A bad config, bad data, a cluster too small for the run or a sweep with no working
trial is the user's to fix from the message: Prefect's engine logs each failed task
and flow run with a full traceback, which users read as a crash of trainflow. The
flows keep those records but drop the traceback; the ``trainflow`` command, which
prints the error itself, also keeps them off its console.
"""

import logging

from trainflow.cluster.checks import PreflightError
from trainflow.config import ConfigError
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.sweep.trials import SweepFailed

EXPECTED_ERRORS = (ConfigError, DataError, PreflightError, SweepFailed)
# The loggers of Prefect's flow and task run records (console and API handlers).
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# DataDrift is a DataError; named apart, since Prefect's records carry only its name.
_NAMES = (*(cls.__name__ for cls in EXPECTED_ERRORS), "DataDrift")


def is_expected(record: logging.LogRecord) -> bool:
    """A record of an expected failure: it carries one, or names one (Prefect's
    ``Finished in state Failed('... DataError: ...')`` line carries only the text)."""
    if getattr(record, "trainflow_expected", False):
        return True
    message = record.getMessage()
    return any(f"{name}:" in message or f"{name}(" in message for name in _NAMES)


class OneLineExpectedErrors(logging.Filter):
    """Keeps a record of an expected failure, without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], EXPECTED_ERRORS):
            record.exc_info = None
            record.exc_text = None
            record.trainflow_expected = True
        return True


# What Prefect's engine says of a run that a signal or a sys.exit() stopped: "Crash
# detected! <why>" and "Finished in state Crashed('<why>')", at ERROR.
_STOPPED = (
    "Execution was aborted by an interrupt signal.",
    "Execution was aborted by a termination signal.",
    "Execution was aborted by Python system exit call.",
)


def is_stop(record: logging.LogRecord) -> bool:
    """A record of a run that Ctrl-C, a stop signal or sys.exit() ended."""
    message = record.getMessage()
    return any(why in message for why in _STOPPED)


class DropExpectedErrors(logging.Filter):
    """Drops records of expected failures and of stops (for a console where the command
    says either once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (is_expected(record) or is_stop(record))


def one_line_expected_errors() -> None:
    """Install :class:`OneLineExpectedErrors` on Prefect's run loggers (once)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineExpectedErrors) for f in logger.filters):
            logger.addFilter(OneLineExpectedErrors())


def drop_expected_errors_on_console() -> None:
    """Keep expected failures and stops (Ctrl-C, a stop signal) off Prefect's console
    handlers in this process; the API handler still sends their one-line records to the
    server, where the flow run ends Failed or Crashed."""
    from prefect.logging.handlers import PrefectConsoleHandler

    one_line_expected_errors()
    # Prefect's logging config puts its console handler on the root logger; run records
    # reach it by propagation.
    for name in (None, *RUN_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, PrefectConsoleHandler) and not any(
                isinstance(f, DropExpectedErrors) for f in handler.filters
            ):
                handler.addFilter(DropExpectedErrors())
