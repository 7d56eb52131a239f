"""What Ray Train's controller runs and unpickles of a trainflow training, made of Ray
Train's private classes. The rest of the quarantine is :mod:`trainflow.ray_internals`,
whose :func:`~trainflow.ray_internals.trainer_class` and
:func:`~trainflow.ray_internals.torch_config` hand these out, or Ray's own classes where
Ray moved a base.

9. :class:`FixedClusterPolicy`: Ray Train's ``FixedScalingPolicy`` without its
   ``_*_resource_request`` calls to the autoscaling coordinator.
10. :class:`TorchConfig` and its :class:`TorchBackend`: Ray's ``TorchConfig`` from a module
    without torch, its steps through ``ray.train._internal.utils.get_address_and_port``,
    ``ray.train.torch.config._*`` and ``ray._private.ray_constants``.

Their bases' modules are slow to import: this module is imported where a training
starts and by the controller, never on import of the quarantine nor by a worker."""

from __future__ import annotations

import dataclasses

from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2._internal.util import TrainingFramework

from trainflow.ray_internals import _set_master, _torch, log, process_group_backend

# 9. Ray Train's controller without the autoscaling coordinator.


def _no_request(self, *args) -> None:
    """A local cluster has no autoscaler to ask for resources."""


class FixedClusterPolicy(FixedScalingPolicy):
    """Ray Train's FixedScalingPolicy without the requests to the autoscaling coordinator,
    a detached actor that tells an autoscaler what to add: a local cluster has none."""

    after_controller_start = _no_request
    _maybe_send_resource_request = _no_request
    _send_resource_request = _no_request


# 10. Ray's TorchConfig, from a module without torch.


class TorchBackend(Backend):
    """Ray's ``_TorchBackend`` steps, each worker-side function Ray's own."""

    share_cuda_visible_devices = True

    def on_start(self, worker_group, backend_config) -> None:
        """Set up torch.distributed on every worker of the group, as Ray's torch backend does."""
        import ray
        from ray.train._internal.utils import get_address_and_port

        if backend_config.init_method != "env":
            raise ValueError(f"init_method {backend_config.init_method!r}: only 'env' is supported")
        backend = process_group_backend(backend_config.backend, worker_group.get_resources_per_worker())
        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_master, address=address, port=port)
        worker_group.execute(_torch, "_set_torch_distributed_env_vars")
        size = len(worker_group)
        timeout_s = backend_config.timeout_s
        setup = dict(backend=backend, world_size=size, init_method="env://", timeout_s=timeout_s)
        call = worker_group.execute_single_async
        step = "_setup_torch_process_group"
        ray.get([call(rank, _torch, step, world_rank=rank, **setup) for rank in range(size)])

    def on_shutdown(self, worker_group, backend_config) -> None:
        """Shut torch.distributed down on every worker, waiting as long as Ray's setting says."""
        import ray
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S as DEFAULT_TIMEOUT
        from ray.train.constants import TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S as TIMEOUT

        futures = worker_group.execute_async(
            _torch, "_shutdown_torch", destroy_process_group=len(worker_group) > 1
        )
        timeout_s = ray_constants.env_integer(TIMEOUT, DEFAULT_TIMEOUT)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:  # the workers are being stopped either way
            log.debug("torch process group shutdown timed out after %s seconds", timeout_s)


@dataclasses.dataclass
class TorchConfig(BackendConfig):
    """Ray's TorchConfig, the same fields and defaults, for workers on CPUs or CUDA GPUs:
    gloo, or nccl where the workers have GPUs."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return TorchBackend

    @property
    def train_func_context(self):
        # Read where the trainer wraps its train function (the driver), run on the workers.
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}
