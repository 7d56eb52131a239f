"""The working folders: TRAINFLOW_HOME (default ``.trainflow`` in the working directory),
and where a config's runs keep their prepared splits (the cache) and their Ray Train runs
(the storage). Nothing is created on import: callers ask for a :func:`workspace`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainflow.config import PipelineConfig
from trainflow.files import is_uri


@dataclass(frozen=True)
class Workspace:
    """The folders under TRAINFLOW_HOME (default ``.trainflow`` in the working directory)."""

    home: Path

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    @property
    def mlflow_db(self) -> Path:
        return self.home / "mlflow.db"

    @property
    def artifacts(self) -> Path:
        return self.home / "mlartifacts"

    def ensure(self) -> Workspace:
        for folder in (self.home, self.cache, self.runs, self.artifacts):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def workspace() -> Workspace:
    home = os.environ.get("TRAINFLOW_HOME") or ".trainflow"
    return Workspace(Path(home).expanduser().resolve()).ensure()


def cache_location(config: PipelineConfig) -> str:
    """Where ``config``'s runs keep their prepared splits: its ``cache`` (a folder, made if
    missing, or a URI), else TRAINFLOW_HOME/cache."""
    if config.cache and is_uri(config.cache):
        return config.cache
    return str(cache_folder(config))


def cache_folder(config: PipelineConfig) -> Path:
    """The local folder of ``config``'s cache: its ``cache`` folder, made if missing, else
    TRAINFLOW_HOME/cache (also for a URI cache: what stays on this machine, such as
    downloaded torchvision datasets and Prefect's ingest records)."""
    if not config.cache or is_uri(config.cache):
        return workspace().cache
    folder = Path(config.cache).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def storage_location(config: PipelineConfig) -> str:
    """Where ``config``'s Ray Train runs keep their checkpoints and records: its
    ``storage`` (a folder every node mounts, or a URI), else TRAINFLOW_HOME/runs."""
    return config.storage or str(workspace().runs)
