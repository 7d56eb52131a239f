"""Loading a config: from a dict, a YAML or JSON file or the defaults, plus dotted
overrides; and the smaller config a smoke run trains with."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from trainflow.config.objective import renamed_key
from trainflow.config.overrides import merge, parse_overrides
from trainflow.config.pipeline import PipelineConfig, validate_config
from trainflow.config.sections import ConfigError
from trainflow.config.sweep import check_sweep_space


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML or JSON (by its suffix) config file holds; {} for an empty file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: no such file")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"config file {path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def load_config(
    source: PipelineConfig | Mapping[str, Any] | str | Path | None = None,
    overrides: Iterable[str] = (),
) -> PipelineConfig:
    """Validate a config from a dict, a YAML/JSON file or the defaults, plus overrides."""
    if isinstance(source, PipelineConfig):
        raw = source.model_dump(mode="json")
    elif isinstance(source, Mapping):
        raw = dict(source)
    elif source is None:
        raw = {}
    else:
        raw = read_config_file(source)
    updates = parse_overrides(overrides)
    try:
        # Each spelled with objective's new name before they merge: `--set task=regression`
        # overrides a file's `objective:`, as `--set objective=regression` does.
        raw = merge(renamed_key(raw), renamed_key(updates))
    except ValueError as e:
        raise ConfigError(f"invalid config: {e}") from None
    config = validate_config(raw)
    if config.sweep is not None:
        check_sweep_space(config)
    return config


# What `--smoke` changes: a small sample, one epoch, one worker, and its own registered
# model, so that checking a new config end to end never touches the real champion.
SMOKE_OVERRIDES = {
    "data": {"limit": 600},
    "train": {"epochs": 1},
    "scaling": {"num_workers": 1},
    "registry": {"min_value": None},
}


def smoke_config(config: PipelineConfig) -> PipelineConfig:
    """The config as a smoke run: every check of a real run, then one epoch on a small sample."""
    raw = merge(config.model_dump(mode="json"), SMOKE_OVERRIDES)
    raw["name"] = f"{config.name}-smoke"
    return PipelineConfig.model_validate(raw)
