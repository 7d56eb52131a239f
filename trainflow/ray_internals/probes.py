"""Ray's private names that only trainflow's tests use, to make what Ray makes or to read what
a run did; the rest of the quarantine is :mod:`trainflow.ray_internals`.

17. Ray Train's errors as its controller and workers make them
    (:func:`train_function_failed`, :func:`worker_group_startup_timeout`).
    ``ray.train.v2._internal.util.construct_user_exception_with_traceback`` and
    ``ray.train.v2._internal.exceptions.WorkerGroupStartupTimeoutError``. Moved: the tests of
    :mod:`trainflow.cluster.quiet`'s filters fail at the import.
18. Every actor a cluster has recorded, ended ones too (:func:`actor_class_names`).
    ``ray._private.state.actors``; the state API needs the dashboard. Moved: the test fails.
19. The workers' lines as they reach the driver (:func:`worker_output_handler`). Ray's
    stdstream dispatcher, as in use 5. Moved: the test fails.
20. Ray's worker setup script (:func:`setup_worker_script`), which a test's node runs
    through a ``setup_worker_path`` of its own. ``ray/_private/workers/setup_worker.py``.
    Moved: the test fails.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator


def train_function_failed(error: BaseException) -> BaseException:
    """What a Ray Train worker does with an exception of the training function: log Ray's
    "Error in training function" record with its traceback, and return the wrapper the
    controller receives. Call it in an ``except`` block that caught ``error``."""
    from ray.train.v2._internal.util import construct_user_exception_with_traceback

    return construct_user_exception_with_traceback(error)


def worker_group_startup_timeout(num_workers: int) -> Exception:
    """The error Ray Train's controller logs when a worker group did not start in time."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    return WorkerGroupStartupTimeoutError(num_workers=num_workers)


def actor_class_names() -> list[str]:
    """The class name of every actor the connected cluster's GCS has recorded, alive or ended."""
    import ray._private.state

    return [actor["ActorClassName"] for actor in ray._private.state.actors().values()]


@contextlib.contextmanager
def worker_output_handler(name: str, handler: Callable[[dict], None]) -> Iterator[None]:
    """Within the block, ``handler`` receives each batch of the workers' lines (a dict with
    ``lines`` and ``pid``) that reaches this driver, after Ray's own handlers."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.add_handler(name, handler)
    try:
        yield
    finally:
        dispatcher.remove_handler(name)


def setup_worker_script() -> str:
    """The path of the script Ray starts each worker of a node through (a node's
    ``setup_worker_path`` replaces it)."""
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "_private", "workers", "setup_worker.py")
