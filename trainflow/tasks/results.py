"""The small, serializable values that pass between steps: paths, fingerprints, metrics.
Never Ray Datasets, models or Ray Results: big objects stay in storage. (The ingest step
returns the pipelines' own SourceInfo, already small and plain.)

Each result says what it was made from, so that a step handed a result of another
config or another run says so in one line (`StepInputError`)
instead of training or registering the wrong thing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from trainflow.config import PipelineConfig
from trainflow.files import join
from trainflow.tasks.steps import StepInputError

if TYPE_CHECKING:
    import numpy as np
    import ray.data


class Prepared(BaseModel):
    """The prepare step's splits, in the cache."""

    path: str
    """The cache entry: train/, val/ and test/ Parquet, preprocessor.json, profile.json."""
    counts: dict[str, int]
    """Rows per split: {"train": ..., "val": ..., "test": ...}."""
    preprocessor: dict[str, Any]
    """The state fitted on the train split (Preprocessor.to_dict): scaling, categories, classes."""
    num_features: int
    """Numbers per row the model takes."""
    num_outputs: int
    """The model's outputs: the number of classes, 1 for a regression."""
    fingerprint: str
    """The entry's key: the input's fingerprint, the split and the preprocess settings."""
    reused: bool
    """Whether a finished entry with the same key was found and used as is."""
    dropped: int = 0
    """Rows dropped for a missing value (data.missing: drop)."""
    source_fingerprint: str = ""
    """The input's own fingerprint (SourceInfo.fingerprint)."""
    preparation: str = ""
    """PipelineConfig.preparation_hash() of the config that prepared it."""

    def split_path(self, name: str) -> str:
        return join(self.path, name)

    def dataset(self, name: str) -> ray.data.Dataset:
        """A split as a lazy Ray Dataset: ``features``, ``label`` and a transform's
        array columns, a tensor of its shape per row."""
        from trainflow.pipelines.data.entry import split_dataset

        return split_dataset(self.split_path(name))

    def read_split(self, name: str) -> dict[str, np.ndarray]:
        """A whole split in this process's memory: one NumPy array per column."""
        from trainflow.pipelines.data.entry import read_split

        return read_split(self.split_path(name))

    def check_made_for(self, config: PipelineConfig, step: str) -> None:
        """StepInputError unless ``config``'s data, preprocess and objective sections prepared this."""
        if self.preparation and self.preparation != config.preparation_hash():
            raise StepInputError(
                f"{step}: prepared was made by a config whose data, preprocess or objective differ from "
                f"{config.name}'s; prepare with this config: preprocess(config, ingest(config))"
            )


class Trained(BaseModel):
    """A training run's best checkpoint and how it got there."""

    run_name: str
    """The Ray Train run's name under storage."""
    run_path: str
    """The run's folder: its checkpoints and its record for --resume."""
    best_checkpoint: str
    """The folder of the checkpoint with the best checkpoint.metric."""
    best_metrics: dict[str, Any]
    """That checkpoint's epoch row: epoch, train_loss, val_loss, val_accuracy, ..."""
    history: list[dict[str, float]]
    """Every epoch's row, in order."""
    status: str = "completed"
    """completed, or early_stopped."""
    starts: list[int] = []
    """The epoch each start of the worker group resumed after, in this attempt of the
    step: [0] ran from scratch; [0, 3] lost a worker and resumed after epoch 3."""
    nodes: list[str] = []
    """The Ray node ids the training workers ran on."""
    sizes: list[int] = []
    """The workers of each start: an elastic run's resizes."""
    config_hash: str = ""
    """The config it trained with (PipelineConfig.config_hash())."""
    prepared: str = ""
    """The prepared splits it trained on (Prepared.fingerprint)."""

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
    """The checkpoint scored."""
    metrics: dict[str, Any]
    """The test split's metrics: the objective's, the user's evaluation.metrics, per-class tables."""
    reports: list[str] = []
    """PNG plots: the learning curve; the confusion matrix, or a regression's predicted
    against true and its residuals."""

    @property
    def headline(self) -> dict[str, float]:
        """The scalar metrics (accuracy, macro_f1), without the per-class tables."""
        return {k: v for k, v in self.metrics.items() if isinstance(v, float)}


