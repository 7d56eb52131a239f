"""The records of training runs under storage, as ``trainflow run --resume`` reads them:
which run of a config is unfinished, whose driver died, and what differs when a resume
is refused. Real files and real processes; no Ray."""

import subprocess
import sys

import pytest

from trainflow.config import ConfigError, PipelineConfig
from trainflow.pipelines.training.run_records import (
    Driver,
    RunRecord,
    mark_registered,
    newest_checkpoint,
    recorded_run,
    records,
    run_to_resume,
    write_record,
)
from trainflow.testing import small_config


def config(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate(small_config(**sections))


def dead_driver() -> Driver:
    """The driver record of a process that ran on this machine and exited."""
    code = (
        "from trainflow.pipelines.training.run_records import Driver; print(Driver.this().model_dump_json())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return Driver.model_validate_json(out.stdout)


def record(cfg: PipelineConfig, run_name: str, *, status="running", driver=None, started=1.0, fp="fp1"):
    """A run's record, as write_record leaves it, for a run that wrote a checkpoint (the
    tests write it under a storage folder and make its checkpoint folder: checkpointed)."""
    return RunRecord(
        model=cfg.name,
        run_name=run_name,
        config_hash=cfg.config_hash(),
        fingerprint=fp,
        config=cfg.model_dump(mode="json"),
        started=started,
        driver=driver or dead_driver(),
        status=status,
    )


def checkpointed(storage, rec: RunRecord) -> None:
    write_record(str(storage), rec)
    (storage / rec.run_name / "checkpoint_2026-11-23_10-00-00.000000").mkdir()


def test_a_run_is_recorded_running_then_how_it_ended(tmp_path):
    cfg = config()
    with recorded_run(str(tmp_path), cfg, "fp1", "digits-test-aaaa", flow_run="f1") as rec:
        [seen] = records(str(tmp_path), cfg.name)
        assert seen.status == "running" and seen.driver.alive() is True and not seen.driver_died()
        rec.status = "completed"
    [seen] = records(str(tmp_path), cfg.name)
    assert seen.status == "completed" and not seen.unfinished and seen.ended
    assert run_to_resume(str(tmp_path), cfg, "fp1") is None  # a finished run is not resumed


def test_a_run_left_by_an_error_is_interrupted_and_resumable(tmp_path):
    cfg = config()
    with pytest.raises(RuntimeError), recorded_run(str(tmp_path), cfg, "fp1", "digits-test-bbbb"):
        (tmp_path / "digits-test-bbbb" / "checkpoint_000000").mkdir()  # Ray's, after epoch 1
        raise RuntimeError("lost the cluster")
    with pytest.raises(RuntimeError), recorded_run(str(tmp_path), cfg, "fp1", "digits-test-cccc"):
        raise RuntimeError("bad data")  # before any checkpoint: nothing to resume
    found = run_to_resume(str(tmp_path), cfg, "fp1")
    assert found is not None and found.run_name == "digits-test-bbbb" and found.status == "interrupted"


def test_a_run_trained_to_its_end_is_left_to_register_until_its_version_is_recorded(tmp_path):
    cfg = config()
    with recorded_run(str(tmp_path), cfg, "fp1", "digits-test-dddd") as rec:
        rec.status, rec.trained = "completed", {"run_name": "digits-test-dddd", "best_checkpoint": "/c"}
    found = run_to_resume(str(tmp_path), cfg, "fp1")  # no checkpoint folder needed: its result is kept
    assert found is not None and found.run_name == "digits-test-dddd" and found.to_register
    mark_registered(str(tmp_path), "digits-test-dddd", "3")
    [seen] = records(str(tmp_path), cfg.name)
    assert seen.registered == "3" and not seen.to_register
    assert run_to_resume(str(tmp_path), cfg, "fp1") is None
    mark_registered(str(tmp_path), "trial-00000", "4")  # a sweep's trial has no record: nothing written
    assert not (tmp_path / "trial-00000").exists()


def test_a_driver_that_exited_is_dead_and_this_one_alive():
    assert Driver.this().alive() is True
    gone = dead_driver()
    assert gone.alive() is False
    assert gone.model_copy(update={"host": "another-machine"}).alive() is None  # cannot tell from here
    assert gone.model_copy(update={"boot": "another-boot"}).alive() is False  # the machine restarted


def test_the_latest_unfinished_run_of_the_same_config_and_data_is_resumed(tmp_path):
    cfg, other = config(), config(train={"lr": 0.02})
    for rec in (
        record(cfg, "digits-test-0001", started=1.0),
        record(cfg, "digits-test-0002", started=2.0),
        record(cfg, "digits-test-0003", started=3.0, status="completed"),
        record(other, "digits-test-0004", started=0.5),
        record(cfg, "digits-test-0005", started=5.0, fp="fp2"),
    ):
        checkpointed(tmp_path, rec)
    (tmp_path / "digits-test-ffff").mkdir()  # a run folder without a record: skipped
    assert run_to_resume(str(tmp_path), cfg, "fp1").run_name == "digits-test-0002"
    assert run_to_resume(str(tmp_path), other, "fp1").run_name == "digits-test-0004"
    assert run_to_resume(str(tmp_path), config(name="another"), "fp1") is None


def test_a_resume_of_another_config_is_refused_naming_the_difference(tmp_path):
    checkpointed(tmp_path, record(config(), "digits-test-0001"))
    with pytest.raises(ConfigError) as e:
        run_to_resume(str(tmp_path), config(train={"lr": 0.02, "epochs": 3}), "fp1")
    message = str(e.value)
    assert "digits-test-0001" in message and "train.lr 0.01 (now 0.02)" in message
    assert "train.epochs 1 (now 3)" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"other data \(input fingerprint fp1, now fp9\)"):
        run_to_resume(str(tmp_path), config(), "fp9")


def test_a_run_that_wrote_no_checkpoint_is_not_one_to_resume(tmp_path):
    write_record(str(tmp_path), record(config(), "digits-test-0001"))  # another config, no checkpoint
    assert run_to_resume(str(tmp_path), config(train={"lr": 0.02}), "fp1") is None


def test_a_run_whose_driver_still_runs_is_not_resumed(tmp_path):
    cfg = config()
    checkpointed(tmp_path, record(cfg, "digits-test-0001", driver=Driver.this()))
    with pytest.raises(ConfigError, match="is still running"):
        run_to_resume(str(tmp_path), cfg, "fp1")


def test_the_newest_whole_checkpoint_is_found_even_when_ray_never_recorded_it(tmp_path):
    from trainflow.pipelines.models.checkpoint import METRICS, MODEL, TRAIN_STATE

    run = tmp_path / "digits-test-0001"
    for name, epoch, files in [
        ("checkpoint_a", 2, (MODEL, TRAIN_STATE)),
        ("checkpoint_b", 3, (MODEL, TRAIN_STATE)),
        ("checkpoint_c", 4, (MODEL,)),  # killed while it was being written
    ]:
        (run / name).mkdir(parents=True)
        (run / name / METRICS).write_text(f'{{"epoch": {epoch}}}')
        for file in files:
            (run / name / file).write_bytes(b"x")
    assert newest_checkpoint(str(tmp_path), run.name) == (str(run / "checkpoint_b"), 3)
    assert newest_checkpoint(f"file://{tmp_path}", run.name) == (str(run / "checkpoint_b"), 3)
    assert newest_checkpoint(str(tmp_path), "digits-test-none") is None
    assert newest_checkpoint("s3://bucket/runs", run.name) is None  # Ray's own record there
