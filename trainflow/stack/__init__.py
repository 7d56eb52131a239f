"""A team's services on one machine, one command away (``trainflow stack``): PostgreSQL,
an MLflow tracking server on it with its artifact store, a Prefect server on the same
PostgreSQL, a Ray cluster of two nodes with token auth, and a Prefect worker on
trainflow's pool with the deployments applied; all on loopback, in a folder of their own.

:mod:`.services` starts and stops the processes; :mod:`.mlflow_env` makes MLflow's full
environment, which its MLflow server runs on; :mod:`.control` is the stack as a whole
(``up``, ``status``, ``env_lines``, ``down``). Those names are imported on first use: the
``trainflow`` command asks the warm start's forkserver (:mod:`.forkserver`) for a child
before it imports them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.stack.control import Health, Stack, default_folder, down, env_lines, status, up
    from trainflow.stack.services import StackError

_FROM = {
    **dict.fromkeys(("Health", "Stack", "default_folder", "down", "env_lines", "status", "up"), "control"),
    "StackError": "services",
}


def __getattr__(name: str):
    if name in _FROM:
        return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Health", "Stack", "StackError", "default_folder", "down", "env_lines", "status", "up"]
