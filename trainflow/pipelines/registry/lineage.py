"""Where a version comes from, and proof that its files are the ones registered.

Lineage tags name the config, data, test split, Ray run, Prefect flow run and git
commit of a version. Every version owns a copy of its checkpoint folder as its
artifact, with the SHA-256 of each file, so it outlives Ray's run folders and an
altered copy is refused.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

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
