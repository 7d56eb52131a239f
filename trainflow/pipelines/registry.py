"""The MLflow model registry: register a checkpoint, gate the champion, load by alias.

The registry is the embedded SQLite store under TRAINFLOW_HOME unless
MLFLOW_TRACKING_URI points at an MLflow server. Every version owns a copy of its
checkpoint folder as its artifact, so it outlives Ray's run folders.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.pipelines.checkpoint import Predictor, load_checkpoint

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainflow.config import RegistryConfig
    from trainflow.runtime import Workspace

CHAMPION = "champion"
EXPERIMENT = "trainflow"
TEST_FINGERPRINT_TAG = "trainflow.test_fingerprint"


def tracking_uri(ws: Workspace) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def client(ws: Workspace) -> MlflowClient:
    from mlflow import MlflowClient

    uri = tracking_uri(ws)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _experiment_id(c: MlflowClient, ws: Workspace) -> str:
    exp = c.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        return exp.experiment_id
    # The embedded store keeps artifacts beside its database, not in ./mlruns.
    location = None if os.environ.get("MLFLOW_TRACKING_URI") else ws.artifacts.as_uri()
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


@dataclass
class GateDecision:
    passed: bool
    metric: str
    candidate: float
    champion: float | None
    champion_version: str | None
    min_improvement: float
    min_value: float
    same_test_data: bool | None
    reason: str

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


def decide(
    metric: str,
    candidate: float,
    champion: float | None,
    gate: RegistryConfig,
    *,
    champion_version: str | None = None,
    same_test_data: bool | None = None,
) -> GateDecision:
    """The promotion gate: clear min_value, and beat the champion by min_improvement."""
    common = dict(
        metric=metric,
        candidate=candidate,
        champion=champion,
        champion_version=champion_version,
        min_improvement=gate.min_improvement,
        min_value=gate.min_value,
        same_test_data=same_test_data,
    )
    if candidate < gate.min_value:
        return GateDecision(
            False, reason=f"{metric} {candidate:.4f} is below min_value {gate.min_value}", **common
        )
    if champion is None:
        return GateDecision(
            True,
            reason=f"no champion yet; {metric} {candidate:.4f} clears min_value {gate.min_value}",
            **common,
        )
    if candidate - champion >= gate.min_improvement:
        return GateDecision(
            True,
            reason=f"{metric} {candidate:.4f} vs champion v{champion_version} {champion:.4f}: "
            f"improvement {candidate - champion:+.4f} >= {gate.min_improvement}",
            **common,
        )
    return GateDecision(
        False,
        reason=f"{metric} {candidate:.4f} vs champion v{champion_version} {champion:.4f}: "
        f"improvement {candidate - champion:+.4f} < {gate.min_improvement}",
        **common,
    )


def _champion(c: MlflowClient, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


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
) -> Registration:
    """One MLflow run and model version; the champion alias moves only if the gate passes.

    ``metrics`` are the test metrics (``accuracy``, ``macro_f1``...), logged as ``test_*``.
    ``tags`` carry lineage; TEST_FINGERPRINT_TAG names the test data they were measured on.
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
    c.log_artifacts(run_id, checkpoint_dir, artifact_path="checkpoint")
    c.set_terminated(run_id)

    try:
        c.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = f"{run.info.artifact_uri}/checkpoint"
    version = c.create_model_version(name, source=source, run_id=run_id, tags=tags)

    metric = gate.gate_metric
    champ = _champion(c, name)
    champ_value = same = None
    if champ is not None:
        champ_value = c.get_run(champ.run_id).data.metrics.get(f"test_{metric}")
        same = champ.tags.get(TEST_FINGERPRINT_TAG) == tags.get(TEST_FINGERPRINT_TAG)
    decision = decide(
        metric,
        float(metrics[metric]),
        champ_value,
        gate,
        champion_version=str(champ.version) if champ else None,
        same_test_data=same,
    )
    for key, value in decision.to_dict().items():
        c.set_model_version_tag(name, version.version, f"gate.{key}", str(value))
    if decision.passed:
        c.set_registered_model_alias(name, CHAMPION, version.version)
    return Registration(name, str(version.version), run_id, decision.passed, decision, source)


_URI = re.compile(r"^(?:models:/)?(?P<name>[^@/]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))?$")


def resolve(ws: Workspace, uri: str):
    """``NAME``, ``NAME@ALIAS``, ``NAME/VERSION`` or their ``models:/`` forms -> a ModelVersion.

    A bare name means its champion.
    """
    m = _URI.match(uri)
    if not m:
        raise ValueError(f"model {uri!r}: use NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")
    c = client(ws)
    name = m["name"]
    if m["version"]:
        return c.get_model_version(name, m["version"])
    return c.get_model_version_by_alias(name, m["alias"] or CHAMPION)


def load_model(uri: str, ws: Workspace | None = None) -> Predictor:
    """A registered model, ready to predict raw rows with its saved preprocessing.

    >>> model = load_model("digits@champion")
    >>> model.predict(frame)
    """
    from mlflow.artifacts import download_artifacts

    from trainflow.runtime import workspace

    ws = ws or workspace()
    mv = resolve(ws, uri)
    local = ws.home / "models" / mv.name / str(mv.version)
    if not local.is_dir():
        # Download beside the final folder, then rename: a half-copied model is never loaded.
        tmp = local.parent / f".tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            got = download_artifacts(artifact_uri=mv.source, dst_path=str(tmp), tracking_uri=tracking_uri(ws))
            try:
                Path(got).rename(local)
            except OSError:
                if not local.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return load_checkpoint(local)
