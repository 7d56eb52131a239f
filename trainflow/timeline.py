"""Where a command's time goes: with TRAINFLOW_TIMELINE=1, a line on stderr per phase,
``timeline <seconds since the process started> <phase>`` (read by
``benchmarks/overhead.py --phases``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _process_start() -> float:
    """When this process started, on the monotonic clock (Linux); else when this module loaded."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        booted = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
        return ticks / os.sysconf("SC_CLK_TCK") - booted
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


_STARTED = _process_start()
TIMELINE = "TRAINFLOW_TIMELINE"


def timeline(phase: str) -> None:
    """With TRAINFLOW_TIMELINE=1, print ``timeline <s since the process started> <phase>`` on stderr."""
    if os.environ.get(TIMELINE) == "1":
        print(f"timeline {time.monotonic() - _STARTED:.3f} {phase}", file=sys.stderr, flush=True)


def started() -> float:
    """When this process started (the monotonic clock), which the marks count from."""
    return _STARTED


def count_from(start: float) -> None:
    """Count the marks from ``start``: a forkserver's child counts from its command's start."""
    global _STARTED
    _STARTED = start
