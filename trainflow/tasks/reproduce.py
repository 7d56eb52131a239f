"""The reproduction's last step: the version a reproduction registered is tagged
``reproduces=<version>``, and each test metric is compared with the original's."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.pipelines.registry import reproduce
from trainflow.tasks import render
from trainflow.tasks.results import PipelineResult, Reproduced
from trainflow.tasks.steps import step
from trainflow.workspace import workspace


@step(name="compare-reproduction", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def compare_reproduction(
    of: str, original_metrics: dict[str, float], result: PipelineResult, changed: list[str] | None = None
) -> Reproduced:
    """Tag the version ``result`` registered as the reproduction of version ``of``, whose
    test metrics are ``original_metrics``, and return each test metric's difference
    (zero for a run that reproduces exactly). ``changed``: what differed from the
    original's data and code, let through by force."""
    reg = result.registered
    reproduce.mark_reproduction(workspace(), reg.name, reg.version, of)
    differences = reproduce.differences(original_metrics, result.test_metrics)
    reproduced = Reproduced(of=of, original_metrics=original_metrics, differences=differences, result=result)
    reproduced.changed = changed or []
    get_run_logger().info("%s", render.reproduce_line(reproduced))
    create_markdown_artifact(
        key=f"{render.artifact_key(reg.name)}-reproduce",
        markdown=render.reproduce_markdown(reproduced),
        description=f"{reg.name} version {reg.version}: its test metrics beside version {of}'s",
    )
    return reproduced
