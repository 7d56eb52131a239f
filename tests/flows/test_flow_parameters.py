"""A flow's parameters: a config or a path in the checkout, overrides and smoke on top."""

from pathlib import Path

from trainflow.config import load_config
from trainflow.flows.training import DEFAULT_CONFIG, resolve_config

REPO = Path(__file__).resolve().parents[2]


def test_flow_parameters_resolve_paths_overrides_and_smoke():
    assert resolve_config(DEFAULT_CONFIG) is DEFAULT_CONFIG  # a config is used as it is, not loaded again
    from_path = resolve_config(str(REPO / "configs" / "digits.yaml"), ["train.epochs=3"])
    assert from_path.train.epochs == 3
    smoke = resolve_config(load_config({"name": "mine"}), smoke=True)
    assert smoke.name == "mine-smoke"
    assert (smoke.train.epochs, smoke.scaling.num_workers, smoke.data.limit) == (1, 1, 600)
