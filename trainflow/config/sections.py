"""What every section of a run's config shares: the base class, the way a field's
annotation names the section it holds, and the form of a user's callable.

The sections themselves live by concern: ``data`` (data, split, preprocess), ``training``
(model, train, early stopping), ``resources`` (scaling, failure, ray) and ``outputs``
(checkpoint, evaluation, registry). Each field carries its ``description``: the config
reference page and ``configs/digits.yaml``'s comments are made from them
(``trainflow.config.reference``).
"""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict

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
