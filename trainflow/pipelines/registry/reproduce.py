"""A registered version trained again: its exact config, rebuilt from what was registered,
checked against the data and code it was trained on, and its reproduction compared.

A version's checkpoint holds the run's config (``config.json``, among the files whose
SHA-256 the version carries); it is the exact config when it hashes to the version's
``trainflow.config_hash`` tag. The lineage tags say what the data (its fingerprint, as
ingest computes it) and the code (the git commit) were: a reproduction on other data or
code would not answer "can I get this model again?", so it is refused unless forced.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainflow.config import ConfigError, PipelineConfig, RenamedKey, load_config
from trainflow.pipelines.models.checkpoint import CONFIG
from trainflow.pipelines.registry.lineage import CONFIG_HASH_TAG, DATA_FINGERPRINT_TAG, GIT_COMMIT_TAG
from trainflow.pipelines.registry.store import client
from trainflow.pipelines.registry.versions import RegistryError, local_checkpoint, resolve

if TYPE_CHECKING:
    from trainflow.workspace import Workspace

# The tag of a version that reproduces another: the version it reproduces.
REPRODUCES_TAG = "reproduces"


class ReproduceRefused(RegistryError):
    """A version whose data or code is no longer what it was trained on; the message names
    which, with the registered and the current value."""


@dataclass(frozen=True)
class Original:
    """The version to reproduce: its exact config, lineage and test metrics."""

    name: str
    version: str
    config: PipelineConfig
    data_fingerprint: str
    git_commit: str | None  # None: it was not trained from a git checkout
    metrics: dict[str, float]  # its test metrics, without the test_ prefix

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"


def original(ws: Workspace, uri: str) -> Original:
    """The version ``uri`` names (NAME/VERSION, or an alias: the version it points at now),
    with the config it was trained with; RegistryError in one line when that config cannot
    be rebuilt exactly."""
    mv = resolve(ws, uri)
    ref = f"{mv.name}/{mv.version}"
    registered_hash = mv.tags.get(CONFIG_HASH_TAG)
    fingerprint = mv.tags.get(DATA_FINGERPRINT_TAG)
    if not registered_hash or not fingerprint:
        raise RegistryError(
            f"{ref} has no {CONFIG_HASH_TAG} or {DATA_FINGERPRINT_TAG} tag: only a version registered by "
            "trainflow's register step can be reproduced"
        )
    config = _saved_config(ws, mv, ref, registered_hash)
    run = client(ws).get_run(mv.run_id)
    metrics = {k.removeprefix("test_"): v for k, v in run.data.metrics.items() if k.startswith("test_")}
    return Original(mv.name, str(mv.version), config, fingerprint, mv.tags.get(GIT_COMMIT_TAG), metrics)


def saved_config(ws: Workspace, uri: str) -> tuple[str, PipelineConfig]:
    """The version ``uri`` names (NAME/VERSION, or an alias: the version it points at now)
    as NAME/VERSION, and the config saved in its checkpoint (checked against its
    ``trainflow.config_hash`` tag where it has one); RegistryError in one line when there
    is none this release can read."""
    mv = resolve(ws, uri)
    ref = f"{mv.name}/{mv.version}"
    return ref, _saved_config(ws, mv, ref, mv.tags.get(CONFIG_HASH_TAG))


def _saved_config(ws: Workspace, mv, ref: str, registered_hash: str | None) -> PipelineConfig:
    """The config saved in the version's checkpoint, if it hashes as registered (any, with
    no hash registered)."""
    path = local_checkpoint(ws, mv) / CONFIG
    if not path.is_file():
        raise RegistryError(f"{ref} has no {CONFIG} in its checkpoint: its config cannot be rebuilt")
    try:
        with warnings.catch_warnings():
            # A version registered before `objective` saved `task`: the user wrote neither.
            warnings.simplefilter("ignore", RenamedKey)
            config = load_config(json.loads(path.read_text()))
    except ConfigError as e:
        raise RegistryError(
            f"{ref}: its checkpoint's {CONFIG} is not a config of this trainflow release ({e}); "
            "reproduce it with the release that trained it"
        ) from None
    if registered_hash is not None and config.config_hash() != registered_hash:
        raise RegistryError(
            f"{ref}: its checkpoint's {CONFIG} hashes {config.config_hash()}, not {registered_hash} as "
            "registered: the exact config cannot be rebuilt; reproduce it with the release that trained it"
        )
    return config


def changes(found: Original, fingerprint: str, commit: str | None) -> list[str]:
    """What differs between the data and code ``found`` was trained on and ``fingerprint``
    (the source's now) and ``commit`` (the checkout's now), one phrase each."""
    out = []
    if fingerprint != found.data_fingerprint:
        out.append(
            f"the data of {found.config.data.source} has changed (fingerprint {found.data_fingerprint} "
            f"when {found.ref} was trained, {fingerprint} now)"
        )
    if commit != found.git_commit:
        out.append(
            f"the code's git commit has changed ({found.git_commit or 'none'} when {found.ref} was "
            f"trained, {commit or 'none: not a git checkout'} now)"
        )
    return out


def check_unchanged(found: Original, fingerprint: str, commit: str | None, *, force: bool) -> list[str]:
    """ReproduceRefused when the data or code ``found`` was trained on has changed (see
    :func:`changes`), unless ``force``; return the changes let through."""
    changed = changes(found, fingerprint, commit)
    if changed and not force:
        raise ReproduceRefused(
            f"cannot reproduce {found.ref}: {'; '.join(changed)}; --force reproduces it anyway"
        )
    return changed


def mark_reproduction(ws: Workspace, name: str, version: str, of: str) -> None:
    """Tag ``version`` as the reproduction of version ``of``."""
    client(ws).set_model_version_tag(name, version, REPRODUCES_TAG, of)


def differences(original_metrics: dict[str, float], reproduced: dict[str, float]) -> dict[str, float]:
    """Each test metric both have: the reproduction's value minus the original's."""
    return {k: float(reproduced[k]) - float(v) for k, v in original_metrics.items() if k in reproduced}
