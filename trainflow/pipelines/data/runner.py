"""Where the engine's passes run: one Ray task per fragment, or in this process.

The substrate is this module alone; the passes (:mod:`trainflow.pipelines.data.prepare`) are
plain functions of a fragment. They run on Ray tasks rather than Ray Data: see
docs/architecture.md, Decisions, and benchmarks/results.md, preparation engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainflow.config import ConfigError
from trainflow.pipelines.data.schema import DataError

if TYPE_CHECKING:
    import ray.data


def run(fn: Callable[..., Any], calls: list[tuple], in_driver: bool = False) -> list[Any]:
    """``fn`` as a Ray task per argument tuple (or called here, ``in_driver``), results in
    order; a DataError or ConfigError (a user's transform at fault) raised in a task is
    raised here as itself, without Ray's traceback."""
    if in_driver:
        return [fn(*args) for args in calls]

    return _get([_remote(fn).remote(*args) for args in calls])


def run_to_dataset(fn: Callable[..., Any], calls: list[tuple], in_driver: bool = False) -> ray.data.Dataset:
    """A Dataset of the DataFrames ``fn`` returns per argument tuple; from Ray tasks they
    stay in Ray's object store, never passing through this process."""
    import ray
    import ray.data

    if in_driver:
        return ray.data.from_pandas(run(fn, calls, in_driver=True))
    # Each task returns its frame and a flag: waiting on the flags raises a task's
    # DataError here, while the frames stay where the tasks put them.
    task = ray.remote(_with_done).options(num_cpus=1, num_returns=2)
    pairs = [task.remote(fn, *args) for args in calls]
    _get([done for _, done in pairs])
    return ray.data.from_pandas_refs([frame for frame, _ in pairs])


def _with_done(fn: Callable[..., Any], *args: Any) -> tuple[Any, bool]:
    return fn(*args), True


def _remote(fn):
    import ray

    return ray.remote(fn).options(num_cpus=1)


def _get(refs: list) -> list[Any]:
    import ray

    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, (DataError, ConfigError)):
            raise e.cause from None
        raise
