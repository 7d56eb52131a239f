"""Reproduce a registered version: its exact config trained again on its data, registered
as a new version tagged ``reproduces=<version>``, each test metric compared."""

# No `from __future__ import annotations` here: Prefect builds the flow's parameter
# model from these annotations, and a deployment's run fails to when they are strings.

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from trainflow import run_checks
from trainflow.flows.training import training_pipeline
from trainflow.run_checks import RunChecks
from trainflow.tasks.logs import one_line_expected_errors
from trainflow.tasks.reproduce import compare_reproduction
from trainflow.tasks.results import Reproduced


def run_name() -> str:
    """A reproduction's run is named for the version: ``reproduce-digits-v3``."""
    model = str(flow_run.parameters.get("model", "")).removeprefix("models:/").replace("/", "-v")
    return "reproduce-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in model)


@flow(name="reproduce", flow_run_name=run_name, persist_result=False)
def reproduce_version(model: str, force: bool = False, checked: RunChecks | None = None) -> Reproduced:
    """Train a registered version again on the config it was trained with, register the result
    tagged ``reproduces=<version>`` (the gate decides its alias) and compare each test metric.

    Args:
        model: the version, NAME/VERSION (NAME@ALIAS: the version the alias points at now).
        force: reproduce it although its data's fingerprint or the code's git commit changed;
            without it, either is refused in one line.
        checked: a training run's checks of the version's config (``run_checks.before_run``);
            None: the flow checks for itself."""
    one_line_expected_errors()
    # check: the exact config, its data and code against the version's lineage; no Ray worker yet
    found = run_checks.before_reproduce(model, force=force, run=checked)
    original = found.original
    for change in found.changed:
        get_run_logger().warning("reproducing %s although %s (force)", original.ref, change)
    # train, evaluate, register: the training flow on the version's config
    result = training_pipeline(config=original.config, checked=found.run)
    # compare: the new version tagged reproduces=<version>, each test metric beside the original's
    return compare_reproduction(original.version, original.metrics, result, found.changed)
