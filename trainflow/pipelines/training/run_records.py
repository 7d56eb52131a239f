"""The training runs under ``storage``, as a new driver finds them: which run of a config is
unfinished, so that ``trainflow run --resume`` continues it after its process died.

Each run's folder (``storage/<run name>``, Ray Train's own) holds ``trainflow-run.json``
beside Ray's checkpoints: the model's name, the config and its hash, the data's
fingerprint, the driver (host, boot, pid and its start time) and a status: ``running``,
then ``completed``, ``early_stopped`` or ``diverged``, else ``interrupted``. An
``interrupted`` run, or a ``running`` one whose driver is gone, is unfinished, and Ray Train
resumes it from its latest checkpoint. A run that trained to its end keeps its result
(``trained``) until register records its version (``registered``), so ``--resume``
registers one whose registering failed without training again."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from trainflow.config import ConfigError, PipelineConfig
from trainflow.files import filesystem, is_uri, join, publishing_folder, redacted

if TYPE_CHECKING:
    import ray.train

RUN_RECORD = "trainflow-run.json"
FINISHED = ("completed", "early_stopped", "diverged")


class Driver(BaseModel):
    """The process that runs a training: alive or not, told on its own machine."""

    host: str
    boot: str  # the kernel's boot id: a machine that restarted ran another process
    pid: int
    start: int  # the pid's start time (clock ticks since boot): a reused pid is another process

    @classmethod
    def this(cls) -> Driver:
        return cls(host=socket.gethostname(), boot=_boot_id(), pid=os.getpid(), start=_pid_start(os.getpid()))

    def alive(self) -> bool | None:
        """Whether the process still runs; None when it ran on another machine."""
        if self.host != socket.gethostname():
            return None
        if self.boot != _boot_id():
            return False  # the machine restarted since
        start = _pid_start(self.pid)
        return start == self.start if self.boot else start >= 0  # off Linux: the pid alone

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_start(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc is missing but the
    process exists), -1 when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return -1
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return -1
        except PermissionError:
            pass
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command's ")"


class RunRecord(BaseModel):
    """One training run of one config on one input, as its folder under ``storage`` records it."""

    model: str  # the config's name
    run_name: str  # the Ray Train run's name: its folder under storage
    config_hash: str
    fingerprint: str  # the input's (SourceInfo.fingerprint)
    config: dict[str, Any]
    started: float  # seconds since the epoch
    flow_run: str | None = None  # the Prefect flow run that started it
    driver: Driver
    status: str = "running"  # running | interrupted | completed | early_stopped | diverged
    ended: float | None = None
    trained: dict[str, Any] | None = None  # the train step's result, once training ended
    registered: str | None = None  # the version the register step made of it
    # The unfinished record of the same run that this one continues; not written.
    previous: RunRecord | None = Field(default=None, exclude=True, repr=False)

    @property
    def unfinished(self) -> bool:
        return self.status not in FINISHED

    @property
    def to_register(self) -> bool:
        """Trained to its end, and not registered (its registering failed)."""
        return not self.unfinished and self.trained is not None and self.registered is None

    def driver_died(self) -> bool:
        """Written ``running`` by a driver that is gone (seen from its own machine)."""
        return self.status == "running" and self.driver.alive() is False

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        flow = f", flow run {self.flow_run}" if self.flow_run else ""
        return f"Ray run {self.run_name} (started {when} by {self.driver.describe()}{flow})"


def write_record(storage: str, record: RunRecord) -> None:
    """Write (or replace) a run's record, whole: a reader never sees half of one."""
    import pyarrow.fs

    fs, root = filesystem(storage)
    folder = f"{root}/{record.run_name}"
    fs.create_dir(folder, recursive=True)
    data = record.model_dump_json(indent=1).encode()
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        tmp = Path(folder) / f".tmp-{uuid.uuid4().hex[:8]}-{RUN_RECORD}"
        tmp.write_bytes(data)
        os.replace(tmp, Path(folder) / RUN_RECORD)
    else:  # an object store's put is atomic
        with fs.open_output_stream(f"{folder}/{RUN_RECORD}") as out:
            out.write(data)


def records(storage: str, model: str) -> list[RunRecord]:
    """Every recorded run of ``model`` under ``storage``, oldest first."""
    import pyarrow.fs

    fs, root = filesystem(storage)
    try:
        folders = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    except OSError:
        return []
    found = []
    for info in folders:
        if info.type != pyarrow.fs.FileType.Directory or not info.base_name.startswith(f"{model}-"):
            continue
        try:
            with fs.open_input_stream(f"{info.path}/{RUN_RECORD}") as f:
                record = RunRecord.model_validate_json(f.read())
        except (OSError, ValueError):
            continue  # no readable record: another tool's folder, or an older trainflow's
        if record.model == model:
            found.append(record)
    return sorted(found, key=lambda r: r.started)


def run_to_resume(storage: str, config: PipelineConfig, fingerprint: str) -> RunRecord | None:
    """The latest unfinished run of ``config`` on the input of ``fingerprint`` under
    ``storage``, to continue from its latest checkpoint; None when ``config.name`` has no
    unfinished run with a checkpoint there. ConfigError when it has some, but of another config or input
    (naming the difference), or when the one to resume still runs."""
    # A run that ended before its first checkpoint (a failed check, bad data, a driver
    # killed early) has nothing to continue: a new run is the same thing.
    unfinished = [
        r
        for r in records(storage, config.name)
        if r.to_register or (r.unfinished and _checkpointed(storage, r))
    ]
    if not unfinished:
        return None
    same = [r for r in unfinished if r.config_hash == config.config_hash() and r.fingerprint == fingerprint]
    if not same:
        latest = unfinished[-1]
        raise ConfigError(
            f"--resume: the unfinished {latest.describe()} under {storage} "
            f"{_difference(latest, config, fingerprint)}: run with the same config and data to resume "
            "it, or without --resume to start a new run"
        )
    record = same[-1]
    if record.status == "running" and record.driver.alive():
        raise ConfigError(
            f"--resume: {record.describe()} is still running: wait for it, or stop it and resume"
        )
    return record


