"""The checks before a run: each run checks once, and a bad run fails in one line."""

import subprocess
import sys

import pytest

from trainflow import checks
from trainflow.config import ConfigError, load_config
from trainflow.pipelines.data import schema as data
from trainflow.pipelines.data.schema import DataError


@pytest.fixture
def inspections(monkeypatch, trainflow_home) -> list[str]:
    """Every inspection of a data source in this test, by source."""
    seen: list[str] = []
    inspect = data.inspect_source

    def counted(cfg, *args, **kwargs):
        seen.append(cfg.source)
        return inspect(cfg, *args, **kwargs)

    monkeypatch.setattr(data, "inspect_source", counted)
    return seen


def test_a_held_check_is_taken_once_by_the_run_that_follows(inspections):
    config = load_config({"name": "held"})
    held = checks.before_run(config, hold=True)  # the command, before anything starts
    assert checks.before_run(config) is held  # its flow run: no second look
    assert inspections == ["builtin:digits"]
    # The next run in this process (a served deployment's) checks afresh.
    again = checks.before_run(config)
    assert again is not held and again.source.fingerprint == held.source.fingerprint
    assert inspections == ["builtin:digits", "builtin:digits"]
    checks.before_run(config)
    assert len(inspections) == 3  # nothing was held by the flow run's own check


def test_a_check_held_for_one_config_is_not_taken_by_another(inspections):
    checks.before_run(load_config({"name": "one"}), hold=True)
    checks.before_run(load_config({"name": "other"}))
    assert len(inspections) == 2
    checks.before_run(load_config({"name": "one"}))  # still held for its own run
    assert len(inspections) == 2


def test_a_failed_check_holds_nothing(inspections):
    config = load_config({"name": "bad", "data": {"source": "/no/such/data.csv"}})
    for _ in range(2):
        with pytest.raises(DataError, match="data.source /no/such/data.csv: no such file"):
            checks.before_run(config, hold=True)


def test_a_sweep_without_a_sweep_section_is_refused_naming_the_field(inspections):
    with pytest.raises(ConfigError, match=r"^invalid config: sweep: plain has no sweep section; add one"):
        checks.before_run(load_config({"name": "plain"}), sweep=True)
    assert inspections == []  # refused before the source is looked at


@pytest.mark.slow
def test_a_command_run_checks_once_and_its_flow_run_takes_the_result(
    ray_cluster, prefect_harness, inspections
):
    from tests.e2e.test_cli import trainflow_in_process

    out = trainflow_in_process("run", "--smoke")
    assert out.returncode == 0, out.output
    assert "model       digits-smoke version 1 -> champion" in out.output
    # The command checked before it started anything; the flow run and its ingest step
    # took that result instead of looking at the source again.
    assert inspections == ["builtin:digits"]


def test_the_checks_before_a_run_import_neither_torch_nor_ray():
    # They run before Prefect's server and Ray start: seconds of imports here would come
    # before everything else a command does, and before a bad config's one line.
    code = (
        "import sys, trainflow.checks\n"
        "print(sorted(m for m in ('torch', 'ray', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
