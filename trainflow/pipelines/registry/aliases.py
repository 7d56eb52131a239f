"""The two aliases of a registered model and the history of their moves.

``champion`` (the version in use) moves only when the gate passes or a user promotes or
rolls back; ``challenger`` marks the latest version that did not pass. Every alias move
is kept as a registered-model tag ``trainflow.move.NNNNNN`` (JSON), so ``rollback``
knows the previous champion and a user can read who moved what, when.
"""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

CHAMPION = "champion"
CHALLENGER = "challenger"
MOVE_TAG = "trainflow.move."


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
    (:func:`~trainflow.pipelines.registry.lease.model_lease`)."""
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
