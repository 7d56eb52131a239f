import json
from pathlib import Path

import pytest

pytest_plugins = ["trainflow.testing"]

# The suite's per-file wall times as benchmarks/suite.py last measured them.
SUITE_RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "suite.json"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest test files first, each file's tests in their own order.

    `make test` hands whole files to its pytest-xdist workers in this order (with
    ``--no-loadscope-reorder``; xdist's own order puts the files with most tests first, and
    so the one-test end-to-end files, the longest, last: in one run a worker sat idle
    through the last of them). Longest first is the usual schedule for such a queue; it
    measured no faster than xdist's order (benchmarks/analysis/suite.md), the suite being
    bound by its CPU. A file the last measurement does not name (a new one) is placed as
    if it took a minute."""
    try:
        files = json.loads(SUITE_RESULTS.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return
    wall = {name: figures["wall_s"] for name, figures in files.items()}
    default = 60.0
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-wall.get(item.nodeid.split("::", 1)[0], default), order[id(item)]))
