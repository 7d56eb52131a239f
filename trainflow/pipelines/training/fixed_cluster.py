"""The scaling policy of a training on a local cluster that trainflow started: a fixed
number of workers on a cluster that cannot grow.

Ray Train's own fixed policy also sends its workers' resources to Ray's autoscaling
coordinator, a detached actor it starts on first use: a process importing Ray Data,
pandas and pyarrow (about 1.3 CPU-seconds, measured), so that an autoscaler can add
nodes. A local cluster has no autoscaler to tell. Imported by Ray Train's controller
process, so it imports nothing but Ray Train (and, as every trainflow module, the
package root's config: about 20 ms beside Ray, measured with ``-X importtime``).
"""

from __future__ import annotations

from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy


class FixedClusterPolicy(FixedScalingPolicy):
    """Ray Train's FixedScalingPolicy without the autoscaling coordinator's requests."""

    def after_controller_start(self, train_run_context) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass

    def _send_resource_request(self) -> None:
        pass
