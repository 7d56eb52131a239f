"""The benchmark scripts run for real in their quick modes, and the report assembles their
sections in order. Timings are never asserted: benchmarks report them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import common
    import report

    return common, report


def run_script(name: str, *args: str, results: Path) -> dict:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args, "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (results / f"{name}.md").read_text().startswith("## ")
    return json.loads((results / f"{name}.json").read_text())


def test_report_assembles_present_sections_in_order(bench_modules, tmp_path: Path):
    common, report = bench_modules
    results = tmp_path / "results"
    common.write_section("scaling", {"growth": {"time": 15.0}}, "## Scaling\n\nrows", results)
    common.write_section("overhead", {"ratio": 1.2}, "## Overhead\n\nrows", results)
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    (analysis / "overhead.md").write_text("### Where the time goes\n\nstart-up")

    md, js = report.assemble(results, tmp_path, analysis)

    text = md.read_text()
    assert text.startswith("# Benchmarks")
    assert text.index("## Overhead") < text.index("### Where the time goes") < text.index("## Scaling")
    assert "Not measured yet: ingest, training, gpu, sweep." in text
    doc = json.loads(js.read_text())
    assert list(doc["sections"]) == ["overhead", "scaling"]
    assert doc["sections"]["scaling"]["growth"] == {"time": 15.0}
    assert doc["versions"]["ray"] and doc["machine"]["cpus"] >= 1


def test_a_section_must_start_with_its_heading(bench_modules, tmp_path: Path):
    common, _ = bench_modules
    with pytest.raises(ValueError, match="must start with '## '"):
        common.write_section("ingest", {}, "# Ingest", tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # a benchmark script in a process of its own, with Ray (and torch)
def test_gpu_section_runs_or_says_why_it_was_skipped(tmp_path: Path):
    import torch

    doc = run_script("gpu", "--quick", results=tmp_path)

    assert doc["skipped"] is (not torch.cuda.is_available())
    if doc["skipped"]:
        assert "no CUDA device" in doc["reason"]
        assert "Skipped" in (tmp_path / "gpu.md").read_text()
    else:
        assert doc["trainflow_images_per_s"] > 0 and doc["plain_images_per_s"] > 0


@pytest.mark.slow  # a benchmark script in a process of its own, with Ray (and torch)
def test_ingest_quick_measures_trainflow_and_the_floor_on_the_same_rows(tmp_path: Path):
    doc = run_script("ingest", "--quick", results=tmp_path)

    (size,) = doc["sizes"]
    assert size["floor"]["rows_per_s"] > 0
    for kind in ("trainflow", "trainflow_warm"):  # Ray's workers started during the run, or before
        assert size[kind]["rows_per_s"] > 0 and size[kind]["cpu_s"] > 0
        (run,) = size["runs"][kind]
        assert run["rows"] == size["rows"] == sum(run["counts"].values())
        assert set(run["counts"]) == {"train", "val", "test"}
