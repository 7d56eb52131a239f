"""What every section of a run's config shares: the base class, the way a field's
annotation names the section it holds, and the form of a user's callable; and
ConfigError, the one-line message it carries for what pydantic refuses, and names listed
short enough for one line.

The sections themselves live by concern: ``data`` (data, split, preprocess), ``training``
(model, train, early stopping), ``resources`` (scaling, failure, ray) and ``outputs``
(checkpoint, evaluation, registry). Each field carries its ``description``: the config
reference page and ``configs/digits.yaml``'s comments are made from them
(``trainflow.config.reference``).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

# A user's callable: package.module:name.
HOOK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class Section(BaseModel):
    """A part of the config: unknown keys are refused, and so are wrong values set later."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The section class behind a field's annotation: ``EarlyStoppingConfig | None`` gives
    EarlyStoppingConfig, ``dict[str, Dimension]`` its values' Dimension; None for a value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def hook_path(v: str) -> str:
    """``v`` when it names a callable as ``package.module:name``; else ValueError saying so."""
    if not HOOK.fullmatch(v):
        raise ValueError(f"{v!r} is not package.module:name (such as mycode.losses:focal)")
    return v


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what would be valid."""


def validation_message(err: ValidationError, root: type[BaseModel]) -> str:
    """Every error of ``err`` on one line, each named by its dotted field; an unknown key
    lists the valid keys of its section, found from ``root``, the model validated."""
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key; valid keys here: {', '.join(_keys_at(root, e['loc'][:-1]))}"
        elif not e["loc"]:  # a rule across sections: the message names its fields
            parts.append(msg)
            continue
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        if e["type"] == "string_type" and isinstance(e.get("input"), bool):
            msg = f"{msg}: YAML reads unquoted no/yes, off/on and false/true as booleans; quote it"
        parts.append(f"{field}: {msg}")
    return "invalid config: " + "; ".join(parts)


def _keys_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the section at ``loc`` under ``root``. A key of a mapping of sections
    (a field of ``sweep.space``) is no field: the walk stays on the mapping's section."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is not None and str(part) in model.model_fields:
            model = section_type(model.model_fields[str(part)].annotation)
    return list(model.model_fields) if model is not None else []


def listed(names: Sequence[str], most: int = 10) -> str:
    """``names`` comma-separated for a one-line message: the first ``most`` of them, then
    how many there are in all when that is more."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"
