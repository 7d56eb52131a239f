"""The drift section: how far new data may move from what the champion was trained on,
and what a run does when it moves further."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainflow.config.sections import Section

DRIFT_ACTIONS = ("warn", "block", "retrain")


class DriftConfig(Section):
    """Drift of this run's train split from the champion's, measured before training."""

    action: Literal["warn", "block", "retrain"] = Field(
        "warn",
        description="What a drifted feature does: warn logs it and trains; block stops the run "
        "before training, naming the drifted features; retrain trains as warn does, and marks "
        "drift as a reason to train for a run that starts only when something says so (for "
        "trainflow run, the same as warn).",
    )
    psi: float = Field(
        0.2,
        gt=0,
        description="A feature drifted when its population stability index against the "
        "champion's train split reaches this: under 0.1 is usually read as no change, 0.1 to "
        "0.2 as a moderate one, above 0.2 as a shift.",
    )
    ks_pvalue: float | None = Field(
        0.001,
        gt=0,
        lt=1,
        description="A numeric feature (or a regression's label) drifted too when the "
        "two-sample Kolmogorov-Smirnov test's p-value against the champion's sample falls "
        "below this; null: the PSI alone decides.",
    )
