"""How a local cluster's node starts, where Ray gives no public way to. The rest of the
quarantine is :mod:`trainflow.ray_internals`.

23. A local cluster's dashboard agent on a port of the system's choosing
    (:func:`agent_port_of_the_systems_choosing`). ``ray._private.parameter.RayParams``'s
    ``dashboard_agent_listen_port``, whose default is Ray's fixed 52365. ``ray start`` takes
    ``--dashboard-agent-listen-port``, ``ray.init`` nothing (ray-project/ray#34886): beside
    another Ray node on the machine, a local cluster's agent retries that port for about
    3.5 s, which its start waits for, then serves no HTTP. Moved: that wait again.
"""

from __future__ import annotations

import functools
import inspect


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