def _checkpointed(storage: str, record: RunRecord) -> bool:
    """Whether the run's folder holds a checkpoint."""
    import pyarrow.fs

    fs, root = filesystem(storage)
    try:
        entries = fs.get_file_info(pyarrow.fs.FileSelector(f"{root}/{record.run_name}"))
    except OSError:
        return False
    return any(e.base_name.startswith("checkpoint_") for e in entries)


def _difference(record: RunRecord, config: PipelineConfig, fingerprint: str) -> str:
    """``was trained with train.lr 0.01 (now 0.02), train.epochs 8 (now 10)`` and the like."""
    if record.config_hash != config.config_hash():
        old = _flat(record.config)
        new = _flat(config.model_dump(mode="json"))
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        shown = ", ".join(f"{k} {json.dumps(old.get(k))} (now {json.dumps(new.get(k))})" for k in keys[:4])
        more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
        return f"was trained with {shown or 'another config'}{more}"
    return f"was trained on other data (input fingerprint {record.fingerprint}, now {fingerprint})"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_record(storage: str, run_name: str) -> RunRecord | None:
    """The record of the run ``run_name`` under ``storage``; None when it has none."""
    fs, root = filesystem(storage)
    try:
        with fs.open_input_stream(f"{root}/{run_name}/{RUN_RECORD}") as f:
            return RunRecord.model_validate_json(f.read())
    except (OSError, ValueError):
        return None


def mark_registered(storage: str, run_name: str, version: str) -> None:
    """Record that the run ``run_name`` under ``storage`` became ``version``; nothing for a
    run with no record (a sweep's trial)."""
    record = read_record(storage, run_name)
    if record is not None and record.registered != version:
        write_record(storage, record.model_copy(update={"registered": version}))


@contextmanager
def recorded_run(
    storage: str,
    config: PipelineConfig,
    fingerprint: str,
    run_name: str,
    flow_run: object | None = None,
) -> Iterator[RunRecord]:
    """Record the run ``running`` by this process for the block; set ``record.status`` to
    how training ended inside it. A run of that name recorded before and not finished is
    continued: its record becomes ``record.previous``, and its start is kept. Written
    again on the way out: ``interrupted`` when the block left before training ended (an
    error, a cancelled flow run), so that ``--resume`` finds it."""
    previous = read_record(storage, run_name)
    if previous is not None and not (previous.unfinished and previous.model == config.name):
        previous = None
    record = RunRecord(
        model=config.name,
        run_name=run_name,
        config_hash=config.config_hash(),
        fingerprint=fingerprint,
        config=config.model_dump(mode="json"),
        started=previous.started if previous else time.time(),
        flow_run=str(flow_run) if flow_run else None,
        driver=Driver.this(),
    )
    record.previous = previous
    write_record(storage, record)
    try:
        yield record
    finally:
        if record.status == "running":
            record.status = "interrupted"
        record.ended = time.time()
        write_record(storage, record)


def newest_checkpoint(storage: str, run_name: str) -> tuple[str, int] | None:
    """The folder and epoch of the run's newest checkpoint written whole (its weights, its
    train state and its metrics), on a storage folder (local or a shared mount; None on a
    URI). Ray Train's controller records a checkpoint after its worker wrote it: a driver
    killed in between leaves the newest folder unrecorded, and resuming from Ray's record
    alone would train its epoch again."""
    from trainflow.pipelines.models.checkpoint import METRICS, MODEL, TRAIN_STATE

    if "://" in storage and not storage.startswith("file://"):
        return None
    run = Path(storage.removeprefix("file://")) / run_name
    best: tuple[str, int] | None = None
    for folder in run.glob("checkpoint_*") if run.is_dir() else ():
        try:
            epoch = json.loads((folder / METRICS).read_text())["epoch"]
        except (OSError, ValueError, KeyError):
            continue
        if (
            (folder / MODEL).is_file()
            and (folder / TRAIN_STATE).is_file()
            and (best is None or epoch > best[1])
        ):
            best = (str(folder), int(epoch))
    return best


def local_checkpoint(checkpoint) -> str:
    """A Ray Train checkpoint as a folder on this machine, for what reads it after training
    (metrics, evaluation, the registry): the checkpoint's own folder on local storage (a
    folder or ``file://``), else a copy downloaded once from the object store into
    ``TRAINFLOW_HOME/checkpoints/<run name>/<checkpoint>``, published whole."""
    import pyarrow.fs

    from trainflow.workspace import workspace

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return checkpoint.path
    parts = checkpoint.path.rstrip("/").split("/")
    copy = workspace().home / "checkpoints" / parts[-2] / parts[-1]
    if not copy.is_dir():
        with publishing_folder(copy, finished=Path.is_dir) as tmp:
            checkpoint.to_directory(str(tmp))
    return str(copy)


def stored_run_path(storage: str, run_name: str, result: ray.train.Result) -> str:
    """Where the run ``run_name`` is stored, as the result shows it (a URI's secrets hidden)."""
    return redacted(join(storage, run_name)) if is_uri(storage) else str(result.path)
