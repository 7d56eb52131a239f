"""What a sweep hands Ray Tune to draw and rank its trials: the search space of its
dimensions, the search algorithm (at random or Optuna's TPE), the trial scheduler (ASHA,
FIFO, PBT, PB2) and the epochs at which ASHA compares trials (its rungs)."""

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


def trial_scheduler(config: PipelineConfig, in_trial: bool = False):
    """Ray Tune's trial scheduler for ``config.sweep.scheduler``. ASHA counts epochs as
    Tune's iterations, or, for trials that train in their Tune process (``in_trial``) and
    report several epochs at once between its rungs, the ``epoch`` each report holds;
    PBT and PB2 count the ``epoch`` each row reports, which a trial that goes on from
    another's checkpoint continues."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    sweep = config.sweep
    chosen = config.sweep.scheduler
    if chosen.kind == "asha":
        last = max_epochs(config)
        return ASHAScheduler(
            time_attr="epoch" if in_trial else "training_iteration",  # else one report per epoch
            max_t=last,
            grace_period=min(chosen.grace_period, last),
            reduction_factor=chosen.reduction_factor,
        )
    if chosen.kind == "fifo":
        return FIFOScheduler()
    common = {
        "time_attr": "epoch",
        "perturbation_interval": chosen.perturbation_interval,
        "quantile_fraction": chosen.quantile_fraction,
        "synch": chosen.synch,
        "log_config": False,  # the sweep's log says each exploit
    }
    if chosen.kind == "pb2":
        from ray.tune.schedulers.pb2 import PB2  # with scikit-learn's Gaussian processes

        bounds = {path: list(dim.bounds) for path, dim in sweep.space.items()}
        return PB2(hyperparam_bounds={"params": bounds}, **common)
    return PopulationBasedTraining(
        hyperparam_mutations={"params": search_space(sweep, grid_as_choice=True)}, **common
    )


def search_algorithm(sweep: SweepConfig, max_concurrent: int):
    """Ray Tune's search algorithm for ``sweep.search``, at most ``max_concurrent`` trials at
    once: random and grid sampling, or Optuna's TPE sampler, seeded by ``sweep.seed``."""
    if sweep.search == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        # Optuna logs each study and trial at INFO on its own handler; trainflow logs the trials.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return ConcurrencyLimiter(OptunaSearch(seed=sweep.seed), max_concurrent=max_concurrent)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=sweep.seed, max_concurrent=max_concurrent)
