"""The small, serializable values that pass between steps: paths, fingerprints, metrics.
Never Ray Datasets, models or Ray Results: big objects stay in storage. (The ingest step
returns the pipelines' own SourceInfo, already small and plain.)

Each result says what it was made from, so that a step handed a result of another
config or another run says so in one line (:class:`~trainflow.tasks.steps.StepInputError`)
instead of training or registering the wrong thing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trainflow.config import PipelineConfig
from trainflow.files import join
from trainflow.tasks.steps import StepInputError


class Prepared(BaseModel):
    """The prepare step's splits, in the cache."""

    path: str  # the cache entry: train/, val/, test/ Parquet and preprocessor.json
    counts: dict[str, int]
    preprocessor: dict[str, Any]
    num_features: int
    num_outputs: int
    fingerprint: str  # the input's fingerprint plus the split and preprocess settings
    reused: bool  # a finished entry with the same key was found and used as is
    dropped: int = 0  # rows dropped for a missing value (data.missing=drop)
    source_fingerprint: str = ""  # the input's own (SourceInfo.fingerprint)
    preparation: str = ""  # PipelineConfig.preparation_hash() of the config that prepared it

    def split_path(self, name: str) -> str:
        return join(self.path, name)

    def check_made_for(self, config: PipelineConfig, step: str) -> None:
        """StepInputError unless ``config``'s data, preprocess and task sections prepared this."""
        if self.preparation and self.preparation != config.preparation_hash():
            raise StepInputError(
                f"{step}: prepared was made by a config whose data, preprocess or task differ from "
                f"{config.name}'s; prepare with this config: preprocess(config, ingest(config))"
            )


class Trained(BaseModel):
    """A training run's best checkpoint and how it got there."""

    run_name: str
    run_path: str
    best_checkpoint: str
    best_metrics: dict[str, Any]
    history: list[dict[str, float]]
    status: str = "completed"  # completed | early_stopped
    # The epoch each start of the worker group resumed after, in this attempt of the
    # task: [0] ran from scratch; [0, 3] lost a worker and resumed after epoch 3.
    starts: list[int] = []
    nodes: list[str] = []  # the Ray node ids the training workers ran on
    sizes: list[int] = []  # the workers of each start: an elastic run's resizes
    config_hash: str = ""  # the config it trained with (PipelineConfig.config_hash())
    prepared: str = ""  # the prepared splits it trained on (Prepared.fingerprint)

    def check_trained_on(self, prepared: Prepared, step: str) -> None:
        """StepInputError unless this was trained on ``prepared``."""
        if self.prepared and self.prepared != prepared.fingerprint:
            raise StepInputError(
                f"{step}: trained ({self.run_name}) was trained on other prepared data than prepared "
                f"({prepared.fingerprint}); give it the prepared splits the training used"
            )

    def check_trained_with(self, config: PipelineConfig, step: str) -> None:
        """StepInputError unless this was trained with ``config``."""
        if self.config_hash and self.config_hash != config.config_hash():
            raise StepInputError(
                f"{step}: trained ({self.run_name}) was trained with another config than {config.name} "
                f"(config hash {self.config_hash[:8]}, this one {config.config_hash()[:8]}); "
                "register with the config it trained with"
            )


class Evaluated(BaseModel):
    """The best checkpoint's metrics on the test split."""

    checkpoint: str
    metrics: dict[str, Any]
    reports: list[str] = []  # PNG plots: learning curve, confusion matrix

    @property
    def headline(self) -> dict[str, float]:
        """The scalar metrics (accuracy, macro_f1), without the per-class tables."""
        return {k: v for k, v in self.metrics.items() if isinstance(v, float)}


class Drifted(BaseModel):
    """The drift step's measure of a run's train split against the champion's."""

    reference: str = ""  # the version compared with ("digits version 3"); "" when none was
    action: str = "warn"  # drift.action: warn, block or retrain
    drifted: list[str] = []  # the features that drifted, the highest PSI first
    summary: str = ""  # the drift in one line
    rows: list[dict[str, Any]] = []  # the table: a row per feature
    reports: list[str] = []  # drift.json and drift.png, logged with the registered version
    prepared: str = ""  # the prepared splits the drift was computed on (Prepared.fingerprint)

    @property
    def retrain(self) -> bool:
        """Whether drift asks for training (drift.action retrain, and a feature drifted)."""
        return self.action == "retrain" and bool(self.drifted)

    def check_measured(self, prepared: Prepared, step: str) -> None:
        """StepInputError unless this measured ``prepared``."""
        if self.prepared and self.prepared != prepared.fingerprint:
            raise StepInputError(
                f"{step}: drifted measured other prepared splits ({self.prepared}) than prepared "
                f"({prepared.fingerprint}); give it what drift returned for these splits"
            )


class Registered(BaseModel):
    name: str
    version: str
    aliases: list[str] = []
    run_id: str
    champion: bool
    decision: dict[str, Any]
    source: str


class PipelineResult(BaseModel):
    name: str
    config_hash: str
    test_metrics: dict[str, float]
    registered: Registered
    checkpoint: str
    prepared_reused: bool
    timings: dict[str, float]  # seconds per step
    cached: list[str] = []  # steps Prefect skipped: their cached result from an earlier run held


class Swept(BaseModel):
    """A finished sweep: every trial, and the best one as a training run."""

    name: str  # the Ray Tune experiment's folder under the runs storage
    path: str
    trials: list[dict[str, Any]]  # pipelines.training.sweep.TrialSummary as dicts, in trial order
    best_trial: str
    best_config: dict[str, Any]  # the best trial's whole config, as `trainflow run` takes it
    best_config_path: str  # the same as YAML
    trained: Trained  # the best trial's best checkpoint, for the evaluate and register tasks


class SweepResult(BaseModel):
    name: str
    sweep: str
    trials: list[dict[str, Any]]
    best_trial: str
    best_config_path: str
    max_concurrent: int
    test_metrics: dict[str, float]
    registered: Registered
    checkpoint: str
    timings: dict[str, float]


class Reproduced(BaseModel):
    """A registered version trained again: the version it reproduces, both versions' test
    metrics, and the new version's training run."""

    of: str  # the version reproduced
    original_metrics: dict[str, float]  # its test metrics
    differences: dict[str, float]  # each test metric both have: the reproduction's minus the original's
    result: PipelineResult  # the reproduction's training run, its registered version among it
    changed: list[str] = []  # what differed from the original's data and code, let through by --force
