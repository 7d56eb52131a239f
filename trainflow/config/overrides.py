"""Dotted overrides (``train.lr=0.01``) as nested dicts, and nested dicts merged into a
raw config: what the command line, smoke runs and sweep trials change."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from trainflow.config.sections import ConfigError


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["train.lr=0.01", "scaling.num_workers=1"]`` into a nested dict.

    Values are read as YAML, so ``0.01`` is a float, ``true`` a bool, ``null`` None and
    ``[1, 8, 8]`` a list.
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE such as train.lr=0.01")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {key}: cannot read value {raw!r}: {e}") from None
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is set twice")
            node = child
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` laid over it, section by section; ``base`` is left as it is."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def at_path(path: str, value: Any) -> dict[str, Any]:
    """``value`` nested at a dotted path: ``at_path("train.lr", 0.01)`` is ``{"train": {"lr": 0.01}}``."""
    out: dict[str, Any] = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out
