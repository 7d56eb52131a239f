"""Where a version comes from, and proof that its files are the ones registered.

Lineage tags name the config, data, test split, Ray run, Prefect flow run and git
commit of a version. Every version owns a copy of its checkpoint folder as its
artifact, with the SHA-256 of each file, so it outlives Ray's run folders and an
altered copy is refused: a version's folder on this machine (:func:`local_checkpoint`) is
checked each time it is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainflow.files import publishing_folder
from trainflow.pipelines.registry.store import tracking_uri

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

    from trainflow.workspace import Workspace

CONFIG_HASH_TAG = "trainflow.config_hash"
DATA_FINGERPRINT_TAG = "trainflow.data_fingerprint"
GIT_COMMIT_TAG = "git.commit"
TEST_FINGERPRINT_TAG = "trainflow.test_fingerprint"
HASHES_TAG = "trainflow.sha256"
HASHES_FILE = "hashes.json"


class IntegrityError(ValueError):
    """A registered checkpoint whose files are missing or differ from what was registered."""


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The checked-out commit of the code that runs, when it runs from a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def lineage_tags(
    *,
    config_hash: str,
    data_fingerprint: str,
    test_fingerprint: str,
    ray_run: str,
    best_epoch: int,
    flow_run_id: str | None,
) -> dict[str, str]:
    """The tags that say where a version came from: config, data, test split, Ray run,
    Prefect flow run and git commit (the last two when there is one)."""
    tags = {
        CONFIG_HASH_TAG: config_hash,
        DATA_FINGERPRINT_TAG: data_fingerprint,
        TEST_FINGERPRINT_TAG: test_fingerprint,
        "trainflow.ray_run": ray_run,
        "trainflow.best_epoch": str(best_epoch),
    }
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    commit = git_commit()
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    return tags


def file_hashes(folder: str | Path) -> dict[str, str]:
    """SHA-256 of every file in a checkpoint folder, by its path relative to the folder."""
    folder = Path(folder)
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel != HASHES_FILE:
            out[rel] = _sha256(path)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_files(folder: str | Path, expected: dict[str, str], what: str) -> None:
    """Refuse a folder with a missing file or a file whose SHA-256 differs from ``expected``."""
    folder = Path(folder)
    missing = [rel for rel in sorted(expected) if not (folder / rel).is_file()]
    if missing:
        raise IntegrityError(
            f"{what}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from {folder}; "
            "registered with the model"
        )
    for rel, digest in sorted(expected.items()):
        if _sha256(folder / rel) != digest:
            raise IntegrityError(
                f"{what}: {rel} in {folder} differs from the file registered (SHA-256 mismatch); "
                "the checkpoint was altered after registration"
            )


def local_checkpoint(ws: Workspace, mv: ModelVersion) -> Path:
    """The version's checkpoint folder on this machine, downloaded once, checked every time."""
    from mlflow.artifacts import download_artifacts

    local = ws.home / "models" / mv.name / str(mv.version)
    if not local.is_dir():
        # A half-copied model is never loaded; a copy another process finished first is kept.
        with publishing_folder(local, finished=Path.is_dir) as tmp, _no_progress_bar():
            got = Path(
                download_artifacts(artifact_uri=mv.source, dst_path=str(tmp), tracking_uri=tracking_uri(ws))
            )
            if got != tmp:  # the artifacts came in a folder of their own: lift its files
                for item in got.iterdir():
                    item.rename(tmp / item.name)
                got.rmdir()
    expected = mv.tags.get(HASHES_TAG)
    if expected:
        verify_files(local, json.loads(expected), f"{mv.name} version {mv.version}")
    return local


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow draws a progress bar on stderr for a few small files; a command's one-line
    error or a Prefect log should not start with it. The user's own setting wins."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if key in os.environ:
        yield
        return
    os.environ[key] = "false"
    try:
        yield
    finally:
        os.environ.pop(key, None)
