"""The old name of :mod:`trainflow.run_checks`, kept for one release: a flow of the user's
own that imports ``trainflow.checks.before_run`` (the own-flow guide's name until 0.3.0)
still runs, told once where the checks live now."""

import warnings

from trainflow.run_checks import before_predict, before_reproduce, before_run

warnings.warn(
    "trainflow.checks is now trainflow.run_checks; import before_run from there",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["before_predict", "before_reproduce", "before_run"]
