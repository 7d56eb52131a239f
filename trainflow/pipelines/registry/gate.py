"""The promotion gate: whether a new version beats the champion, and the aliases it moves.

The gate compares the candidate's test metric with the champion's on the same test
data, re-scoring the champion when it was measured on other data, then moves
``champion`` to the candidate if it passes and ``challenger`` otherwise.

``champion`` (the version in use) moves only when the gate passes or a user promotes or
rolls back; ``challenger`` marks the latest version that did not pass. Every alias move
is kept as a registered-model tag ``trainflow.move.NNNNNN`` (JSON), so ``rollback``
knows the previous champion and a user can read who moved what, when.
"""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.config import LOWER_IS_BETTER
from trainflow.pipelines.registry.lineage import TEST_FINGERPRINT_TAG, local_checkpoint
from trainflow.pipelines.registry.store import LeaseLost, model_lease, set_version_tags

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from trainflow.config import RegistryConfig
    from trainflow.workspace import Workspace

log = logging.getLogger("trainflow")

CHAMPION = "champion"
CHALLENGER = "challenger"
MOVE_TAG = "trainflow.move."

# What re-scores a champion on the candidate's test data: its local checkpoint folder in,
# its test metrics out (``accuracy``, ``macro_f1``...).
Reevaluate = Callable[[Path], dict[str, Any]]


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


def decide(
    metric: str,
    candidate: float,
    champion: float | None,
    gate: RegistryConfig,
    *,
    lower_is_better: bool | None = None,
    champion_version: str | None = None,
    same_test_data: bool | None = None,
    champion_reevaluated: bool = False,
    champion_note: str | None = None,
) -> GateDecision:
    """The promotion gate: clear min_value (a floor, or a ceiling for an error metric such
    as rmse), and beat the champion by min_improvement in the metric's better direction.

    ``lower_is_better``: the metric's direction (a user's metric: its mode is min); None
    for a built-in metric's own (rmse and mae, LOWER_IS_BETTER). A champion without a
    number to compare (``champion`` None) leaves min_value alone to decide;
    ``champion_note`` says why, in the reason.
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
    lower = metric in LOWER_IS_BETTER if lower_is_better is None else lower_is_better
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
    if metric not in scored:  # a champion of the other objective
        return None, same, False, f"champion v{champ.version} is not measured by {metric}"
    return float(scored[metric]), same, True, None


def gate_version(
    ws: Workspace,
    c: MlflowClient,
    name: str,
    version: str,
    metrics: dict[str, float],
    fingerprint: str | None,
    gate: RegistryConfig,
    reevaluate: Reevaluate | None,
    lower_is_better: bool | None = None,
) -> GateDecision:
    """Decide on a READY version against the champion, keep the decision as its ``gate.*``
    tags, and point ``champion`` at it if it passes, ``challenger`` if not.

    ``metrics``: its test metrics; ``fingerprint``: the test data they were measured on;
    ``lower_is_better``: the gate metric's direction (:func:`decide`). Decided and moved under
    the model's lease (:func:`.store.model_lease`), so no other process sharing the registry moves the
    champion between; one that lost its lease decides again."""
    lost = 0
    while True:
        try:
            with model_lease(c, ws, name, gate.lease_s) as lease:
                decision = _decide_on(ws, c, name, metrics, fingerprint, gate, reevaluate, lower_is_better)
                lease.verify()
                alias = CHAMPION if decision.passed else CHALLENGER
                move_alias(c, name, alias, version, action="gate", reason=decision.reason)
            # The alias move's record holds the reason already: the lease need not wait for these.
            set_version_tags(c, name, version, gate_tags(decision.to_dict()))
            return decision
        except LeaseLost as e:
            lost += 1
            if lost == 3:
                raise
            log.warning("%s; deciding again", e)


def _decide_on(
    ws: Workspace,
    c: MlflowClient,
    name: str,
    metrics: dict[str, float],
    fingerprint: str | None,
    gate: RegistryConfig,
    reevaluate: Reevaluate | None,
    lower_is_better: bool | None,
) -> GateDecision:
    """The gate's decision on ``metrics`` against the champion of this moment."""
    metric = gate.gate_metric
    champ = alias_version(c, name, CHAMPION)
    champ_value = same = note = None
    reevaluated = False
    if champ is not None:
        champ_value, same, reevaluated, note = _champion_number(ws, c, champ, metric, fingerprint, reevaluate)
    return decide(
        metric,
        float(metrics[metric]),
        champ_value,
        gate,
        lower_is_better=lower_is_better,
        champion_version=str(champ.version) if champ else None,
        same_test_data=same,
        champion_reevaluated=reevaluated,
        champion_note=note,
    )


def gate_tags(decision: dict[str, Any]) -> dict[str, str]:
    """A gate decision (``GateDecision.to_dict()``) as the version's ``gate.*`` tags, strings
    all (:func:`~trainflow.pipelines.registry.versions.gate_values` reads them back typed)."""
    return {f"gate.{key}": str(value) for key, value in decision.items()}


# --- the aliases and the history of their moves ----------------------------------------


def alias_version(c: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    """The version ``alias`` points at; None when the model has no such alias."""
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def moves(c: MlflowClient, name: str) -> list[dict[str, Any]]:
    """Every alias move of a registered model, oldest first."""
    rm = c.get_registered_model(name)
    return [json.loads(v) for k, v in sorted(rm.tags.items()) if k.startswith(MOVE_TAG)]


def move_alias(c: MlflowClient, name: str, alias: str, version: str, *, action: str, reason: str) -> dict:
    """Point ``alias`` at ``version`` and record the move. Call it under the model's lease
    (:func:`~trainflow.pipelines.registry.store.model_lease`)."""
    before = alias_version(c, name, alias)
    c.set_registered_model_alias(name, alias, version)
    if alias == CHAMPION:
        # A challenger that becomes champion is no longer a challenger.
        challenger = alias_version(c, name, CHALLENGER)
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
