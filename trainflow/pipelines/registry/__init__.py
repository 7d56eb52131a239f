"""The MLflow model registry, by concern: ``store`` (where it lives: the tracking URI,
the embedded SQLite store, its lock, a client that retries while the database is
locked), ``lineage`` (a version's lineage tags and the SHA-256 of its files),
``aliases`` (``champion``, ``challenger`` and the history of their moves), ``versions``
(resolve a model URI, list models and describe versions, the gate's tags read back typed,
promote, roll back, load),
``gate`` (the promotion decision), ``registration`` (a checkpoint registered and gated),
``pyfunc`` (MLflow's python_function flavor of every version), ``card`` (a version's
model card) and ``reproduce`` (a version trained again from its exact config)."""

from trainflow.pipelines.registry.aliases import CHALLENGER, CHAMPION, moves
from trainflow.pipelines.registry.card import CARD_FILE, read_card, write_card
from trainflow.pipelines.registry.gate import GateDecision, Reevaluate, decide
from trainflow.pipelines.registry.lineage import (
    HASHES_FILE,
    HASHES_TAG,
    TEST_FINGERPRINT_TAG,
    IntegrityError,
    lineage_tags,
)
from trainflow.pipelines.registry.registration import Registration, model_link, register_checkpoint
from trainflow.pipelines.registry.store import client, experiment_id, retry_locked, tracking_uri
from trainflow.pipelines.registry.versions import (
    ModelSummary,
    RegistryError,
    VersionSummary,
    followed_alias,
    load_model,
    local_checkpoint,
    model_summaries,
    promote,
    resolve,
    rollback,
    version_details,
    version_summaries,
    version_trained_on,
)

__all__ = [
    "CARD_FILE",
    "CHALLENGER",
    "CHAMPION",
    "HASHES_FILE",
    "HASHES_TAG",
    "TEST_FINGERPRINT_TAG",
    "GateDecision",
    "IntegrityError",
    "ModelSummary",
    "Reevaluate",
    "Registration",
    "RegistryError",
    "VersionSummary",
    "client",
    "decide",
    "experiment_id",
    "followed_alias",
    "lineage_tags",
    "load_model",
    "local_checkpoint",
    "model_link",
    "model_summaries",
    "moves",
    "promote",
    "read_card",
    "register_checkpoint",
    "resolve",
    "retry_locked",
    "rollback",
    "tracking_uri",
    "version_details",
    "version_summaries",
    "write_card",
    "version_trained_on",
]
