"""Flow-level policy: trainings of one model take turns; run names say what ran."""

import threading
import time
from pathlib import Path

from trainflow.config import load_config
from trainflow.flows.training import DEFAULT_CONFIG, one_run_per_model, resolve_config

REPO = Path(__file__).resolve().parents[2]


def test_two_trainings_of_one_model_take_turns(prefect_harness):
    entered = {}

    def second():
        with one_run_per_model("turns"):
            entered["second"] = time.monotonic()

    with one_run_per_model("turns"):
        other = threading.Thread(target=second)
        other.start()
        time.sleep(3)
        assert "second" not in entered  # waiting for the slot
        released = time.monotonic()
    other.join(60)
    assert entered["second"] >= released

    # Another model's training does not wait.
    with one_run_per_model("turns"), one_run_per_model("another-model"):
        pass


def test_flow_parameters_resolve_paths_overrides_and_smoke():
    assert resolve_config(DEFAULT_CONFIG) == DEFAULT_CONFIG
    from_path = resolve_config(str(REPO / "configs" / "digits.yaml"), ["train.epochs=3"])
    assert from_path.train.epochs == 3
    smoke = resolve_config(load_config({"name": "mine"}), smoke=True)
    assert smoke.name == "mine-smoke"
    assert (smoke.train.epochs, smoke.scaling.num_workers, smoke.data.limit) == (1, 1, 600)
