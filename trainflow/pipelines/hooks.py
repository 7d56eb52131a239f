"""A user's own code named in a config as ``package.module:name``: ``model.kind``'s builder,
and every other callable a config section names (``PipelineConfig.hooks``).

Each is imported here, in the driver, from the current folder or PYTHONPATH (the run
ships its module to the Ray workers: ``PipelineConfig.user_modules``), and checked before
any worker starts by :func:`call_hook` on a small sample. Every failure is one line, a
ConfigError naming the field, the callable and what went wrong.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainflow.config import ConfigError


def load_hook(field: str, path: str) -> Callable[..., Any]:
    """The callable ``path`` (``package.module:name``) names, imported here; ``field`` is
    the config field that names it, for the message when it cannot be."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name) and module_name[len(e.name) :][:1] in ("", "."):
            raise ConfigError(
                f"{field} {path}: module {e.name!r} is not importable here; put it on PYTHONPATH "
                "or run from the folder that holds it"
            ) from None
        raise ConfigError(f"{field} {path}: importing {module_name} failed: {e}") from None
    except Exception as e:
        raise ConfigError(
            f"{field} {path}: importing {module_name} failed: {type(e).__name__}: {e}"
        ) from None
    target = getattr(module, attr, None)
    if target is None:
        raise ConfigError(f"{field} {path}: module {module_name} has no {attr!r}")
    if not callable(target):
        raise ConfigError(
            f"{field} {path}: {module_name}.{attr} is a {type(target).__name__}, not a callable"
        )
    return target


def call_hook(field: str, path: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, where ``fn`` is the user's callable ``path``; anything it
    raises becomes one line naming ``field`` and ``path``."""
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise
    except Exception as e:
        message = str(e).strip().splitlines()
        raise ConfigError(
            f"{field} {path} raised {type(e).__name__}: {message[-1] if message else ''}".rstrip(": ")
        ) from None


def describe(value: Any) -> str:
    """What a callable returned, for a message that says it is not what was expected:
    ``a str``, ``a tensor of shape [8, 3]``, ``None``."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {list(shape)}"
    return f"a {type(value).__name__}"
