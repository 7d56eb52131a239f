"""The checks before a run starts: what can fail in seconds, in one line, before Prefect's
server and Ray start and before any Ray worker runs.

A training or sweep run checks its sweep section, its model (``model.kind`` and
``model.weights``), its data source (columns and types; no rows read) and what it asks
of the cluster: the local cluster it would start (GPUs, CPUs), or that something answers
at a cluster's address. A batch prediction checks the
model reference, its input (every feature column the model needs) and output, and the
cluster's address.

Each run checks once. The ``trainflow`` command checks before it starts anything, so that
a mistake costs seconds, and holds the result (``hold=True``) for the flow run it starts
next in this process: the flow calls the same function, which takes the held result
instead of checking again. A flow run started any other way (a deployment, a schedule,
Python) holds nothing and checks for itself. A held result is taken once: the next run
of a long-lived process checks again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from trainflow.config import ConfigError, PipelineConfig
from trainflow.files import is_uri, redacted
from trainflow.pipelines.data.schema import SourceInfo
from trainflow.pipelines.training.runs import RunRecord

if TYPE_CHECKING:
    # Prediction imports torch (seconds): a run's checks, made before anything starts, must not.
    from trainflow.pipelines.evaluation.predict import InputInfo

T = TypeVar("T")

# Results a command checked ahead of its flow run, by what was checked.
_held: dict[Hashable, object] = {}


def _once(key: Hashable, hold: bool, check: Callable[[], T]) -> T:
    """A held result for ``key`` (taken), else ``check()``; held for the next call when ``hold``."""
    if key in _held:
        return _held.pop(key)  # type: ignore[return-value]
    result = check()
    if hold:
        _held[key] = result
    return result


@dataclass(frozen=True)
class RunChecks:
    """What a training or sweep run's checks found."""

    source: SourceInfo
    warm: tuple[str, ...]  # modules the Ray workers that prepare the data import; none: the driver does
    resume: RunRecord | None = None  # the unfinished run to continue, when asked to resume one


def before_run(
    config: PipelineConfig, *, sweep: bool = False, hold: bool = False, resume: bool = False
) -> RunChecks:
    """A training (or, with ``sweep``, a sweep) run's checks: ConfigError, DataError or
    PreflightError with one line saying what to change. ``resume``: also find the
    unfinished run of this config and data to continue (``runs.run_to_resume``)."""
    from trainflow.cluster.session import ray_address

    key = ("run", config.config_hash(), sweep, ray_address(config), resume)
    return _once(key, hold, lambda: _check_run(config, sweep, resume))


def _check_run(config: PipelineConfig, sweep: bool, resume: bool = False) -> RunChecks:
    from trainflow.cluster.checks import check_cache
    from trainflow.pipelines.data.prepare import worker_modules
    from trainflow.timeline import timeline

    if sweep and config.sweep is None:
        raise ConfigError(
            f"invalid config: sweep: {config.name} has no sweep section; add one such as "
            "sweep: {space: {train.lr: {loguniform: [0.0001, 0.1]}}, trials: 8}"
        )
    if sweep and config.storage and is_uri(config.storage) and not config.storage.startswith("file://"):
        raise ConfigError(
            f"invalid config: storage: a sweep keeps its trials in a folder, not at "
            f"{redacted(config.storage)}; give a folder every node mounts (or file:///...), or "
            "train one model at a time with trainflow run"
        )
    model_kind(config)
    info = source(config)
    check_cache(config)
    cluster(config, workers="sweep" if sweep else "train")
    resumed = None
    if resume:
        from trainflow.pipelines.training.runs import run_to_resume
        from trainflow.workspace import workspace

        resumed = run_to_resume(config.storage or str(workspace().runs), config, info.fingerprint)
    timeline("config, source and resources checked")
    return RunChecks(source=info, warm=worker_modules(info), resume=resumed)


