"""The checks before a run starts: what can fail in seconds, in one line, before Ray and
the flow start and before any Ray worker runs.

A training or sweep run checks its sweep section, its model, the user's loss, metrics and
loop, its data source (columns and types, and its labels) and what it asks of the cluster
(:func:`before_run`). A batch prediction checks the model reference, its input and output,
and the cluster (:func:`before_predict`). A reproduction checks that the version's config
rebuilds exactly and that its data and code are unchanged, then checks as a training run
(:func:`before_reproduce`).

Each run checks once: the ``trainflow`` command before it starts anything, handing what
it found to the flow (its ``checked`` parameter); a flow started any other way checks for
itself."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pydantic import BaseModel

from trainflow.config import ConfigError, PipelineConfig
from trainflow.files import is_uri, redacted
from trainflow.pipelines.data.schema import SourceInfo
from trainflow.pipelines.evaluation.predict_input import InputInfo, check_output, inspect_input
from trainflow.pipelines.training.run_records import RunRecord

if TYPE_CHECKING:
    from trainflow.pipelines.registry.reproduce import Original


@dataclass(frozen=True)
class RunChecks:
    """What a training or sweep run's checks found."""

    source: SourceInfo
    warm: tuple[str, ...]  # modules the Ray workers that prepare the data import; none: the driver does
    resume: RunRecord | None = None  # the unfinished run to continue, when asked to resume one


def before_run(
    config: PipelineConfig, *, sweep: bool = False, resume: bool = False, found: SourceInfo | None = None
) -> RunChecks:
    """A training (or, with ``sweep``, a sweep) run's checks: ConfigError, DataError or
    PreflightError with one line saying what to change. ``resume``: also find the
    unfinished run of this config and data to continue (``run_records.run_to_resume``).
    ``found``: the source as the caller's own check of it found it, not looked at again."""
    from trainflow.cluster.checks import check_cache
    from trainflow.cluster.session import on_this_machine
    from trainflow.pipelines.data.prepare import worker_modules
    from trainflow.pipelines.registry.store import check_server
    from trainflow.pipelines.training.run_records import run_to_resume
    from trainflow.timeline import timeline
    from trainflow.workspace import storage_location, workspace

    if sweep:
        _sweep_section(config)
    model_kind(config)
    own_loss_and_metrics(config)
    own_loop(config)
    info = found or source(config)
    model_fits(config, info)
    check_cache(config)
    check_server(workspace())
    cluster(config, workers="sweep" if sweep else "train")
    resumed = run_to_resume(storage_location(config), config, info.fingerprint) if resume else None
    timeline("config, source and resources checked")
    return RunChecks(source=info, warm=worker_modules(info, local=on_this_machine(config)), resume=resumed)


@dataclass(frozen=True)
class ReproduceChecks:
    """What a reproduction's checks found."""

    original: Original  # the version, with the config it was trained with
    run: RunChecks  # the checks of a training run of that config
    changed: list[str]  # what differs from the data and code it was trained on, let through by force


def before_reproduce(uri: str, *, force: bool = False, run: RunChecks | None = None) -> ReproduceChecks:
    """A reproduction's checks: the version's exact config (RegistryError when it cannot be
    rebuilt), then its source's fingerprint and the checkout's git commit against the
    version's lineage (ReproduceRefused naming what changed, unless ``force``), then a
    training run's checks of that config. ``run``: those checks, made already."""
    from trainflow.pipelines.registry import lineage, reproduce
    from trainflow.workspace import workspace

    original = reproduce.original(workspace(), uri)
    info = run.source if run else source(original.config)
    changed = reproduce.check_unchanged(original, info.fingerprint, lineage.git_commit(), force=force)
    return ReproduceChecks(original, run or before_run(original.config, found=info), changed)


def _sweep_section(config: PipelineConfig) -> None:
    if config.sweep is None:
        raise ConfigError(
            f"invalid config: sweep: {config.name} has no sweep section; add one such as "
            "sweep: {space: {train.lr: {loguniform: [0.0001, 0.1]}}, trials: 8}"
        )
    if config.storage and is_uri(config.storage) and not config.storage.startswith("file://"):
        raise ConfigError(
            f"invalid config: storage: a sweep keeps its trials in a folder, not at "
            f"{redacted(config.storage)}; give a folder every node mounts (or file:///...), or "
            "train one model at a time with trainflow run"
        )
    if config.train.loop is not None:
        # A trial's epochs, ranking and placement groups come from trainflow's loop.
        raise ConfigError(
            f"invalid config: sweep: a sweep's trials train with trainflow's own loop, not "
            f"train.loop {config.train.loop}; train it one model at a time with trainflow run"
        )


def model_kind(config: PipelineConfig) -> None:
    """The model the config names can be built: its torchvision architecture exists, the
    user's module imports here and holds the callable, the weights file is there. Imports
    torchvision (and torch) only for a torchvision kind or weights, the user's module only
    for a kind of the user's own."""
    from trainflow.pipelines.models.kinds import check_model

    check_model(config.model)


def model_fits(config: PipelineConfig, info: SourceInfo) -> None:
    """The model can read the source's rows where their width is known before fitting: a
    table's, without a transform's array columns (:func:`kinds.check_table_fits`)."""
    from trainflow.pipelines.models.kinds import check_table_fits

    if not info.is_images and not info.arrays:
        check_table_fits(config.model, None if info.categorical_columns else info.width, info.source)


