"""What Ray Train's controller process unpickles of a trainflow training: its scaling
policy and its torch backend, in a module that imports Ray Train and nothing heavier
(and, as every trainflow module, the package root's config: about 20 ms beside Ray,
measured with ``-X importtime``). tests/test_layers.py checks that importing it loads no
torch.

- :class:`FixedClusterPolicy`: a fixed number of workers on a local cluster that cannot
  grow. Ray Train's own fixed policy also sends its workers' resources to Ray's
  autoscaling coordinator, a detached actor it starts on first use: a process importing
  Ray Data, pandas and pyarrow (about 1.3 CPU-seconds, measured), so that an autoscaler
  can add nodes. A local cluster has no autoscaler to tell.
- :class:`TorchConfig`: Ray's ``ray.train.torch.TorchConfig`` for a CPU or CUDA run,
  from a module that does not import torch. Every training's controller unpickles its
  trainer's backend config; Ray's lives beside the process-group code, which imports
  torch at the top, so each controller (a process that never holds a tensor) imported
  torch for it: about 1.3 CPU-seconds and 470 MB of peak memory per training (measured,
  ``benchmarks/analysis/overhead.md``). The steps are Ray's own functions, run on the
  workers, which import torch anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


class FixedClusterPolicy(FixedScalingPolicy):
    """Ray Train's FixedScalingPolicy without the autoscaling coordinator's requests."""

    def after_controller_start(self, train_run_context) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass

    def _send_resource_request(self) -> None:
        pass


@dataclass
class TorchConfig(BackendConfig):
    """Ray's TorchConfig (the same fields and defaults) for workers on CPUs or CUDA GPUs:
    gloo, or nccl where the workers have GPUs, set up through environment variables."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _TorchBackend

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


def process_group_backend(config: TorchConfig, resources_per_worker: dict[str, float]) -> str:
    """torch.distributed's backend for workers with these resources, as Ray picks it:
    the config's own, else nccl for workers with GPUs and gloo for CPU workers."""
    if config.backend:
        return config.backend
    return "nccl" if resources_per_worker.get("GPU", 0) > 0 else "gloo"


class _TorchBackend(Backend):
    """``ray.train.torch.config._TorchBackend``'s steps for a V2 worker group on CPUs or
    CUDA GPUs, each worker-side function Ray's own."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: TorchConfig) -> None:
        if backend_config.init_method != "env":
            raise ValueError(f"init_method {backend_config.init_method!r}: only 'env' is supported")
        backend = process_group_backend(backend_config, worker_group.get_resources_per_worker())
        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_master, address=address, port=port)
        worker_group.execute(_set_distributed_env_vars)
        size = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _setup_process_group,
                    backend=backend,
                    world_rank=rank,
                    world_size=size,
                    init_method="env://",
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(size)
            ]
        )

    def on_shutdown(self, worker_group, backend_config: TorchConfig) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
        )
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:  # Ray's warns; the workers are being stopped either way
            logger.debug("torch process group shutdown timed out after %s seconds", timeout_s)


# Run on the workers: each imports Ray's torch module there, not in the controller.
def _set_master(address: str, port: int) -> None:
    import os

    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)


def _set_distributed_env_vars() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _setup_process_group(**kwargs) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)