def model_kind(config: PipelineConfig) -> None:
    """The model the config names can be built: its torchvision architecture exists, the
    user's module imports here and holds the callable, the weights file is there. Imports
    torchvision (and torch) only for a torchvision kind or weights, the user's module only
    for a kind of the user's own."""
    from trainflow.pipelines.models.kinds import check_model

    check_model(config.model)


def source(config: PipelineConfig) -> SourceInfo:
    """The data source exists and holds the configured columns with usable types; no rows read."""
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.workspace import cache_folder

    return inspect_source(config.data, cache_folder(config), task=config.task)


def cluster(
    config: PipelineConfig, workers: str | None, *, gpus_per_actor: float = 0, hold: bool = False
) -> None:
    """A cluster address where something answers (``ray.init`` would retry one for
    minutes), else a local cluster that can hold the run's training workers
    (``workers="train"``), one sweep trial (``"sweep"``) or one prediction actor of
    ``gpus_per_actor`` GPUs; ``None`` and no GPUs: nothing asked of it."""
    from trainflow.cluster.checks import check_reachable
    from trainflow.cluster.preflight import preflight_local
    from trainflow.cluster.session import ray_address

    def check() -> bool:
        address = ray_address(config)
        if address:
            check_reachable(address)
        elif workers or gpus_per_actor:
            preflight_local(config, sweep=workers == "sweep", gpus_per_actor=gpus_per_actor)
        return True

    _once(("cluster", config.config_hash(), ray_address(config), workers, gpus_per_actor), hold, check)


class ModelRef(BaseModel):
    """A registered version, resolved and verified on this machine."""

    uri: str  # as asked for; a held reference is pinned: NAME/VERSION
    name: str
    version: str
    checkpoint: str  # the verified local copy of the registered checkpoint
    input_columns: list[str]  # every column the model reads
    classes: list
    kind: str | None = None  # its model.kind: a user's model's module goes to the cluster with the run

    def cluster(self, ray_address: str | None = None) -> PipelineConfig:
        """The config of a run that predicts with this model on the cluster at ``ray_address``
        (None: RAY_ADDRESS, else a local one): the model's module, a user's, shipped with it."""
        model = {"model": {"kind": self.kind}} if self.kind else {}
        return PipelineConfig(ray={"address": ray_address}, **model)


def model(uri: str, *, hold: bool = False) -> ModelRef:
    """The registered version behind NAME@ALIAS, NAME/VERSION or models:/..., downloaded
    and checked (RegistryError, IntegrityError). A held reference is held under its pinned
    ``NAME/VERSION``, the form a command hands its flow run, so an alias that moves in
    between does not change what the run predicts with."""

    def check() -> ModelRef:
        from trainflow.pipelines import registry
        from trainflow.pipelines.models.checkpoint import load_checkpoint
        from trainflow.workspace import workspace

        ws = workspace()
        mv = registry.resolve(ws, uri)
        folder = registry.local_checkpoint(ws, mv)
        loaded = load_checkpoint(folder)
        pre = loaded.preprocessor
        return ModelRef(
            uri=f"{mv.name}/{mv.version}" if hold else uri,
            name=mv.name,
            version=str(mv.version),
            checkpoint=str(folder),
            input_columns=pre.input_columns,
            classes=pre.classes,
            kind=loaded.spec["kind"],
        )

    if ("model", uri) in _held:
        return _held.pop(("model", uri))  # type: ignore[return-value]
    ref = check()
    if hold:
        _held[("model", ref.uri)] = ref
    return ref


def predict_input(input: str, output: str, ref: ModelRef, *, hold: bool = False) -> InputInfo:
    """The input holds every feature column the model needs (DataError naming a missing
    one), and the output folder is new."""
    from trainflow.pipelines.evaluation import predict as pr

    def check() -> InputInfo:
        info = pr.inspect_input(input, ref.input_columns)
        pr.check_output(output)
        return info

    return _once(("input", input, output, ref.checkpoint), hold, check)
