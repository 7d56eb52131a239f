"""Ray's internal switches that trainflow sets: environment variables Ray reads in its private
code or compiled core and does not document as settings, a rollout flag of Ray Data's
context, and a default of the node that ``ray.init`` starts. The rest of the quarantine is
:mod:`trainflow.ray_internals`.

13. Ray core's switches (:data:`PRESTART_WORKERS`, :data:`WORKER_NICENESS`,
    :data:`OVERRIDE_RESOURCES`). ``RAY_<flag>`` for the raylet's system-config flags
    ``prestart_worker_first_driver`` and ``worker_niceness`` (Ray's job manager sets the
    second for a job's driver); ``RAY_OVERRIDE_RESOURCES``, read by ``ray.init``'s resource
    spec, only in trainflow's tests; ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` of
    ``ray._private.ray_constants``, read by a node that gets SIGTERM. No ``ray.init`` argument
    does any. Moved: idle workers start at a local cluster's start, its workers yield the CPU
    to every other process, and `trainflow down` waits for the head's drain.
14. Ray Train's and Tune's switches (:data:`TRAIN_HEALTH_CHECK_INTERVAL` ...): names in
    ``ray.train.v2._internal.constants``, and ``RAY_AIR_NEW_OUTPUT`` of Tune's console output.
    No config field sets them. Moved: Ray's defaults (a slower report, the watcher's ERROR
    line, Tune's experiment box).
15. Ray Data's first Parquet datasource (:func:`parquet_datasource_v1`).
    ``DataContext.use_datasource_v2``, the rollout flag of its second. Moved: the datasource
    Ray picks, which lists the files at every execution of a streamed split.
22. Ray Serve's direct ingress (:func:`direct_ingress_env`): ``RAY_SERVE_ENABLE_DIRECT_INGRESS``
    and its port range and drain in ``ray.serve._private.constants``, the per-variable form of
    what the documented ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` turns on with other switches. Moved:
    requests go through Serve's HTTP proxy again (benchmarks/results.md, online serving).
23. A local cluster's dashboard agent on a port of the system's choosing
    (:func:`agent_port_of_the_systems_choosing`). ``ray._private.parameter.RayParams``'s
    ``dashboard_agent_listen_port``, whose default is Ray's fixed 52365. ``ray start`` takes
    ``--dashboard-agent-listen-port``, ``ray.init`` nothing (ray-project/ray#34886): beside
    another Ray node on the machine, a local cluster's agent retries that port for about
    3.5 s, which its start waits for, then serves no HTTP. Moved: that wait again.
24. A local node's start-up waits stretched to trainflow's bound (:func:`node_start_waits`):
    ``RAY_raylet_start_wait_time_s``, the system-config flag of how long a process waits for
    a node to register (the node that ``ray.init`` starts polls for its raylet with it; Ray's
    error names it), and ``RAY_gcs_server_port_wait_time_s``, read by
    ``ray._private.node.Node`` for its GCS. ``ray.init`` sets neither, but for the private
    ``_system_config``. Moved: Ray's 30 s for each, and use 21's error.
25. Serve's first deadline for a replica's queue length (:data:`SERVE_QUEUE_PROBE_DEADLINE`),
    ``RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S`` in ``ray.serve._private.constants``, only in
    trainflow's tests: a probe that always misses, as a busy machine's replica answers late,
    whose warning the console of `trainflow models serve` never shows. Moved: the test's
    probes answered in time, and nothing to show.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
from collections.abc import Iterator

# 13. Ray core's switches: the raylet reads ``RAY_<name>`` for each system-config flag.
PRESTART_WORKERS = "RAY_prestart_worker_first_driver"
WORKER_NICENESS = "RAY_worker_niceness"
OVERRIDE_RESOURCES = "RAY_OVERRIDE_RESOURCES"
SHUTDOWN_DRAIN_TIMEOUT = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
RAYLET_FLAGS = (PRESTART_WORKERS, WORKER_NICENESS)

# 14. Ray Train's (ray.train.v2._internal.constants) and Tune's switches.
TRAIN_HEALTH_CHECK_INTERVAL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
TRAIN_PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
TRAIN_PREEMPTION_POLL_INTERVAL = "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"
TRAIN_WORKER_GROUP_START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
TUNE_NEW_OUTPUT = "RAY_AIR_NEW_OUTPUT"

# 15. Ray Data's context.
DATASOURCE_V2 = "use_datasource_v2"

# 22. Ray Serve's direct ingress: an ingress replica answers HTTP on a port of the range.
SERVE_DIRECT_INGRESS = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
SERVE_DIRECT_MIN_PORT = "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"
SERVE_DIRECT_MAX_PORT = "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"
SERVE_DIRECT_DRAIN = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
SERVE_DIRECT = (SERVE_DIRECT_INGRESS, SERVE_DIRECT_MIN_PORT, SERVE_DIRECT_MAX_PORT, SERVE_DIRECT_DRAIN)

# 24. A local node's waits for its raylet's registration and its GCS's port (Ray's 30 s each).
RAYLET_START_WAIT = "RAY_raylet_start_wait_time_s"
GCS_PORT_WAIT = "RAY_gcs_server_port_wait_time_s"
NODE_START_WAITS = (RAYLET_START_WAIT, GCS_PORT_WAIT)

# 25. Serve's first deadline for a replica's queue length (0.1 s), only in tests.
SERVE_QUEUE_PROBE_DEADLINE = "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S"

# Every switch named here: tests/test_layers.py keeps them out of the rest of trainflow and its tests.
NAMES = (
    *RAYLET_FLAGS,
    OVERRIDE_RESOURCES,
    SHUTDOWN_DRAIN_TIMEOUT,
    TRAIN_HEALTH_CHECK_INTERVAL,
    TRAIN_PREEMPTION_WATCHER,
    TRAIN_PREEMPTION_POLL_INTERVAL,
    TRAIN_WORKER_GROUP_START_TIMEOUT,
    TUNE_NEW_OUTPUT,
    DATASOURCE_V2,
    *SERVE_DIRECT,
    *NODE_START_WAITS,
    SERVE_QUEUE_PROBE_DEADLINE,
)


@contextlib.contextmanager
def parquet_datasource_v1() -> Iterator[None]:
    """Within the block, ``ray.data.read_parquet`` in this process uses Ray Data's first
    Parquet datasource; the context's flag is put back after (a no-op where Ray dropped it)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    if not hasattr(context, DATASOURCE_V2):
        yield
        return
    before = getattr(context, DATASOURCE_V2)
    setattr(context, DATASOURCE_V2, False)
    try:
        yield
    finally:
        setattr(context, DATASOURCE_V2, before)


