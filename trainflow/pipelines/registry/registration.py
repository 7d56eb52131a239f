"""Registering a checkpoint: one MLflow run, one model version, then the gate.

The run holds the test and per-epoch metrics, the params, the reports and the
checkpoint's own copy with MLflow's python_function flavor; the version points at that
copy and carries the SHA-256 of each file. MLflow's UI shows who made them: the run's
creator and source are the Prefect flow run that registers (or this process's user), and
the version's description holds the gate's decision, the test metrics and that creator.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.pipelines.registry.gate import GateDecision, Reevaluate, gate_version
from trainflow.pipelines.registry.lineage import (
    HASHES_FILE,
    HASHES_TAG,
    TEST_FINGERPRINT_TAG,
    file_hashes,
    verify_files,
)
from trainflow.pipelines.registry.pyfunc import write_flavor
from trainflow.pipelines.registry.store import client, experiment_id, tracking_uri
from trainflow.pipelines.registry.versions import RegistryError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

    from trainflow.config import RegistryConfig
    from trainflow.workspace import Workspace

# How long to wait for a version's artifacts to be READY before an alias may point at it.
READY_TIMEOUT_S = 300

# The lineage tags that name the Prefect flow run registering a version (tasks/register.py).
FLOW_RUN_ID_TAG = "prefect.flow_run_id"
FLOW_RUN_NAME_TAG = "prefect.flow_run_name"
FLOW_NAME_TAG = "prefect.flow_name"


@dataclass
class Registration:
    name: str
    version: str
    run_id: str
    champion: bool
    decision: GateDecision
    source: str
    aliases: list[str]


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
    lower_is_better: bool | None = None,
) -> Registration:
    """One MLflow run and model version; ``champion`` moves only if the gate passes, else the
    version becomes ``challenger``.

    ``metrics``: the test metrics, logged as ``test_*``; ``history``: per epoch, with
    step=epoch; ``tags``: lineage, TEST_FINGERPRINT_TAG naming the test data. A champion
    measured on other test data is scored on this one first (``reevaluate``). ``reports``:
    files logged under ``reports/``. ``lower_is_better``: the gate metric's direction, None
    for a built-in metric's own."""
    c = client(ws)
    run, hashes = _log_run(
        c,
        ws,
        name,
        checkpoint_dir,
        params=params,
        metrics=metrics,
        history=history,
        tags=tags,
        reports=reports,
    )
    run_id = run.info.run_id
    source = f"{run.info.artifact_uri}/checkpoint"
    version_tags = {**tags, HASHES_TAG: json.dumps(hashes)}
    version = _create_version(c, name, source, run_id, version_tags, version_description(metrics, tags))
    fingerprint = tags.get(TEST_FINGERPRINT_TAG)
    decision = gate_version(ws, c, name, version, metrics, fingerprint, gate, reevaluate, lower_is_better)
    # The decision comes after the version exists: its description says it from now on.
    c.update_model_version(name, version, description=version_description(metrics, tags, decision))
    aliases = list(c.get_model_version(name, version).aliases)
    return Registration(name, version, run_id, decision.passed, decision, source, sorted(aliases))


def _log_run(
    c: MlflowClient,
    ws: Workspace,
    name: str,
    checkpoint_dir: str,
    *,
    params: dict[str, Any],
    metrics: dict[str, float],
    history: list[dict[str, Any]],
    tags: dict[str, str],
    reports: list[str] | None,
) -> tuple[Run, dict[str, str]]:
    """A finished MLflow run with the metrics, params, checkpoint and reports; return it
    and the hashes of the checkpoint's files as logged."""
    run = c.create_run(
        experiment_id(c, ws),
        run_name=f"{name}-{tags.get('trainflow.config_hash', '')}",
        tags={**tags, **creator_tags(tags)},
    )
    run_id = run.info.run_id
    _log_metrics_and_params(c, run_id, metrics, history, params)
    hashes = _log_checkpoint(c, run_id, checkpoint_dir)
    for report in reports or []:
        c.log_artifact(run_id, report, artifact_path="reports")
    c.set_terminated(run_id)
    return run, hashes


