"""The MLflow model registry: register a checkpoint, gate the champion, load by alias.

The registry is the embedded SQLite store under TRAINFLOW_HOME unless
MLFLOW_TRACKING_URI points at an MLflow server. Every version owns a copy of its
checkpoint folder as its artifact, with the SHA-256 of each file, so it outlives Ray's
run folders and an altered copy is refused.

Two aliases: ``champion`` (the version in use) moves only when the gate passes or a
user promotes or rolls back; ``challenger`` marks the latest version that did not pass.
Every alias move is kept as a registered-model tag ``trainflow.move.NNNNNN`` (JSON), so
``rollback`` knows the previous champion and a user can read who moved what, when.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.config import LOWER_IS_BETTER
from trainflow.files import publishing_folder
from trainflow.pipelines.models.checkpoint import Predictor, load_checkpoint
from trainflow.pipelines.pyfunc import write_flavor

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from trainflow.config import RegistryConfig
    from trainflow.workspace import Workspace

CHAMPION = "champion"
CHALLENGER = "challenger"
EXPERIMENT = "trainflow"
TEST_FINGERPRINT_TAG = "trainflow.test_fingerprint"
HASHES_TAG = "trainflow.sha256"
HASHES_FILE = "hashes.json"
MOVE_TAG = "trainflow.move."
# How long to wait for a version's artifacts to be READY before an alias may point at it.
READY_TIMEOUT_S = 300


class RegistryError(ValueError):
    """A model, version or alias that does not exist, or a move that cannot be made."""


class IntegrityError(ValueError):
    """A registered checkpoint whose files are missing or differ from what was registered."""


def tracking_uri(ws: Workspace) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def _embedded() -> bool:
    return not os.environ.get("MLFLOW_TRACKING_URI")


def _artifact_location(ws: Workspace) -> str | None:
    """Where a new experiment keeps its artifacts: beside its SQLite database (the embedded
    store's, or one that MLFLOW_TRACKING_URI names), not in ./mlruns of whatever folder
    the run started in, MLflow's default for a database it did not create through a
    server; an MLflow server's own artifact root (None) otherwise."""
    if _embedded():
        return ws.artifacts.as_uri()
    uri = tracking_uri(ws)
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def _locked_database(e: BaseException) -> bool:
    return "database is locked" in str(e) or "database table is locked" in str(e)


def retry_locked(fn: Callable, *args, attempts: int = 12, **kwargs):
    """Call fn, retrying with backoff while SQLite says the database is locked.

    The embedded store is one SQLite file; flow runs registering at the same moment take
    turns on its write lock, and SQLite answers the loser "database is locked" instead
    of waiting. A locked write did not happen, so trying it again is safe.
    """
    delay = 0.05
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if attempt == attempts - 1 or not _locked_database(e):
                raise
            time.sleep(delay * (1 + (os.getpid() % 7) / 7))  # spread the processes apart
            delay = min(delay * 2, 2.0)


class _RetryingClient:
    """An MlflowClient whose every call retries while the SQLite database is locked."""

    def __init__(self, inner: MlflowClient):
        self._inner = inner

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        return functools.partial(retry_locked, attr)


@contextlib.contextmanager
def registry_lock(ws: Workspace) -> Iterator[None]:
    """One process at a time reads the champion, decides and moves aliases.

    A file lock serializes processes on this machine (the embedded store's case); with
    an MLflow server, the training flow's per-model Prefect concurrency slot does.
    """
    path = ws.home / "registry.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def client(ws: Workspace) -> MlflowClient:
    from mlflow import MlflowClient

    uri = tracking_uri(ws)
    if _embedded() and uri not in _opened:
        # A process's first client creates or upgrades the database's tables: two
        # processes doing it at once collide ("duplicate column name"), so each does it
        # under the lock, registry tables included.
        with registry_lock(ws):
            c = MlflowClient(tracking_uri=uri, registry_uri=uri)
            c.search_registered_models(max_results=1)
        _opened.add(uri)
    else:
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return _RetryingClient(c)  # type: ignore[return-value]


_opened: set[str] = set()  # the embedded stores this process has opened


def _experiment_id(c: MlflowClient, ws: Workspace) -> str:
    exp = c.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        return exp.experiment_id
    location = _artifact_location(ws)
    try:
        return c.create_experiment(EXPERIMENT, artifact_location=location)
    except Exception:
        # Another run created it between our look and our create.
        exp = c.get_experiment_by_name(EXPERIMENT)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


# --- file hashes ---------------------------------------------------------------------


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


# --- the gate ------------------------------------------------------------------------


@dataclass
class GateDecision:
    passed: bool
    metric: str
    candidate: float
    champion: float | None
    champion_version: str | None
    min_improvement: float
    min_value: float | None
    same_test_data: bool | None
    reason: str
    # True when the champion's number was measured now, on the candidate's test data.
    champion_reevaluated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Registration:
    name: str
    version: str
    run_id: str
    champion: bool
    decision: GateDecision
    source: str
    aliases: list[str]


def decide(
    metric: str,
    candidate: float,
    champion: float | None,
    gate: RegistryConfig,
    *,
    champion_version: str | None = None,
    same_test_data: bool | None = None,
    champion_reevaluated: bool = False,
    champion_note: str | None = None,
) -> GateDecision:
    """The promotion gate: clear min_value (a floor, or a ceiling for an error metric such
    as rmse), and beat the champion by min_improvement in the metric's better direction.

    A champion without a number to compare (``champion`` None) leaves min_value alone to
    decide; ``champion_note`` says why, in the reason.
    """
    common = dict(
        metric=metric,
        candidate=candidate,
        champion=champion,
        champion_version=champion_version,
        min_improvement=gate.min_improvement,
        min_value=gate.min_value,
        same_test_data=same_test_data,
        champion_reevaluated=champion_reevaluated,
    )
    lower = metric in LOWER_IS_BETTER
    bound = gate.min_value
    if bound is not None and (candidate > bound if lower else candidate < bound):
        where = "above the ceiling" if lower else "below"
        return GateDecision(False, reason=f"{metric} {candidate:.4f} is {where} min_value {bound}", **common)
    if champion is None:
        clears = f"; {metric} {candidate:.4f} clears min_value {bound}" if bound is not None else ""
        return GateDecision(True, reason=f"{champion_note or 'no champion yet'}{clears}", **common)
    where = " (champion re-evaluated on this test data)" if champion_reevaluated else ""
    # The improvement in the better direction: a fall in rmse is a positive improvement.
    improvement = champion - candidate if lower else candidate - champion
    direction = " (lower is better)" if lower else ""
    compared = (
        f"{metric} {candidate:.4f} vs champion v{champion_version} {champion:.4f}{where}: "
        f"improvement {improvement:+.4f}{direction}"
    )
    if improvement >= gate.min_improvement:
        return GateDecision(True, reason=f"{compared} >= {gate.min_improvement}", **common)
    return GateDecision(False, reason=f"{compared} < {gate.min_improvement}", **common)


def _alias(c: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


# What re-scores a champion on the candidate's test data: its local checkpoint folder in,
# its test metrics out (``accuracy``, ``macro_f1``...).
Reevaluate = Callable[[Path], dict[str, Any]]


def _champion_number(
    ws: Workspace,
    c: MlflowClient,
    champ: ModelVersion,
    metric: str,
    fingerprint: str | None,
    reevaluate: Reevaluate | None,
) -> tuple[float | None, bool, bool, str | None]:
    """The champion's metric on the candidate's test data, whether that is the data it was
    measured on, whether it was re-scored now, and why there is no number if there is none."""
    same = champ.tags.get(TEST_FINGERPRINT_TAG) == fingerprint
    if same or reevaluate is None:
        value = c.get_run(champ.run_id).data.metrics.get(f"test_{metric}")
        note = None if value is not None else f"champion v{champ.version} has no test_{metric}"
        return value, same, False, note
    try:
        scored = reevaluate(local_checkpoint(ws, champ))
    except ValueError as e:
        # Other features or classes than the new data has (DataError), or an altered
        # checkpoint (IntegrityError): the champion cannot be compared on these rows.
        return None, same, False, f"champion v{champ.version} cannot score this test data ({e})"
    if metric not in scored:  # a champion of the other task
        return None, same, False, f"champion v{champ.version} is not measured by {metric}"
    return float(scored[metric]), same, True, None


def register_checkpoint(
    ws: Workspace,
    *,
    name: str,
    checkpoint_dir: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    history: list[dict[str, Any]],
    tags: dict[str, str],
    gate: RegistryConfig,
    reevaluate: Reevaluate | None = None,
    reports: list[str] | None = None,
) -> Registration:
    """One MLflow run and model version; ``champion`` moves only if the gate passes, else
    the version becomes ``challenger``.

    ``metrics`` are the test metrics (``accuracy``, ``macro_f1``...), logged as ``test_*``;
    ``history`` the per-epoch metrics, logged with step=epoch. ``tags`` carry lineage;
    TEST_FINGERPRINT_TAG names the test data the metrics were measured on. When the
    champion was measured on other test data, ``reevaluate`` scores it on this one before
    the comparison. ``reports`` are files (plots) logged under ``reports/``.
    """
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    c = client(ws)
    run = c.create_run(
        _experiment_id(c, ws), run_name=f"{name}-{tags.get('trainflow.config_hash', '')}", tags=tags
    )
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    logged = [Metric(f"test_{k}", float(v), now, 0) for k, v in metrics.items()]
    for row in history:
        logged += [Metric(k, float(v), now, int(row["epoch"])) for k, v in row.items() if k != "epoch"]
    params_list = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
    # MLflow takes at most 1000 metrics and 100 params in one batch.
    for i in range(0, len(logged), 1000):
        c.log_batch(run_id, metrics=logged[i : i + 1000])
    for i in range(0, len(params_list), 100):
        c.log_batch(run_id, params=params_list[i : i + 100])
    hashes = _log_checkpoint(c, run_id, checkpoint_dir)
    for report in reports or []:
        c.log_artifact(run_id, report, artifact_path="reports")
    c.set_terminated(run_id)

    try:
        c.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = f"{run.info.artifact_uri}/checkpoint"
    version = c.create_model_version(
        name, source=source, run_id=run_id, tags={**tags, HASHES_TAG: json.dumps(hashes)}
    )
    # An alias must never point at a version whose artifacts are still uploading.
    _wait_until_ready(c, name, str(version.version))

    metric = gate.gate_metric
    with registry_lock(ws):
        champ = _alias(c, name, CHAMPION)
        champ_value = same = note = None
        reevaluated = False
        if champ is not None:
            champ_value, same, reevaluated, note = _champion_number(
                ws, c, champ, metric, tags.get(TEST_FINGERPRINT_TAG), reevaluate
            )
        decision = decide(
            metric,
            float(metrics[metric]),
            champ_value,
            gate,
            champion_version=str(champ.version) if champ else None,
            same_test_data=same,
            champion_reevaluated=reevaluated,
            champion_note=note,
        )
        for key, value in decision.to_dict().items():
            c.set_model_version_tag(name, version.version, f"gate.{key}", str(value))
        alias = CHAMPION if decision.passed else CHALLENGER
        _move(c, name, alias, str(version.version), action="gate", reason=decision.reason)
    aliases = list(c.get_model_version(name, version.version).aliases)
    return Registration(
        name, str(version.version), run_id, decision.passed, decision, source, sorted(aliases)
    )


def _log_checkpoint(c: MlflowClient, run_id: str, checkpoint_dir: str) -> dict[str, str]:
    """Log the checkpoint folder, with MLflow's python_function flavor (``pyfunc.py``) and
    a hashes.json beside its files; return the hashes."""
    hashes = file_hashes(checkpoint_dir)
    # A private copy (the run folder may be shared or read-only): Ray prunes its
    # checkpoints, and what is registered must be what was hashed.
    workdir = Path(tempfile.mkdtemp(prefix="trainflow-register-"))
    staged = workdir / "checkpoint"
    try:
        shutil.copytree(checkpoint_dir, staged)
        verify_files(staged, hashes, f"checkpoint {checkpoint_dir}")
        write_flavor(staged)
        hashes = file_hashes(staged)
        (staged / HASHES_FILE).write_text(json.dumps(hashes, indent=2))
        c.log_artifacts(run_id, str(staged), artifact_path="checkpoint")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return hashes


def _wait_until_ready(c: MlflowClient, name: str, version: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        mv = c.get_model_version(name, version)
        if mv.status == "READY":
            return
        if mv.status == "FAILED_REGISTRATION" or time.monotonic() > deadline:
            raise RegistryError(
                f"{name} version {version} is {mv.status} ({mv.status_message or 'no message'}); "
                "no alias was moved to it"
            )
        time.sleep(0.5)


# --- alias moves and their history ---------------------------------------------------


def moves(c: MlflowClient, name: str) -> list[dict[str, Any]]:
    """Every alias move of a registered model, oldest first."""
    rm = c.get_registered_model(name)
    return [json.loads(v) for k, v in sorted(rm.tags.items()) if k.startswith(MOVE_TAG)]


def _move(c: MlflowClient, name: str, alias: str, version: str, *, action: str, reason: str) -> dict:
    """Point ``alias`` at ``version`` and record the move. Call it under registry_lock."""
    before = _alias(c, name, alias)
    c.set_registered_model_alias(name, alias, version)
    if alias == CHAMPION:
        # A challenger that becomes champion is no longer a challenger.
        challenger = _alias(c, name, CHALLENGER)
        if challenger is not None and str(challenger.version) == version:
            c.delete_registered_model_alias(name, CHALLENGER)
    record = {
        "alias": alias,
        "version": version,
        "previous": str(before.version) if before else None,
        "action": action,
        "reason": reason,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "by": _user(),
    }
    n = len(moves(c, name)) + 1
    c.set_registered_model_tag(name, f"{MOVE_TAG}{n:06d}", json.dumps(record))
    return record


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def champion_stack(history: list[dict[str, Any]]) -> list[str]:
    """The champions in the order they took over; a rollback pops the latest."""
    stack: list[str] = []
    for m in history:
        if m["alias"] != CHAMPION:
            continue
        if m["action"] == "rollback":
            if stack:
                stack.pop()
        elif not stack or stack[-1] != m["version"]:
            stack.append(m["version"])
    return stack


def _require_model(c: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        c.get_registered_model(name)
    except MlflowException:
        known = sorted(rm.name for rm in c.search_registered_models())
        raise RegistryError(
            f"unknown model {name!r}; registered models: {', '.join(known) or 'none'}"
        ) from None


def _require_version(c: MlflowClient, name: str, version: str) -> ModelVersion:
    from mlflow.exceptions import MlflowException

    _require_model(c, name)
    try:
        return c.get_model_version(name, version)
    except MlflowException:
        versions = sorted(int(v.version) for v in c.search_model_versions(f"name='{name}'"))
        raise RegistryError(
            f"{name} has no version {version}; its versions: {', '.join(map(str, versions)) or 'none'}"
        ) from None


def promote(ws: Workspace, name: str, version: str, reason: str = "promoted by hand") -> dict:
    """Make ``version`` the champion, whatever the gate said."""
    c = client(ws)
    mv = _require_version(c, name, version)
    if mv.status != "READY":
        raise RegistryError(f"{name} version {version} is {mv.status}, not READY; it cannot be champion")
    with registry_lock(ws):
        return _move(c, name, CHAMPION, str(version), action="promote", reason=reason)


def rollback(ws: Workspace, name: str) -> dict:
    """Move the champion back to the champion before it."""
    c = client(ws)
    _require_model(c, name)
    with registry_lock(ws):
        current = _alias(c, name, CHAMPION)
        stack = champion_stack(moves(c, name))
        if current is None or len(stack) < 2 or stack[-1] != str(current.version):
            now = f"v{current.version}" if current else "none"
            raise RegistryError(f"{name} has no previous champion to roll back to (champion: {now})")
        return _move(
            c, name, CHAMPION, stack[-2], action="rollback", reason=f"rolled back from v{current.version}"
        )


def list_versions(ws: Workspace, name: str) -> list[ModelVersion]:
    c = client(ws)
    _require_model(c, name)
    return sorted(c.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))


@dataclass(frozen=True)
class VersionSummary:
    """One version as ``trainflow models list`` shows it."""

    version: str
    aliases: list[str]
    metrics: dict[str, float]  # its run's metrics: test_accuracy, test_macro_f1, ...
    gate_passed: str  # "True", "False", or "" when the gate never ran on it
    created_ms: int


def version_summaries(ws: Workspace, name: str) -> list[VersionSummary]:
    """Every version of a model, oldest first, with its aliases, metrics and gate result."""
    versions = list_versions(ws, name)
    c = client(ws)
    # Searched versions come without their aliases; the registered model holds them.
    aliases: dict[str, list[str]] = {}
    for alias, version in c.get_registered_model(name).aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    return [
        VersionSummary(
            version=str(mv.version),
            aliases=sorted(aliases.get(str(mv.version), [])),
            metrics=dict(c.get_run(mv.run_id).data.metrics) if mv.run_id else {},
            gate_passed=mv.tags.get("gate.passed", ""),
            created_ms=int(mv.creation_timestamp),
        )
        for mv in versions
    ]


def version_details(ws: Workspace, uri: str) -> dict[str, Any]:
    """A version's aliases, test metrics, lineage tags, gate decision and alias moves."""
    mv = resolve(ws, uri)
    c = client(ws)
    run = c.get_run(mv.run_id)
    tags = dict(mv.tags)
    return {
        "name": mv.name,
        "version": str(mv.version),
        "status": mv.status,
        "aliases": sorted(mv.aliases),
        "source": mv.source,
        "metrics": {k: v for k, v in run.data.metrics.items() if k.startswith("test_")},
        "gate": {k.removeprefix("gate."): v for k, v in tags.items() if k.startswith("gate.")},
        "alias_moves": [m for m in moves(c, mv.name) if m["version"] == str(mv.version)],
        "tags": tags,
    }


# --- lineage -------------------------------------------------------------------------


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
        "trainflow.config_hash": config_hash,
        "trainflow.data_fingerprint": data_fingerprint,
        TEST_FINGERPRINT_TAG: test_fingerprint,
        "trainflow.ray_run": ray_run,
        "trainflow.best_epoch": str(best_epoch),
    }
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    commit = git_commit()
    if commit:
        tags["git.commit"] = commit
    return tags


def model_link(ws: Workspace, reg: Registration) -> str:
    """Where a person looks at a version: the MLflow server's page, else its artifact URI."""
    uri = tracking_uri(ws)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/models/{reg.name}/versions/{reg.version}"
    return reg.source


# --- resolving and loading -----------------------------------------------------------

_URI = re.compile(r"^(?:models:/)?(?P<name>[^@/]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))?$")


def resolve(ws: Workspace, uri: str) -> ModelVersion:
    """``NAME``, ``NAME@ALIAS``, ``NAME/VERSION`` or their ``models:/`` forms -> a ModelVersion.

    A bare name means its champion.
    """
    m = _URI.match(uri)
    if not m:
        raise RegistryError(f"model {uri!r}: use NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")
    c = client(ws)
    name = m["name"]
    if m["version"]:
        return _require_version(c, name, m["version"])
    _require_model(c, name)
    alias = m["alias"] or CHAMPION
    mv = _alias(c, name, alias)
    if mv is None:
        aliases = sorted(c.get_registered_model(name).aliases)
        raise RegistryError(f"{name} has no alias {alias!r}; its aliases: {', '.join(aliases) or 'none'}")
    return mv


def followed_alias(uri: str) -> str | None:
    """The alias a model URI follows (``champion`` for a bare name); None for a pinned
    ``NAME/VERSION``, which never moves."""
    m = _URI.match(uri)
    if not m:
        raise RegistryError(f"model {uri!r}: use NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")
    return None if m["version"] else (m["alias"] or CHAMPION)


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


def load_model(uri: str, ws: Workspace | None = None) -> Predictor:
    """A registered model, ready to predict raw rows with its saved preprocessing.

    >>> model = load_model("digits@champion")
    >>> model.predict(frame)
    """
    from trainflow.workspace import workspace

    ws = ws or workspace()
    mv = resolve(ws, uri)
    predictor = load_checkpoint(local_checkpoint(ws, mv))
    predictor.version = str(mv.version)
    return predictor
