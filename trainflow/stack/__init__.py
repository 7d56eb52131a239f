"""A team's services on one machine, one command away (``trainflow stack``): PostgreSQL,
an MLflow tracking server on it with its artifact store, a Prefect server on the same
PostgreSQL, a Ray cluster of two nodes with token auth, and a Prefect worker on
trainflow's pool with the deployments applied; all on loopback, in a folder of their own.

:mod:`.services` starts and stops the processes; :mod:`.control` is the stack as a whole
(``up``, ``status``, ``env_lines``, ``down``)."""

from trainflow.stack.control import Health, Stack, default_folder, down, env_lines, status, up
from trainflow.stack.services import StackError

__all__ = ["Health", "Stack", "StackError", "default_folder", "down", "env_lines", "status", "up"]
