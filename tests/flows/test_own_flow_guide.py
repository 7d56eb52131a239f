"""The own-flow guide's Python snippets, run as written: from the repository's folder (their
config path is relative to it), each in a namespace of its own, on the session's Ray
cluster and Prefect server. A snippet that defines a flow has it called as its reader
would; the Dataset snippet is handed the ``ds`` and ``config`` its prose speaks of."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "own-flow.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_own_flow_guides_snippets_run_as_written(
    ray_cluster, prefect_harness, trainflow_home, monkeypatch
):
    import ray.data
    from prefect import flow
    from sklearn.datasets import load_digits

    from trainflow import load_config
    from trainflow.tasks import preprocess
    from trainflow.tasks.results import PipelineResult, Prepared, Registered

    monkeypatch.chdir(REPO)
    whole, steps, dataset, careful = snippets()

    first: dict = {}
    exec(whole, first)
    assert isinstance(first["result"], PipelineResult) and first["result"].registered.version == "1"

    second: dict = {}
    exec(steps, second)
    second["my_flow"]()  # its my_check task ran on the prepared splits, or the flow failed

    digits = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    third = {
        "ds": ray.data.from_pandas(digits),
        "config": load_config("configs/digits.yaml"),
        "preprocess": preprocess,
    }
    flow(name="dataset-snippet")(lambda: exec(dataset, third))()  # in a flow of the reader's
    assert isinstance(third["prepared"], Prepared) and sum(third["prepared"].counts.values()) == len(digits)

    fourth: dict = {}
    exec(careful, fourth)
    registered = fourth["careful_training"]()
    assert isinstance(registered, Registered) and registered.name == "digits"
