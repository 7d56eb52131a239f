"""A sweep's trials: the search space checked against the config before any trial runs,
and one trial's config made from the sampled values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from trainflow.config.errors import ConfigError, validation_message
from trainflow.config.overrides import at_path, merge
from trainflow.config.pipeline import PipelineConfig, validate_config
from trainflow.config.sections import section_type
from trainflow.config.sweep import POPULATION_SCHEDULERS, SWEEPABLE_SECTIONS


def check_sweep_space(config: PipelineConfig) -> None:
    """Every dotted field of ``sweep.space`` exists, may vary between trials, and accepts
    each value a trial can be given (every choice, both bounds); else ConfigError naming it."""
    base = config.model_dump(mode="json")
    for path, dim in config.sweep.space.items():
        field = f"sweep.space.{path}"
        parts = path.split(".")
        section: type[BaseModel] | None = PipelineConfig
        for depth, part in enumerate(parts):
            if section is None:
                raise ConfigError(f"invalid config: {field}: {'.'.join(parts[:depth])} has no fields")
            if part not in section.model_fields:
                where = ".".join(parts[:depth]) or "the config"
                raise ConfigError(
                    f"invalid config: {field}: unknown field; valid keys of {where}: "
                    + ", ".join(section.model_fields)
                )
            section = section_type(section.model_fields[part].annotation)
        if parts[0] not in SWEEPABLE_SECTIONS:
            raise ConfigError(
                f"invalid config: {field}: only model.* and train.* fields vary between trials "
                "(a sweep prepares the data once, and every trial runs on sweep.scaling)"
            )
        if section is not None:
            raise ConfigError(f"invalid config: {field}: a section; sweep one of its fields instead")
        for value in dim.extremes():
            try:
                PipelineConfig.model_validate(merge(base, at_path(path, value)))
            except ValidationError as e:
                reason = validation_message(e, PipelineConfig).removeprefix("invalid config: ")
                if dim.kind in ("uniform", "loguniform") and "integer" in reason:
                    reason += "; integer fields take randint or choice"
                raise ConfigError(
                    f"invalid config: {field}: {dim.kind} value {value!r} does not fit: {reason}"
                ) from None
    check_population(config)


def check_population(config: PipelineConfig) -> None:
    """A population scheduler (pbt, pb2) hands a trial another's checkpoint: the space holds
    train.* fields only (another model's weights would not load), not train.epochs (every
    trial trains to the same end), trainflow's own loop resumes the checkpoint, and a
    perturbation comes before the last epoch; else ConfigError naming the field."""
    sweep = config.sweep
    kind = sweep.scheduler.kind
    if kind not in POPULATION_SCHEDULERS:
        return
    for path in sweep.space:
        if not path.startswith("train.") or path == "train.epochs":
            raise ConfigError(
                f"invalid config: sweep.space.{path}: scheduler {kind} hands a trial another trial's "
                "weights mid-run, so only train.* fields other than train.epochs may vary"
            )
    if config.train.loop:
        raise ConfigError(
            f"invalid config: sweep.scheduler.kind: {kind} resumes trials from each other's "
            f"checkpoints, which trainflow's own loop does; train.loop {config.train.loop} is "
            "your own: use asha or fifo"
        )
    if sweep.scheduler.perturbation_interval >= config.train.epochs:
        raise ConfigError(
            f"invalid config: sweep.scheduler.perturbation_interval: "
            f"{sweep.scheduler.perturbation_interval} epochs is not below train.epochs "
            f"{config.train.epochs}, so no trial would be perturbed: lower it or train longer"
        )


def trial_config(config: PipelineConfig, params: Mapping[str, Any]) -> PipelineConfig:
    """One trial's config: the base config with the sampled ``params`` ("train.lr": 0.01),
    the sweep's per-trial scaling, checkpoints ranked by the sweep's metric, and no sweep
    section, so that it runs as it is with `trainflow run`."""
    sweep = config.sweep
    raw = config.model_dump(mode="json")
    raw["sweep"] = None
    raw["scaling"] = sweep.scaling.model_dump(mode="json")
    raw["checkpoint"] = {**raw["checkpoint"], "metric": sweep.metric, "mode": sweep.mode}
    for path, value in params.items():
        raw = merge(raw, at_path(path, value))
    return validate_config(raw)
