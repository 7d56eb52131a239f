"""Every use trainflow makes of Prefect's private names, in one place.

Nothing else in trainflow or its tests names a private module, function or attribute of
Prefect's. Each use has a test in ``tests/test_prefect_internals.py`` that fails when
Prefect changes what it relies on, and degrades, where Prefect moved it, to Prefect's own
behaviour: slower, never wrong. Checked against Prefect 3.8.8, the pinned release (3.9.1
behaves the same). Each use: what it does; Prefect's names; why no public API does it;
what happens where Prefect moves it.

1. A flow run ends without waiting for its heartbeat thread to wake
   (:func:`flow_runs_end_without_waiting`). ``prefect.flow_engine._send_heartbeats`` and its
   ``join_on_exit``. A synchronous flow run starts a thread that sends its heartbeat
   (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, 180 s unless set) and sleeps a second at a
   time; at the run's end the engine waits for that thread to see that the run ended: up to
   a second added to every flow run (a flow that does nothing takes 1.1 s against 0.15 s
   without the wait). Prefect's asynchronous engine already leaves it
   (``join_on_exit=False``); the thread ends at its next second, sending nothing more.
   No setting turns the wait, or heartbeats, off. Moved: Prefect's wait.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

_PATCHED = "_trainflow_without_join"


def flow_runs_end_without_waiting() -> bool:
    """Have this process's synchronous flow runs end without waiting for their heartbeat
    thread (use 1): True when done (or done before), False where Prefect moved it."""
    from prefect import flow_engine

    send = getattr(flow_engine, "_send_heartbeats", None)
    if send is None:
        return False
    if getattr(send, _PATCHED, False):
        return True
    try:
        parameters = inspect.signature(send).parameters
    except (TypeError, ValueError):
        return False
    if "join_on_exit" not in parameters:
        return False

    @functools.wraps(send)
    def without_join(engine: Any, join_on_exit: bool = False) -> Any:
        return send(engine, join_on_exit=False)

    setattr(without_join, _PATCHED, True)
    flow_engine._send_heartbeats = without_join
    return True
