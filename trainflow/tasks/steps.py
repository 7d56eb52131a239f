"""What every trainflow step shares: the ``@step`` decorator (a Prefect task, with a stop
check and its running time recorded), the check of what a step is handed, and the times
of a flow run's steps for its summary."""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from prefect import task

from trainflow import prefect_internals
from trainflow.config import ConfigError, PipelineConfig, load_config
from trainflow.signals import raise_if_interrupted
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.timeline import timeline

F = TypeVar("F", bound=Callable[..., Any])

# Every flow that runs trainflow's steps, trainflow's and a user's own, ends when its work
# does, not up to a second later when Prefect's heartbeat thread wakes.
prefect_internals.flow_runs_end_without_waiting()


class StepInputError(ConfigError):
    """A step handed something it cannot use (another step's result, or one made for
    another config); the message names the step, the argument and what to give it."""


def step(**task_options: Any) -> Callable[[F], F]:
    """A trainflow step: Prefect's ``@task`` with ``task_options`` (name, retries,
    caching), which also stops a run a Ctrl-C interrupted before it starts
    (``signals.raise_if_interrupted``: Prefect's engine can swallow one between tasks),
    keeps Prefect's records of an expected failure to one line
    (:func:`~trainflow.tasks.logs.one_line_expected_errors`), and records how long it ran
    for :func:`step_times`."""

    def decorate(fn: F) -> F:
        name = task_options.get("name", fn.__name__)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            raise_if_interrupted()
            one_line_expected_errors()  # in any flow: a user's mistake is one line in its logs
            timeline(f"{name} start")
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _ran(name, time.perf_counter() - start)

        return task(run, **task_options)  # type: ignore[return-value]

    return decorate


def run_id() -> str:
    """A name for what this call of a step starts (a Ray Train run, a sweep): the random
    end of its task run's id, which a Prefect retry keeps (the retry resumes what the
    first attempt started), and which no other call shares. (The id's start is its time.)"""
    from prefect.runtime import task_run

    if task_run.id is None:  # outside a task run
        return uuid.uuid4().hex[-12:]
    return uuid.UUID(str(task_run.id)).hex[-12:]


def as_config(config: PipelineConfig | dict | str, step_name: str) -> PipelineConfig:
    """A step's config: a PipelineConfig as it is, a dict or a YAML/JSON path loaded."""
    if isinstance(config, PipelineConfig):
        return config
    if isinstance(config, dict | str):
        return load_config(config)
    raise StepInputError(
        f"{step_name}: config is a {type(config).__name__}; give it a PipelineConfig "
        "(trainflow.load_config), a dict or the path of a YAML config"
    )


def expect(value: object, kind: type, step_name: str, argument: str, made_by: str) -> None:
    """StepInputError unless ``value`` is a ``kind``: what the step ``made_by`` returns."""
    if not isinstance(value, kind):
        raise StepInputError(
            f"{step_name}: {argument} is {_a(value)}; give it what {made_by} returns ({kind.__name__})"
        )


def _a(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


@dataclass
class StepTimes:
    """How long each step of a flow run ran, in the order they ran (a step retried: each
    attempt counted). A step Prefect answered from its cache did not run."""

    seconds: dict[str, float] = field(default_factory=dict)

    def of(self, steps: Sequence[str]) -> tuple[dict[str, float], list[str]]:
        """Each of ``steps``' seconds (0 for one that did not run), and those that did not
        run: the ones Prefect answered from its cache."""
        return {name: self.seconds.get(name, 0.0) for name in steps}, [
            name for name in steps if name not in self.seconds
        ]


_recording: dict[UUID, StepTimes] = {}
_lock = threading.Lock()


@contextmanager
def step_times() -> Iterator[StepTimes]:
    """Record how long the trainflow steps called inside the block run, in the flow run
    this is called from."""
    from prefect.runtime import flow_run

    times = StepTimes()
    if flow_run.id is None:
        yield times
        return
    key = UUID(str(flow_run.id))
    with _lock:
        _recording[key] = times
    try:
        yield times
    finally:
        with _lock:
            _recording.pop(key, None)


def _ran(name: str, seconds: float) -> None:
    """A step's run, for the flow run recording it."""
    from prefect.runtime import flow_run

    with _lock:
        times = _recording.get(UUID(str(flow_run.id))) if flow_run.id else None
    if times is not None:
        times.seconds[name] = times.seconds.get(name, 0.0) + seconds