def direct_ingress_env(port: int, drain_s: float) -> dict[str, str]:
    """The environment of a cluster whose Serve replica of an ingress deployment listens on
    ``port`` itself (the range Serve allocates from is that one port), held open ``drain_s``
    after it is told to stop. Serve's HTTP proxy still starts, on the port ``serve.start`` names."""
    return {
        SERVE_DIRECT_INGRESS: "1",
        SERVE_DIRECT_MIN_PORT: str(port),
        SERVE_DIRECT_MAX_PORT: str(port + 1),  # the end of Serve's range, not in it
        SERVE_DIRECT_DRAIN: f"{drain_s:g}",
    }


# 23. A local cluster's dashboard-agent port.


def agent_port_of_the_systems_choosing() -> None:
    """Every ``ray.init`` of a local cluster in this process gives its node's dashboard
    agent a port of the system's choosing (0, which Ray's agent takes and registers in the
    GCS) instead of Ray's fixed 52365; a caller's own value stays. Nothing where Ray moved it."""
    try:
        from ray._private import parameter

        init = parameter.RayParams.__init__
        default = inspect.signature(init).parameters["dashboard_agent_listen_port"].default
    except (ImportError, AttributeError, KeyError):
        return
    if getattr(init, "__trainflow_agent_port__", False) or default == 0:
        return

    @functools.wraps(init)
    def chosen_by_the_system(self, *args, dashboard_agent_listen_port=0, **kwargs):
        init(self, *args, dashboard_agent_listen_port=dashboard_agent_listen_port, **kwargs)

    chosen_by_the_system.__trainflow_agent_port__ = True
    parameter.RayParams.__init__ = chosen_by_the_system


# 24. A local node's start-up waits.


@contextlib.contextmanager
def node_start_waits(timeout_s: float) -> Iterator[float]:
    """Within the block, a local node that ``ray.init`` starts waits up to ``timeout_s``
    for its raylet to register and for its GCS (each at least Ray's 30 s), and its
    processes, which inherit this environment, as long for the node's registration.
    Values already in the environment win; they are put back after the block. Yields the
    seconds of the raylet's wait."""
    seconds = str(max(30, math.ceil(timeout_s)))
    before = {name: os.environ.get(name) for name in NODE_START_WAITS}
    for name in NODE_START_WAITS:
        os.environ.setdefault(name, seconds)
    try:
        waited = max(30.0, float(os.environ[RAYLET_START_WAIT]))
    except ValueError:  # the environment's own value, not a number: Ray's to refuse
        waited = float(seconds)
    try:
        yield waited
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
