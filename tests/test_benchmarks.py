"""The benchmark scripts run for real in their quick modes, and the report assembles their
sections in order. Timings are never asserted: benchmarks report them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# A script that hangs fails its test rather than the suite's deadline. The slowest quick
# mode (gpu.py --cpu-check: bf16 autocast, which a CPU without bf16 units emulates) takes
# minutes on 2 cores beside the suite's other tests: the bound leaves it room on a slower host.
SCRIPT_TIMEOUT_S = 900


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
        timeout=SCRIPT_TIMEOUT_S,
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
    assert (
        "Not measured yet: overhead_phases, warm_start, load, cold_under_load, ingest, training, "
        "epoch_save, resnet, scaling_streamed, large_prepare, "
        "engine, image_memory, batch_predict, serve, gpu, sweep, hf_models, hf_finetune, suite." in text
    )
    assert "- overhead: " in text and "CPUs" in text  # when, where, under what load, by what command
    doc = json.loads(js.read_text())
    assert list(doc["sections"]) == ["overhead", "scaling"]
    assert doc["sections"]["overhead"]["command"]  # every section records the command that wrote it
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
        assert doc["loop"]["trainflow_images_per_s"] > 0 and doc["loop"]["plain_images_per_s"] > 0
        for run in doc["ray_train"]["runs"]:
            assert run["device"].startswith("cuda") and run["backend"] == "nccl", run


@pytest.mark.slow  # a benchmark script in a process of its own, with Ray (and torch)
def test_the_gpu_script_runs_each_of_its_paths_on_the_cpu_where_there_is_no_gpu(tmp_path: Path):
    """``gpu.py --cpu-check``: the loop alone and the three Ray Train paths (trainflow's loop
    on in-memory and streamed splits, a train.loop of the user's own) run on one CPU worker
    with gloo, each against its plain PyTorch loop, and an hf: transformer's loop under
    train.precision auto (full precision on a CPU); figures for no GPU."""
    doc = run_script("gpu", "--cpu-check", results=tmp_path)

    assert doc["cpu_check"] is True and doc["skipped"] is False
    assert doc["loop"]["trainflow_images_per_s"] > 0 and doc["loop"]["plain_images_per_s"] > 0
    runs = doc["ray_train"]["runs"]
    assert [r["baseline"] for r in runs] == ["on_device", "pinned_loader", "pinned_loader"]
    for run in runs:
        assert run["device"] == "cpu" and run["backend"] == "gloo", run
        assert run["images_per_s"] > 0 and run["baseline_images_per_s"] > 0 and run["ratio"] > 0, run
    text = doc["transformer"]
    assert text["precision"] == "32"  # train.precision: auto on a CPU
    assert text["trainflow_texts_per_s"] > 0 and text["plain_texts_per_s"] > 0 and text["ratio"] > 0
    assert "CPU check" in (tmp_path / "gpu.md").read_text()


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


def test_epoch_save_quick_times_the_loops_own_saves_with_the_whole_history(tmp_path: Path):
    doc = run_script("epoch_save", "--quick", results=tmp_path)

    assert [row["history"] for row in doc["rows"]] == [20, 200]
    for row in doc["rows"]:
        assert row["trainflow_ms"] > 0 and row["plain_ms"] > 0
        # What was timed: whole checkpoints, the latest holding every epoch, the best and it kept.
        assert row["latest_history"] == row["history"]
        assert row["kept"][-1] == f"checkpoint_epoch_{row['history']:06d}" and 1 <= len(row["kept"]) <= 3


@pytest.mark.slow  # prepares images and trains a ResNet-18 twice, with Ray (and torch)
def test_resnet_quick_runs_trainflow_and_plain_pytorch_on_the_same_rows_and_threads(tmp_path: Path):
    doc = run_script("resnet", "--quick", results=tmp_path)

    assert sum(doc["counts"].values()) == doc["rows"] == 400
    (round_,) = doc["rounds"]
    t, p = round_["trainflow"], round_["plain"]
    assert t["in_memory"] == ["train", "val"]  # what train.in_memory: auto picks for splits this small
    assert t["threads"] == [p["threads"]] == [1]  # the worker's one CPU, and the baseline set to match
    assert t["nice"] == [p["nice"]]  # Ray's niceness for its workers, the baseline's set to match
    assert f"{p['parameters']:,} of" in t["parameters"]  # the same model on both sides
    assert len(t["epoch_s"]) == len(p["epoch_s"]) == doc["epochs"] - 1 == 1  # epoch 1 left out
    assert t["samples_per_s"] > 0 and p["samples_per_s"] > 0 and t["startup_s"] > 0
    assert t["samples_per_cpu_s"] > 0 and p["samples_per_cpu_s"] > 0
    assert doc["ratio"] == round(t["samples_per_s"] / p["samples_per_s"], 3)
    assert doc["met"] is (doc["ratio"] >= 0.9)
    assert "ResNet-18 on 32x32 images (quick run)" in (tmp_path / "resnet.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--epochs", "1"], "--epochs must be at least 2"), (["--rows", "50"], "--rows must be at least 100")],
)
def test_resnet_refuses_sizes_it_cannot_measure_before_starting_ray(args: list[str], message: str):
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "resnet.py"), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and message in out.stderr.splitlines()[-1]


def test_overhead_phases_read_only_timeline_lines(bench_modules):
    import overhead

    stderr = (
        "Starting Prefect server\n"
        "timeline 0.50 imports\n"
        "(RayTrainWorker pid=7) timeline 3.0 worker imports\n"  # another process's clock: ignored
        "  timeline 2.25 ray start\r\n"
        "timeline soon broken line\n"
        "timeline 7 train\n"
    )
    marks = overhead.parse_timeline(stderr)
    assert marks == [(0.5, "imports"), (2.25, "ray start"), (7.0, "train")]
    assert overhead.phase_durations(marks, 10.0) == [
        {"phase": "(process start)", "until": "imports", "start_s": 0.0, "duration_s": 0.5},
        {"phase": "imports", "until": "ray start", "start_s": 0.5, "duration_s": 1.75},
        {"phase": "ray start", "until": "train", "start_s": 2.25, "duration_s": 4.75},
        {"phase": "train", "until": "(command exits)", "start_s": 7.0, "duration_s": 3.0},
    ]
    assert overhead.phase_durations([], 10.0) == []


def test_run_measured_counts_the_cpu_of_processes_that_outlive_the_command(bench_modules, tmp_path: Path):
    common, _ = bench_modules
    script = tmp_path / "daemon.py"
    script.write_text(
        "import os, time\n"
        "def busy(s):\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < s: pass\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # leaves the session, as a daemon does
        "    busy(0.6)\n"
        "    os._exit(0)\n"
        "print('started')\n"
    )
    r = common.run_measured([sys.executable, str(script)], {}, tmp_path)

    assert r["returncode"] == 0 and r["stdout"] == "started\n"
    if r["cpu_method"].startswith("cgroup"):  # sampling /proc may miss a process that left
        assert r["cpu_s"] >= 0.6
    assert r["tree_exit_s"] >= r["wall_s"] and r["stragglers_killed"] == 0


def test_the_suite_benchmark_counts_each_tests_cpu_with_what_its_daemons_spend(tmp_path: Path):
    # A test whose work is done by a process that leaves it (as Ray's workers and the
    # commands' servers do): a shell's `time` misses it, the suite's cgroup does not.
    (tmp_path / "test_daemon.py").write_text(
        "import os, time\n"
        "def test_work_done_by_a_daemon(tmp_path):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            t = time.process_time()\n"
        "            while time.process_time() - t < 0.6: pass\n"
        "            (tmp_path / 'done').touch()\n"
        "        os._exit(0)\n"
        "    while not (tmp_path / 'done').exists(): time.sleep(0.01)\n"
        "\n"
        "def test_nothing():\n"
        "    pass\n"
    )
    figures = run_script("suite", str(tmp_path / "test_daemon.py"), results=tmp_path / "r")

    assert figures["returncode"] == 0 and "2 passed" in figures["summary"]
    rows = {r["test"].rsplit("::", 1)[1]: r for r in figures["tests"]}
    assert set(rows) == {"test_work_done_by_a_daemon", "test_nothing"}
    assert figures["files"][next(iter(figures["files"]))]["tests"] == 2
    if figures["cpu_method"].startswith("cgroup"):  # else the plugin says it counted less
        # The daemon spun 0.6 CPU-seconds; the figures are rounded to 0.01 each.
        assert rows["test_work_done_by_a_daemon"]["cpu_s"] >= 0.6 - 0.01
        assert figures["cpu_s"] - figures["waited_cpu_s"] >= 0.6 - 0.02
