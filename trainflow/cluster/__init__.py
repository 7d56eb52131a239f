"""The Ray cluster a run uses: its session, and whether it can run what a config asks.

For a flow of your own, the same pieces trainflow's flows use::

    from trainflow.cluster import preflight, ray_session

    with ray_session(config):       # one Ray session for every step inside
        preflight(config)           # fail now, in one line, if the cluster cannot hold the run
"""

from trainflow.cluster.checks import PreflightError
from trainflow.cluster.preflight import preflight
from trainflow.cluster.session import connected, ray_session

__all__ = ["PreflightError", "connected", "preflight", "ray_session"]
