"""The resources sections: the Ray cluster a run uses, its training workers, and the
failures it survives."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainflow.config.sections import Section


class ScalingSection(Section):
    """The Ray Train workers: how many, what each asks of the cluster, and where they run."""

    num_workers: int | tuple[int, int] = Field(
        2,
        description="Ray Train workers, each training a replica of the model on its own shard of "
        "the train split (data-parallel, gradients averaged every step). A range [min, max]: "
        "elastic, the run starts once min workers fit, grows toward max as the cluster gains "
        "room and shrinks when a worker's node is lost, resuming from its latest checkpoint "
        "each time. 0: no Ray Train workers, as Ray Train's local mode: trainflow's loop trains "
        "in the flow's own process on its CPU, the splits in memory, for iterating on a small "
        "model without the workers' start.",
    )
    use_gpu: bool = Field(
        False,
        description="Give each worker a GPU (resources_per_worker's GPU, when it names one); "
        "false: workers train on CPUs.",
    )
    resources_per_worker: dict[str, float] = Field(
        {"CPU": 0.5},
        description="The Ray resources each worker asks for. Half a CPU each: two workers on a "
        "2-core machine leave a core for Ray Data.",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="How Ray places the workers on nodes: PACK fills a node first, SPREAD spreads "
        "them; STRICT_PACK puts all on one node, STRICT_SPREAD each on a node of its own.",
    )
    on_cpu_shortage: Literal["fail", "shrink"] = Field(
        "fail",
        description="When the workers and Ray Data's CPU do not fit: fail at once with what would "
        "fit, or shrink each worker's CPU to fit (logged as a warning).",
    )
    resize_check_s: float | None = Field(
        None,
        gt=0.0,
        description="With a range of num_workers: how often Ray Train looks for room to grow the "
        "running worker group, in seconds; null: Ray Train's default (60).",
    )
    wait_for_resources_s: float = Field(
        0.0,
        ge=0.0,
        description="On an autoscaling cluster, wait up to this many seconds for the resources to "
        "appear before failing; 0 checks once.",
    )

    @field_validator("num_workers")
    @classmethod
    def _a_count_or_a_range(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (v, v) if isinstance(v, int) else v
        if (low < 1 and v != 0) or high < low:
            shown = list(v) if isinstance(v, tuple) else v
            raise ValueError(
                f"{shown}: give a number of workers (0: none, the flow's own process trains), or "
                "[min, max] with 1 <= min <= max"
            )
        return v

    @model_validator(mode="after")
    def _in_process_on_the_cpu(self) -> ScalingSection:
        if self.num_workers == 0 and (self.use_gpu or self.resources_per_worker.get("GPU")):
            raise ValueError(
                "num_workers 0 trains in the flow's own process on its CPU: set use_gpu false, or "
                "give num_workers 1 or more for workers with GPUs"
            )
        return self

    @property
    def in_process(self) -> bool:
        """Whether the flow's own process trains (num_workers 0, Ray Train's local mode)."""
        return self.num_workers == 0

    @property
    def elastic(self) -> bool:
        """Whether num_workers is a range, which Ray Train resizes between."""
        return not isinstance(self.num_workers, int)

    @property
    def min_workers(self) -> int:
        """The workers a run starts with at least: what preflight checks fit."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        """The workers a run grows to at most."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]


class FailureSection(Section):
    """What a training survives: a lost worker, by restarting the worker group."""

    max_failures: int = Field(
        1,
        ge=-1,
        description="How many times Ray Train restarts the worker group after a worker fails, "
        "resuming from the latest checkpoint; -1: without end, 0: never. A sweep's trials are "
        "not restarted.",
    )
    max_preemptions: int | None = Field(
        None,
        ge=0,
        description="How many times Ray Train restarts the worker group after a node is preempted "
        "(drained for preemption, as a node that gets SIGTERM drains itself: a spot reclaim, a "
        "Kubernetes eviction), counted apart from max_failures; null: without end, 0: never.",
    )


class RayConfig(Section):
    """The Ray cluster the run connects to, or none for a local one."""

    address: str | None = Field(
        None,
        description='A running cluster ("ray://host:10001" or "host:6379"); null: RAY_ADDRESS, '
        "else a local cluster started for the run.",
    )
