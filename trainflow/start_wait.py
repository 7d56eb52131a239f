"""How long a command waits for the Ray cluster and Prefect server it starts
(TRAINFLOW_START_TIMEOUT, seconds), and the one line it says when that wait is slow.

A busy machine (a load past its CPUs) stretches both start-ups from seconds to minutes;
a command waits for them up to this bound, says once that it is waiting and why, and
fails past it in one line naming the bound (docs/guides/troubleshooting.md)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from trainflow.config import ConfigError

START_TIMEOUT_ENV = "TRAINFLOW_START_TIMEOUT"
# Enough for a first start on two cores with a load past 10 (benchmarks/results/cold_under_load.md).
START_TIMEOUT_S = 180.0
# A start still waiting after this many seconds is slow: the command says so, once.
SLOW_START_S = 10.0

_said = threading.Event()  # the notice was given in this process


def start_timeout() -> float:
    """The seconds a start-up may wait: TRAINFLOW_START_TIMEOUT, else :data:`START_TIMEOUT_S`."""
    raw = os.environ.get(START_TIMEOUT_ENV, "").strip()
    if not raw:
        return START_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{START_TIMEOUT_ENV}={raw!r}: expected a number of seconds above 0, such as 600")
    return seconds


def machine_load() -> str:
    """``load average 14.2 on 2 CPUs``: why a start-up is slow."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def raise_it(seconds: float) -> str:
    """How to give a start-up more time than ``seconds``, for its one-line error."""
    return f"set {START_TIMEOUT_ENV} above {seconds:g} (seconds), or run when the machine is less busy"


@contextmanager
def said_if_slow(
    what: str, logger: logging.Logger | logging.LoggerAdapter, after_s: float | None = None
) -> Iterator[None]:
    """Log ``waiting for <what> (<load>)...`` once, should the block still run
    ``after_s`` (:data:`SLOW_START_S`) seconds after it began; at most one such line per
    process. A fast start says nothing. A warning: a command with no handler of its own
    (`trainflow models serve`) shows it too."""
    timer = threading.Timer(SLOW_START_S if after_s is None else after_s, _say, (what, logger))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _say(what: str, logger: logging.Logger | logging.LoggerAdapter) -> None:
    if _said.is_set():
        return
    _said.set()
    logger.warning(
        "waiting for %s (%s), up to %g s (%s)...", what, machine_load(), start_timeout(), START_TIMEOUT_ENV
    )
