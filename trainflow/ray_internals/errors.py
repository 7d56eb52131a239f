"""Ray's errors as trainflow reads them, where Ray gives no public way to. The rest of the
quarantine is :mod:`trainflow.ray_internals`.

16. A worker's own exception inside Ray Train's wrapper (:func:`worker_error`). The
    wrapper's ``_base_exc``; Ray's ``WorkerGroupError`` hands back the wrapper. Moved: the
    wrapper, and a ConfigError from the workers keeps its traceback.
21. A local node that missed its start-up wait (:data:`NODE_START_TIMEOUT`): the message of
    the bare Exception ``ray._private.node.Node`` raises when its raylet does not register
    within its wait (Ray's 30 s, or trainflow's bound: use 24) on a machine too busy. No
    error class tells it. Moved: the command's one line names the Exception as Ray words it.
"""

from __future__ import annotations

# 16. A worker's own exception.


def worker_error(failure: BaseException) -> BaseException:
    """The exception a Ray Train worker raised, from the wrapper that carries its traceback
    text to the driver (``WorkerGroupError.worker_failures``); ``failure`` itself otherwise."""
    return getattr(failure, "_base_exc", failure)


# 21. A local node's start-up wait.
NODE_START_TIMEOUT = "The current node timed out during startup"
