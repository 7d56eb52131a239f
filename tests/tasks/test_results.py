"""The values steps pass (trainflow/tasks/results.py): a result handed to a step it was
not made for is refused in one line."""

import pytest

from trainflow.tasks.results import Drifted, Prepared
from trainflow.tasks.steps import StepInputError


def test_registering_with_another_runs_drift_result_is_refused():
    prepared = Prepared(
        path="/cache/a",
        counts={},
        preprocessor={},
        num_features=1,
        num_outputs=2,
        fingerprint="aaa",
        reused=False,
    )
    Drifted(prepared="aaa").check_measured(prepared, "register")
    with pytest.raises(StepInputError, match=r"register: drifted measured other prepared splits \(bbb\)"):
        Drifted(prepared="bbb").check_measured(prepared, "register")
