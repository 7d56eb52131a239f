"""The drift step: this run's train split against the champion's, before training."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import DriftConfig, PipelineConfig
from trainflow.files import write_text
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.drift import compare as drift_measure
from trainflow.tasks import render
from trainflow.tasks.results import Drifted, Prepared
from trainflow.tasks.steps import as_config, expect, run_id, step
from trainflow.workspace import workspace

REPORT = "drift.json"


@step(name="drift", cache_policy=NO_CACHE)
def drift(config: PipelineConfig | dict | str, prepared: Prepared) -> Drifted:
    """Each feature of the prepared train split against the champion's saved profile (PSI,
    a KS test for numbers, the label's distribution), published as a table and a plot.
    A drifted feature is logged; under ``drift.action: block`` it stops the run in one
    line (:class:`~trainflow.pipelines.drift.compare.DataDrift`). Without a champion,
    or one registered before profiles were saved, it says so and returns."""
    config = as_config(config, "drift")
    expect(prepared, Prepared, "drift", "prepared", "preprocess")
    settings = config.drift or DriftConfig()
    logger = get_run_logger()
    reference = drift_measure.registered_profile(workspace(), config.name)
    if reference is None or reference.profile is None:
        logger.info(line := _nothing_to_compare(config.name, reference))
        return Drifted(action=settings.action, summary=line, prepared=prepared.fingerprint)
    report = drift_measure.compare_with(reference.profile, _new_profile(prepared), settings)
    report.reference = str(reference)
    files = _write(report, workspace().home / "drift" / f"{config.name}-{run_id()}")
    create_markdown_artifact(
        key=f"{render.artifact_key(config.name)}-drift",
        markdown=render.drift_markdown(config.name, report.summary(), report.rows(), files[-1]),
        description=f"{config.name}: drift of the train split from {reference}",
    )
    return _decided(settings, report, files, prepared, logger)


def _nothing_to_compare(name: str, reference: drift_measure.Reference | None) -> str:
    if reference is None:
        return f"drift: {name} has no champion to compare with; training goes on"
    return (
        f"drift: {reference} was registered without a data profile; nothing to compare with, training goes on"
    )


def _new_profile(prepared: Prepared) -> dict:
    found = profiles.load(prepared.path)
    if found is None:
        raise DataError(
            f"drift: the prepared splits at {prepared.path} hold no {profiles.PROFILE}; "
            "delete that cache entry and prepare them again"
        )
    return found


def _write(report: drift_measure.DriftReport, folder: Path) -> list[str]:
    """The report as JSON (every feature, its bins' shares) and its plot, in ``folder``."""
    data = json.dumps({"summary": report.summary(), **report.to_dict()}, indent=1)
    write_text(folder / REPORT, data)
    return [str(folder / REPORT), str(drift_measure.drift_png(report, folder / drift_measure.DRIFT_PNG))]


def _decided(
    settings: DriftConfig, report: drift_measure.DriftReport, files: list[str], prepared: Prepared, logger
):
    """The step's result; DataDrift when a feature drifted and drift.action is block."""
    if not report.drifted:
        logger.info("drift: %s", report.summary())
    elif settings.action == "block":
        raise drift_measure.DataDrift(
            f"drift.action block: {report.summary()}; training stopped. To train anyway, set "
            "drift.action: warn (or raise drift.psi, lower drift.ks_pvalue)"
        )
    else:
        logger.warning("drift: %s; training goes on (drift.action %s)", report.summary(), settings.action)
    drifted = [f.feature for f in sorted(report.drifted, key=lambda f: -f.psi)]
    return Drifted(
        reference=report.reference,
        action=settings.action,
        drifted=drifted,
        summary=report.summary(),
        rows=report.rows(),
        reports=files,
        prepared=prepared.fingerprint,
    )
