"""Ray's private names that a driver through Ray Client (``ray://``) needs; the rest of
the quarantine is :mod:`trainflow.ray_internals`.

11. A worker setup hook through Ray Client (:func:`with_setup_hook`). The environment
    variable ``ray._private.ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR``, which
    ``ray.init`` sets from a runtime_env's ``worker_process_setup_hook`` in a driver on
    the cluster, and Ray Client's ``ray.init`` never does: the hook does not run in the
    workers, and their INFO lines (a report per worker per epoch) reach the console.
    Moved: the runtime_env keeps its public key; through Ray Client the hook does not
    run, and the workers' lines show.
"""

from __future__ import annotations


def with_setup_hook(runtime_env: dict) -> dict:
    """``runtime_env`` for a Ray Client ``ray.init``: its ``worker_process_setup_hook`` (a
    module path) set as the variable a driver on the cluster would set."""
    hook = runtime_env.get("worker_process_setup_hook")
    if not isinstance(hook, str):
        return runtime_env
    try:
        from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    except ImportError:
        return runtime_env
    env_vars = {**runtime_env.get("env_vars", {}), WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}
    return {**runtime_env, "env_vars": env_vars}
