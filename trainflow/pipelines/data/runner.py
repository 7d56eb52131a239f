"""Where the engine's passes run: one Ray task per fragment, or in this process on a
thread per CPU.

The substrate is this module alone; the passes (:mod:`trainflow.pipelines.data.prepare`) are
plain functions of a fragment. They run on Ray tasks rather than Ray Data, and on a cluster
of this machine alone on the driver's threads: see docs/architecture.md, Decisions, and
benchmarks/results.md, preparation engine and ingest.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from trainflow.config import ConfigError
from trainflow.pipelines.data.schema import DataError

if TYPE_CHECKING:
    import ray.data


def run(fn: Callable[..., Any], calls: list[tuple], threads: int = 0) -> list[Any]:
    """``fn`` as a Ray task per argument tuple, or with ``threads`` called here on up to
    that many threads; results in order. A DataError or ConfigError (a user's transform
    at fault) raised in a task is raised here as itself, without Ray's traceback."""
    if threads == 1 or (threads and len(calls) <= 1):
        return [fn(*args) for args in calls]
    if threads:
        context = contextvars.copy_context()  # each call sees this thread's context variables
        pool = ThreadPoolExecutor(min(threads, len(calls)), thread_name_prefix="trainflow-prepare")
        try:
            return list(pool.map(lambda args: context.copy().run(fn, *args), calls))
        finally:  # after a failure, the calls not yet started never start
            pool.shutdown(cancel_futures=True)
    return _get([_remote(fn).remote(*args) for args in calls])


def local_cluster() -> bool:
    """Whether Ray's cluster is this machine alone: every live node is this process's, not
    reached through Ray Client; or Ray is not started and RAY_ADDRESS names no cluster (a
    Ray call would start a local one)."""
    import ray

    if not ray.is_initialized():
        return not os.environ.get("RAY_ADDRESS")
    from ray.util.client import ray as client

    if client.is_connected():
        return False
    here = ray.get_runtime_context().get_node_id()
    return all(node["NodeID"] == here for node in ray.nodes() if node.get("Alive"))


def available_threads() -> int:
    """The threads the driver prepares on: the CPUs this process may use, at most the Ray
    cluster's when Ray is started."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        cpus = min(cpus, int(ray.cluster_resources().get("CPU", cpus)))
    return max(cpus, 1)


def run_to_dataset(fn: Callable[..., Any], calls: list[tuple], threads: int = 0) -> ray.data.Dataset:
    """A Dataset of the DataFrames ``fn`` returns per argument tuple (``threads``: as
    :func:`run`); from Ray tasks they stay in Ray's object store, never passing through
    this process."""
    import ray
    import ray.data

    if threads:
        return ray.data.from_pandas(run(fn, calls, threads))
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
