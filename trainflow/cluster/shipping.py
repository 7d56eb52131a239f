"""trainflow's own package and a user's modules (``PipelineConfig.user_modules``), shipped
to Ray workers as runtime_env ``py_modules``: at ``ray.init`` for the whole job, and to
Ray Train's workers and actors on a session the run did not start."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from trainflow import ray_internals


def module_paths(modules: Iterable[str]) -> list[str]:
    """Where the top-level package (a folder) or module (a ``.py`` file) of each of
    ``modules`` lives on this machine, for Ray's runtime_env ``py_modules``: a user's code
    that the driver imports from the current folder or PYTHONPATH, which a cluster's
    workers may not have. Nothing for a module that does not import here, nor for an
    installed one (site-packages, the standard library), which every node installs."""
    return list(dict.fromkeys(path for module in modules for path in _module_path(module)))


def _module_path(module: str) -> list[str]:
    import importlib.util
    import sysconfig

    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or [])
    if len(locations) > 1:
        return []  # a namespace package spread over folders: no one folder to ship
    if locations:
        path = Path(locations[0]).resolve()
    elif spec.origin and spec.origin.endswith(".py"):
        path = Path(spec.origin).resolve()
    else:
        return []  # built in, frozen or compiled: installed with Python or a package
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    if any(path.is_relative_to(Path(root).resolve()) for root in installed):
        return []
    return [str(path)]


def trainflow_package() -> str:
    """trainflow's own package folder on this machine (an installed or a checked-out copy),
    shipped as runtime_env ``py_modules`` to a cluster the run did not start."""
    return str(Path(__file__).resolve().parents[1])


def worker_runtime_env(modules: Iterable[str]) -> dict:
    """The runtime_env of Ray Train's workers and of the actors that load a checkpoint
    (``RunConfig(worker_runtime_env=...)``, an actor's options): the user's ``modules``
    uploaded, beside the job's own ``py_modules`` (trainflow, on a cluster the run did not
    start). Ray merges a runtime_env key by key, so a worker's ``py_modules`` replace the
    job's: both are listed. Empty when there is nothing to add."""
    import ray

    extra = uploaded_modules(module_paths(modules))
    if not extra:
        return {}
    job = list(ray.get_runtime_context().runtime_env.get("py_modules") or [])
    return {"py_modules": list(dict.fromkeys([*job, *extra["py_modules"]]))}


def uploaded_modules(paths: Sequence[str]) -> dict:
    """A runtime_env whose ``py_modules`` are ``paths`` uploaded to the connected cluster
    (``gcs://`` URIs): an actor's runtime_env takes only URIs, where ``ray.init`` takes
    local paths. Ray Train's ``RunConfig(worker_runtime_env=...)`` ships them so to its
    workers on any cluster the driver is connected to, one the run did not start too."""
    import ray.util.client

    if not paths or ray.util.client.ray.is_connected():
        return {}  # through Ray Client, ray.init's runtime_env ships them to every worker
    return ray_internals.upload_py_modules(paths)
