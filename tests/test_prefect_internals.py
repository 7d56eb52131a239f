"""Each use trainflow makes of Prefect's private names, one test per use numbered as in
:mod:`trainflow.prefect_internals`' docstring: when a Prefect release changes what a use
relies on, its test fails and names it. Each runs the real flow engine against the
session's Prefect server."""

import inspect
import threading

import pytest
from prefect import flow, flow_engine

import trainflow.tasks  # noqa: F401 - importing trainflow's steps ends flow runs without the wait
from trainflow import prefect_internals

# 1. A flow run ends without waiting for its heartbeat thread.


def _heartbeat_threads() -> list[threading.Thread]:
    """The threads Prefect's engine runs a flow run's heartbeat loop in (a thread's ``_args``
    while it runs)."""
    found = []
    for thread in threading.enumerate():
        args = getattr(thread, "_args", ())
        if args and getattr(args[0], "__name__", "") == "heartbeat_loop":
            found.append(thread)
    return found


def test_a_flow_run_returns_while_its_heartbeat_thread_sleeps_and_the_thread_then_ends(prefect_harness):
    """Prefect 3.8's heartbeat loop: a thread per synchronous flow run, ``heartbeat_loop``,
    which sleeps a second at a time and ends when it wakes to the run's end (its state
    final, or the engine's stop); the engine's ``_send_heartbeats(engine, join_on_exit)``
    joins it at the run's end unless told not to."""
    assert "join_on_exit" in inspect.signature(flow_engine._send_heartbeats).parameters
    seen: list[threading.Thread] = []

    @flow(persist_result=False)
    def adds(a: int, b: int) -> int:
        seen.extend(_heartbeat_threads())
        return a + b

    # A run that wakes its thread to its final state (the first run's client start-up can
    # take a second) ends it before the return either way: a run after it, up to three.
    alive = []
    for _ in range(3):
        seen.clear()
        assert adds(1, 2) == 3
        alive = [thread for thread in seen if thread.is_alive()]
        if alive:
            break

    # Prefect started the run's heartbeat (heartbeats stay on) and returned without waiting
    # for its thread, asleep,
    assert len(seen) == 1 and alive == seen
    # which ends by itself when it wakes.
    alive[0].join(3)
    assert not alive[0].is_alive()


def test_trainflow_wraps_the_heartbeat_context_once():
    assert prefect_internals.flow_runs_end_without_waiting() is True
    wrapped = flow_engine._send_heartbeats
    assert prefect_internals.flow_runs_end_without_waiting() is True
    assert flow_engine._send_heartbeats is wrapped


def test_where_prefect_moved_the_heartbeat_context_flow_runs_keep_prefects_wait(monkeypatch):
    monkeypatch.delattr(flow_engine, "_send_heartbeats")
    assert prefect_internals.flow_runs_end_without_waiting() is False

    def other(engine):  # a release without join_on_exit
        raise AssertionError("not called")

    monkeypatch.setattr(flow_engine, "_send_heartbeats", other, raising=False)
    assert prefect_internals.flow_runs_end_without_waiting() is False
    assert flow_engine._send_heartbeats is other


def test_a_flow_run_that_fails_still_ends_its_heartbeat(prefect_harness):
    @flow(persist_result=False)
    def fails() -> None:
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        fails()
    for thread in _heartbeat_threads():
        thread.join(3)
        assert not thread.is_alive()
