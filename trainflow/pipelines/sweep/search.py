"""What a sweep hands Ray Tune to draw and rank its trials: the search space of its
dimensions, the search algorithm and the trial scheduler, and the epochs at which ASHA
compares trials (its rungs).

A search algorithm is looked up by ``sweep.search`` in :data:`SEARCHES` (null: at random,
``optuna``: Optuna's TPE), a scheduler by ``sweep.scheduler.kind`` in :data:`SCHEDULERS`
(``asha``, ``fifo``, ``pbt``, ``pb2``). Each entry imports its Ray Tune class when a config
names it; a new one is an entry here and its name in ``config/sweep.py``'s field."""

from __future__ import annotations

import math
from typing import Any

from trainflow.config import PipelineConfig, SweepConfig


def search_space(sweep: SweepConfig, grid_as_choice: bool = False) -> dict[str, Any]:
    """Ray Tune's search space from the config's dimensions, keyed by dotted field;
    ``grid_as_choice``: a grid's values as a choice (what PBT draws mutations from)."""
    from ray import tune

    def domain(dim):
        if dim.choice is not None:
            return tune.choice(dim.choice)
        if dim.grid is not None:
            return tune.choice(dim.grid) if grid_as_choice else tune.grid_search(dim.grid)
        if dim.uniform is not None:
            return tune.uniform(*dim.uniform)
        if dim.loguniform is not None:
            return tune.loguniform(*dim.loguniform)
        return tune.randint(*dim.randint)

    return {path: domain(dim) for path, dim in sweep.space.items()}


def max_epochs(config: PipelineConfig) -> int:
    """The most epochs any trial can train: ASHA's last rung."""
    dim = config.sweep.space.get("train.epochs")
    return max(int(v) for v in dim.extremes()) if dim is not None else config.train.epochs


def asha_rungs(config: PipelineConfig) -> frozenset[int]:
    """The epochs at which ASHA compares a trial with the others (its rungs: the grace
    period times the reduction factor to the power 0, 1, ..., below the last epoch), and
    the last; none for another scheduler."""
    chosen = config.sweep.scheduler
    if chosen.kind != "asha":
        return frozenset()
    last = max_epochs(config)
    first = min(chosen.grace_period, last)
    rungs = {last}
    # As ASHA computes each rung; it ranks a trial at its first report at or past one.
    k = 0
    while (rung := first * chosen.reduction_factor**k) < last:
        rungs.add(math.ceil(rung))
        k += 1
    return frozenset(rungs)


def _asha(config: PipelineConfig, in_trial: bool):
    """ASHA counts epochs as Tune's iterations, or, for trials that train in their Tune
    process (``in_trial``) and report several epochs at once between its rungs, the
    ``epoch`` each report holds."""
    from ray.tune.schedulers import ASHAScheduler

    chosen = config.sweep.scheduler
    last = max_epochs(config)
    return ASHAScheduler(
        time_attr="epoch" if in_trial else "training_iteration",  # else one report per epoch
        max_t=last,
        grace_period=min(chosen.grace_period, last),
        reduction_factor=chosen.reduction_factor,
    )


def _fifo(config: PipelineConfig, in_trial: bool):
    from ray.tune.schedulers import FIFOScheduler

    return FIFOScheduler()


def _population(config: PipelineConfig) -> dict[str, Any]:
    """What PBT and PB2 share: they count the ``epoch`` each row reports, which a trial
    that goes on from another's checkpoint continues."""
    chosen = config.sweep.scheduler
    return {
        "time_attr": "epoch",
        "perturbation_interval": chosen.perturbation_interval,
        "quantile_fraction": chosen.quantile_fraction,
        "synch": chosen.synch,
        "log_config": False,  # the sweep's log says each exploit
    }


def _pbt(config: PipelineConfig, in_trial: bool):
    from ray.tune.schedulers import PopulationBasedTraining

    mutations = search_space(config.sweep, grid_as_choice=True)
    return PopulationBasedTraining(hyperparam_mutations={"params": mutations}, **_population(config))


def _pb2(config: PipelineConfig, in_trial: bool):
    from ray.tune.schedulers.pb2 import PB2  # with scikit-learn's Gaussian processes

    bounds = {path: list(dim.bounds) for path, dim in config.sweep.space.items()}
    return PB2(hyperparam_bounds={"params": bounds}, **_population(config))


# Ray Tune's trial scheduler for each sweep.scheduler.kind.
SCHEDULERS = {"asha": _asha, "fifo": _fifo, "pbt": _pbt, "pb2": _pb2}


def trial_scheduler(config: PipelineConfig, in_trial: bool = False):
    """Ray Tune's trial scheduler for ``config.sweep.scheduler`` (:data:`SCHEDULERS`);
    ``in_trial``: the trials train in their Tune process."""
    return SCHEDULERS[config.sweep.scheduler.kind](config, in_trial)


def _at_random(sweep: SweepConfig, max_concurrent: int):
    """Random and grid sampling, seeded by ``sweep.seed``."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=sweep.seed, max_concurrent=max_concurrent)


def _optuna(sweep: SweepConfig, max_concurrent: int):
    """Optuna's TPE sampler, seeded by ``sweep.seed``."""
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    # Optuna logs each study and trial at INFO on its own handler; trainflow logs the trials.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return ConcurrencyLimiter(OptunaSearch(seed=sweep.seed), max_concurrent=max_concurrent)


# Ray Tune's search algorithm for each sweep.search (null: at random).
SEARCHES = {None: _at_random, "optuna": _optuna}


def search_algorithm(sweep: SweepConfig, max_concurrent: int):
    """Ray Tune's search algorithm for ``sweep.search`` (:data:`SEARCHES`), at most
    ``max_concurrent`` trials at once."""
    return SEARCHES[sweep.search](sweep, max_concurrent)