def _log_metrics_and_params(
    c: MlflowClient,
    run_id: str,
    metrics: dict[str, float],
    history: list[dict[str, Any]],
    params: dict[str, Any],
) -> None:
    """The test metrics as ``test_*``, each epoch's metrics at step=epoch, and the params
    flattened to dotted keys."""
    from mlflow.entities import Metric, Param

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


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _log_checkpoint(c: MlflowClient, run_id: str, checkpoint_dir: str) -> dict[str, str]:
    """Log the checkpoint folder, with MLflow's python_function flavor (``pyfunc.py``) and
    a hashes.json beside its files; return the hashes."""
    # Imported here: it imports torch, which the registry's readers (`trainflow models`) never need.
    from trainflow.pipelines.models.checkpoint import complete_weights

    hashes = file_hashes(checkpoint_dir)
    # A private copy (the run folder may be shared or read-only): Ray prunes its
    # checkpoints, and what is registered must be what was hashed.
    workdir = Path(tempfile.mkdtemp(prefix="trainflow-register-"))
    staged = workdir / "checkpoint"
    try:
        shutil.copytree(checkpoint_dir, staged)
        verify_files(staged, hashes, f"checkpoint {checkpoint_dir}")
        complete_weights(staged)  # a LoRA adapter's alone: with its base, so it loads anywhere
        write_flavor(staged)
        hashes = file_hashes(staged)
        (staged / HASHES_FILE).write_text(json.dumps(hashes, indent=2))
        c.log_artifacts(run_id, str(staged), artifact_path="checkpoint")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return hashes


def _create_version(
    c: MlflowClient, name: str, source: str, run_id: str, tags: dict[str, str], description: str
) -> str:
    """A new version of ``name`` (the registered model made with its first), once READY:
    an alias must never point at a version whose artifacts are still uploading."""
    from mlflow.exceptions import MlflowException

    try:
        c.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    created = c.create_model_version(name, source=source, run_id=run_id, tags=tags, description=description)
    version = str(created.version)
    _wait_until_ready(c, name, version)
    return version


def created_by(tags: dict[str, str]) -> str:
    """Who registers a version, in words: the Prefect flow run its lineage tags name, else
    this process's user (a registration from Python, outside a flow)."""
    run_id = tags.get(FLOW_RUN_ID_TAG)
    if not run_id:
        return _os_user()
    return f"Prefect flow run {tags.get(FLOW_RUN_NAME_TAG) or run_id}"


def creator_tags(tags: dict[str, str]) -> dict[str, str]:
    """MLflow's system tags for a run's creator and source, which its UI shows as the
    run's "Created by", "Source" and git commit: the Prefect flow run (its name; the flow
    and the run's id) when the lineage tags name one; else, as MLflow's own fluent API records
    them, this process's user and script."""
    run_id = tags.get(FLOW_RUN_ID_TAG)
    if run_id:
        flow = " ".join(filter(None, [tags.get(FLOW_NAME_TAG), "flow run", run_id]))
        source = {"mlflow.source.name": flow, "mlflow.source.type": "JOB"}
    else:
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        source = {"mlflow.source.name": script, "mlflow.source.type": "LOCAL"}
    commit = {"mlflow.source.git.commit": tags["git.commit"]} if tags.get("git.commit") else {}
    return {"mlflow.user": created_by(tags), **source, **commit}


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no name
        return "unknown"


def version_description(
    metrics: dict[str, float], tags: dict[str, str], decision: GateDecision | None = None
) -> str:
    """A version's description (Markdown, as MLflow's UI renders it): the gate's decision
    and its reason (not decided yet while the version is new), the test metrics, and who
    registered it (the flow run its lineage ``tags`` name, with the flow and the run's id).
    It starts with the decision in plain words: the UI's list of versions shows its first
    characters, as they are written."""
    if decision is None:
        gate = "Gate not decided yet: the promotion gate decides once the version is ready."
    elif decision.passed:
        gate = f"Gate passed: champion. {decision.reason}"
    else:
        gate = f"Gate failed: challenger. {decision.reason}"
    tested = ", ".join(f"{k} {float(v):.4f}" for k, v in metrics.items())
    creator = created_by(tags)
    if tags.get(FLOW_RUN_ID_TAG):
        flow = f"flow {tags[FLOW_NAME_TAG]}, " if tags.get(FLOW_NAME_TAG) else ""
        creator += f" ({flow}id {tags[FLOW_RUN_ID_TAG]})"
    return f"{gate}\n\nTest metrics: {tested}\n\nRegistered by {creator}."


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


def model_link(ws: Workspace, reg: Registration) -> str:
    """Where a person looks at a version: the MLflow server's page, else its artifact URI."""
    uri = tracking_uri(ws)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/models/{reg.name}/versions/{reg.version}"
    return reg.source