class Drifted(BaseModel):
    """The drift step's measure of a run's train split against the champion's."""

    reference: str = ""
    """The version compared with ("digits version 3"); empty when there was none."""
    action: str = "warn"
    """drift.action: warn, block or retrain."""
    drifted: list[str] = []
    """The features that drifted, the highest PSI first."""
    summary: str = ""
    """The drift in one line."""
    rows: list[dict[str, Any]] = []
    """The table: a row per feature."""
    reports: list[str] = []
    """drift.json and drift.png, logged with the registered version."""
    prepared: str = ""
    """The prepared splits the drift was computed on (Prepared.fingerprint)."""

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
    """The model version the register step made, and what the gate decided."""

    name: str
    """The registered model's name (the config's name)."""
    version: str
    """The model version made, as MLflow numbers it."""
    aliases: list[str] = []
    """The aliases pointing at it after the gate: champion when it won."""
    run_id: str
    """The MLflow run that holds its checkpoint, metrics and model card."""
    champion: bool
    """Whether the gate moved champion to it."""
    decision: dict[str, Any]
    """The gate's decision (GateDecision as a dict): passed, the metric, the candidate's and
    the champion's values, the champion's version and the reason in words."""
    source: str
    """Where the version's files are: its MLflow source URI."""


class PipelineResult(BaseModel):
    """What ``training_pipeline`` returns: the registered version, the test metrics, where
    the time went."""

    name: str
    """The config's name, the registered model's."""
    config_hash: str
    """PipelineConfig.config_hash() of the run's config."""
    test_metrics: dict[str, float]
    """The test split's scalar metrics."""
    registered: Registered
    """The version registered."""
    checkpoint: str
    """The best checkpoint's folder."""
    prepared_reused: bool
    """Whether the prepared splits came from the cache."""
    timings: dict[str, float]
    """Seconds per step."""
    cached: list[str] = []
    """Steps Prefect skipped: their cached result from an earlier run held."""


class Swept(BaseModel):
    """A finished sweep: every trial, and the best one as a training run."""

    name: str
    """The Ray Tune experiment's folder under the runs storage."""
    path: str
    """That folder's path."""
    trials: list[dict[str, Any]]
    """Every trial (pipelines.sweep.run.TrialSummary as dicts), in trial order."""
    best_trial: str
    """The best trial's Ray Tune id."""
    best_config: dict[str, Any]
    """The best trial's whole config, as trainflow run takes it."""
    best_config_path: str
    """The same as YAML."""
    trained: Trained
    """The best trial's best checkpoint, for the evaluate and register steps."""


class SweepResult(BaseModel):
    """What ``sweep_pipeline`` returns: every trial, and the best one's registered version."""

    name: str
    """The config's name, the registered model's."""
    sweep: str
    """The Ray Tune experiment's folder."""
    trials: list[dict[str, Any]]
    """Every trial, in trial order."""
    best_trial: str
    """The best trial's Ray Tune id."""
    best_config_path: str
    """The best trial's config as YAML, for trainflow run."""
    max_concurrent: int
    """How many trials ran at once."""
    test_metrics: dict[str, float]
    """The best trial's test metrics."""
    registered: Registered
    """The version registered from the best trial."""
    checkpoint: str
    """The best trial's best checkpoint."""
    timings: dict[str, float]
    """Seconds per step."""


class Reproduced(BaseModel):
    """A registered version trained again: the version it reproduces, both versions' test
    metrics, and the new version's training run."""

    of: str
    """The version reproduced."""
    original_metrics: dict[str, float]
    """Its test metrics."""
    differences: dict[str, float]
    """Each test metric both have: the reproduction's minus the original's."""
    result: PipelineResult
    """The reproduction's training run, its registered version among it."""
    changed: list[str] = []
    """What differed from the original's data and code, let through by --force."""
