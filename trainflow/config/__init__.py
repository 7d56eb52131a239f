"""The config schema: one typed place for every setting of a training run.

By concern: ``sections`` (what every section shares; ``ConfigError``), ``data`` (data,
split, preprocess), ``drift`` (how far new data may move from the champion's, and what then),
``training`` (model, train, early stopping), ``resources`` (scaling, failure, ray),
``outputs`` (checkpoint, evaluation, registry), ``sweep`` (the sweep section: search space,
scheduler; a sweep's space checked, a trial's config), ``pipeline`` (``PipelineConfig``:
the sections together, the rules across them, its hashes), ``objective`` (what each
objective measures and trains with), ``overrides`` (dotted ``train.lr=0.01`` overrides),
``load`` (``load_config``, ``smoke_config``) and
``reference`` (the reference page and the sample config, made from the fields'
descriptions).
Everything is importable from ``trainflow.config``.
"""

from trainflow.config.data import DataConfig, PreprocessConfig, SplitConfig, TokenizerConfig
from trainflow.config.drift import DRIFT_ACTIONS, DriftConfig
from trainflow.config.load import SMOKE_OVERRIDES, load_config, read_config_file, smoke_config
from trainflow.config.objective import (
    EPOCH_METRICS,
    LOWER_IS_BETTER,
    OBJECTIVE_LOSSES,
    OBJECTIVE_METRICS,
    OBJECTIVES,
    REGRESSION_DEFAULTS,
    RenamedKey,
    headline_metrics,
)
from trainflow.config.outputs import CheckpointSection, EvaluationConfig, RegistryConfig
from trainflow.config.overrides import parse_overrides
from trainflow.config.pipeline import CACHE_SCHEMES, PipelineConfig
from trainflow.config.resources import FailureSection, RayConfig, ScalingSection
from trainflow.config.sections import HOOK, ConfigError, hook_path
from trainflow.config.sweep import (
    DIMENSION_KINDS,
    SWEEPABLE_SECTIONS,
    Dimension,
    SweepConfig,
    SweepScheduler,
    check_sweep_space,
    trial_config,
)
from trainflow.config.training import (
    LOOP_RESERVED,
    LOOP_SETTINGS,
    MODEL_KIND,
    EarlyStoppingConfig,
    ModelConfig,
    TrainConfig,
    user_module_of,
)

__all__ = [
    "CACHE_SCHEMES",
    "DIMENSION_KINDS",
    "DRIFT_ACTIONS",
    "EPOCH_METRICS",
    "LOOP_RESERVED",
    "LOOP_SETTINGS",
    "LOWER_IS_BETTER",
    "MODEL_KIND",
    "REGRESSION_DEFAULTS",
    "SMOKE_OVERRIDES",
    "SWEEPABLE_SECTIONS",
    "OBJECTIVES",
    "OBJECTIVE_LOSSES",
    "OBJECTIVE_METRICS",
    "CheckpointSection",
    "ConfigError",
    "DataConfig",
    "Dimension",
    "DriftConfig",
    "EarlyStoppingConfig",
    "EvaluationConfig",
    "FailureSection",
    "ModelConfig",
    "PipelineConfig",
    "PreprocessConfig",
    "TokenizerConfig",
    "RayConfig",
    "RegistryConfig",
    "RenamedKey",
    "ScalingSection",
    "SplitConfig",
    "SweepConfig",
    "SweepScheduler",
    "TrainConfig",
    "check_sweep_space",
    "load_config",
    "parse_overrides",
    "read_config_file",
    "smoke_config",
    "trial_config",
    "HOOK",
    "hook_path",
    "user_module_of",
    "headline_metrics",
]