def own_loss_and_metrics(config: PipelineConfig) -> None:
    """A loss of the user's own (train.loss) imports here and builds with train.loss_args,
    and each of evaluation.metrics imports; each is then called on a sample of the data's
    shape where the shape is known (``TrainSettings.from_config``), still before any worker
    starts. Imports torch only for a loss of the user's own."""
    from trainflow.pipelines.metrics import load_metrics

    if config.train.user_loss is not None:
        from trainflow.pipelines.training.losses import user_loss

        user_loss(config.train.user_loss, config.train.loss_args, regression=config.objective == "regression")
    load_metrics(config.evaluation)


def own_loop(config: PipelineConfig) -> None:
    """A training loop of the user's own (train.loop) imports here and takes one argument,
    its config dict. Imports torch only for a loop of the user's own."""
    if config.train.loop is not None:
        from trainflow.pipelines.training.user_loop import check_loop

        check_loop(config.train.loop)


def source(config: PipelineConfig) -> SourceInfo:
    """The data source exists and holds the configured columns with usable types, and its
    labels are there and among data.classes (``missing.check_labels``: the label column
    read, for a table up to its size bound); other rows are read only for a
    ``preprocess.transform``, the first ones it is tried on."""
    from trainflow.pipelines.data.missing import check_labels
    from trainflow.pipelines.data.schema import inspect_source
    from trainflow.pipelines.data.tokenizer import transform_of
    from trainflow.workspace import cache_folder

    info = inspect_source(
        config.data, cache_folder(config), objective=config.objective, transform=transform_of(config)
    )
    missing = check_labels(info)
    return replace(info, missing_labels=missing) if missing else info


def cluster(config: PipelineConfig, workers: str | None, *, gpus_per_actor: float = 0) -> None:
    """A cluster address where something answers (``ray.init`` would retry one for
    minutes), else a local cluster that can hold the run's training workers
    (``workers="train"``), one sweep trial (``"sweep"``) or one prediction actor of
    ``gpus_per_actor`` GPUs; ``None`` and no GPUs: nothing asked of it."""
    from trainflow.cluster.checks import check_reachable
    from trainflow.cluster.preflight import preflight_local
    from trainflow.cluster.session import ray_address

    address = ray_address(config)
    if address:
        check_reachable(address)
    elif workers or gpus_per_actor:
        preflight_local(config, sweep=workers == "sweep", gpus_per_actor=gpus_per_actor)


class ModelRef(BaseModel):
    """A registered version, resolved and verified on this machine."""

    uri: str  # as asked for, or pinned: NAME/VERSION
    name: str
    version: str
    checkpoint: str  # the verified local copy of the registered checkpoint
    input_columns: list[str]  # every column the model reads (a transform's: the raw columns it takes)
    classes: list
    kind: str | None = None  # its model.kind: a user's model's module goes to the cluster with the run
    transform: str | None = None  # its preprocess.transform, whose module goes there too

    def cluster(self, ray_address: str | None = None) -> PipelineConfig:
        """The config of a run that predicts with this model on the cluster at ``ray_address``
        (None: RAY_ADDRESS, else a local one): the modules of a user's model and transform
        shipped with it."""
        model = {"model": {"kind": self.kind}} if self.kind else {}
        preprocess = {"preprocess": {"transform": self.transform}} if self.transform else {}
        return PipelineConfig(ray={"address": ray_address}, **model, **preprocess)


def model(uri: str, *, pin: bool = False) -> ModelRef:
    """The registered version behind NAME@ALIAS, NAME/VERSION or models:/..., downloaded
    and checked (RegistryError, IntegrityError). ``pin``: its ``uri`` becomes NAME/VERSION,
    so that an alias that moves before the run uses it does not change what it predicts with."""
    from trainflow.pipelines.data.tokenizer import is_reference
    from trainflow.pipelines.models.checkpoint import load_checkpoint
    from trainflow.pipelines.registry import versions
    from trainflow.workspace import workspace

    ws = workspace()
    mv = versions.resolve(ws, uri)
    folder = versions.local_checkpoint(ws, mv)
    loaded = load_checkpoint(folder)
    transform = (loaded.preprocessor.transform or {}).get("path")  # a tokenizer ships nothing
    return ModelRef(
        uri=f"{mv.name}/{mv.version}" if pin else uri,
        name=mv.name,
        version=str(mv.version),
        checkpoint=str(folder),
        input_columns=loaded.preprocessor.raw_columns,
        classes=loaded.preprocessor.classes,
        kind=loaded.spec["kind"],
        transform=None if is_reference(transform) else transform,
    )


def predict_input(input: str, output: str, ref: ModelRef) -> InputInfo:
    """The input holds every feature column the model needs (DataError naming a missing
    one), and the output folder is new."""
    info = inspect_input(input, ref.input_columns)
    check_output(output)
    return info


@dataclass(frozen=True)
class PredictChecks:
    """What a batch prediction's checks found."""

    model: ModelRef  # pinned to its version
    input: InputInfo


def before_predict(
    model_uri: str, input: str, output: str, *, use_gpu: bool = False, ray_address: str | None = None
) -> PredictChecks:
    """A batch prediction's checks: the model (pinned to its version), its input and
    output, and the cluster (RAY_ADDRESS or ``ray_address``, else a local one that can
    hold an actor of one GPU when ``use_gpu``)."""
    ref = model(model_uri, pin=True)
    info = predict_input(input, output, ref)
    cluster(ref.cluster(ray_address), workers=None, gpus_per_actor=1 if use_gpu else 0)
    return PredictChecks(model=ref, input=info)
