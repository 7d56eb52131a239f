"""What a served model was asked, scored for drift: each serving replica keeps a bounded
uniform sample of the rows it answered (:class:`RequestSample`) and writes it under
``serving/<name>/`` of the served version's ``storage`` (where every machine of a team
reaches it), else of TRAINFLOW_HOME (every SAVE_EVERY_S seconds when it took rows, from a
thread of the replica's own); ``trainflow models drift NAME`` and the watch-served flow
read every replica's sample and score it against the champion's profile
(:func:`served_drift`).

A replica's sample is a reservoir (Vitter's algorithm R): every row answered so far is
in it with the same chance, whatever the traffic, in at most SAMPLE_ROWS rows. It is
written whole, by a rename, as Parquet with the rows it was drawn from and the version
that answered last. Images are not sampled: a model's profile holds no pixels.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainflow.files import filesystem, is_uri, replacing_file
from trainflow.pipelines.data.schema import IMAGE, DataError

if TYPE_CHECKING:
    from trainflow.pipelines.drift.compare import DriftReport
    from trainflow.workspace import Workspace

SAMPLE_ROWS = 1000
SAVE_EVERY_S = 5.0
SEEN = "trainflow.seen"  # the file's metadata: the rows the sample was drawn from
VERSION = "trainflow.version"  # ... and the version that last answered


def samples_folder(ws: Workspace, name: str, storage: str | None = None) -> str:
    """Where ``name``'s served samples go: under ``storage`` (a config's: a shared folder
    or a URI), else under TRAINFLOW_HOME."""
    return f"{storage.rstrip('/')}/serving/{name}" if storage else str(ws.home / "serving" / name)


class RequestSample:
    """A replica's reservoir of the rows it answered, saved to ``folder``; a column per
    input column, in NumPy arrays (a DataFrame per request would cost more than the
    model's answer)."""

    def __init__(self, folder: str | Path, capacity: int = SAMPLE_ROWS, seed: int | None = None):
        self.path = f"{folder}/requests-{socket.gethostname()}-{os.getpid()}.parquet"
        self.capacity = capacity
        self.seen = 0
        self.size = 0
        self.version = ""
        self._columns: dict[str, np.ndarray] | None = None
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._saved_seen = 0

    def add(self, columns: dict[str, Any], rows: int, version: str) -> None:
        """The columns of ``rows`` rows (a request's, or a batch's) as the model read them.
        Algorithm R: the first ``capacity`` rows fill the sample; the t-th row after
        replaces a uniformly drawn row of it with chance capacity / t."""
        if IMAGE in columns or not rows:
            return
        with self._lock:
            self.version = version
            head = min(rows, self.capacity - self.size)
            src = list(range(head))
            dst = list(range(self.size, self.size + head))
            self.size += head
            if rows > head:
                slots = self._rng.integers(0, self.seen + head + np.arange(1, rows - head + 1))
                # A slot drawn twice keeps the later row, as one row at a time would.
                last = {int(slots[i]): head + int(i) for i in np.flatnonzero(slots < self.capacity)}
                dst = dst + list(last)
                src = src + list(last.values())
            self.seen += rows
            if src:
                self._store(columns, np.array(src), np.array(dst))

    def _store(self, columns: dict[str, Any], src: np.ndarray, dst: np.ndarray) -> None:
        if self._columns is None:
            self._columns = {c: np.empty(self.capacity, dtype=_kind(v)) for c, v in columns.items()}
        for c, kept in self._columns.items():
            if c in columns:
                kept[dst] = np.asarray(columns[c])[src]

    def rows(self) -> pd.DataFrame:
        """The sampled rows."""
        with self._lock:
            return pd.DataFrame({c: v[: self.size].copy() for c, v in (self._columns or {}).items()})

    def save_if_changed(self) -> None:
        """Write the sample when it took rows since it was last written."""
        if self.seen != self._saved_seen:
            self.save()

    def save(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._saved_seen = self.seen
        rows = self.rows()
        meta = {SEEN: str(self.seen), VERSION: self.version}
        table = pa.Table.from_pandas(rows, preserve_index=False).replace_schema_metadata(meta)
        if is_uri(self.path):  # an object store's put is whole
            fs, path = filesystem(self.path)
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            pq.write_table(table, path, filesystem=fs)
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with replacing_file(self.path) as tmp:
            pq.write_table(table, tmp)


def _kind(values: Any) -> np.dtype:
    """A sampled column's dtype: float64 for numbers, else object (categories)."""
    return np.dtype(np.float64) if np.asarray(values).dtype.kind in "biuf" else np.dtype(object)


def read_samples(ws: Workspace, name: str, storage: str | None = None) -> tuple[pd.DataFrame, int, int]:
    """Every replica's saved sample of ``name``'s requests (under ``storage``, else
    TRAINFLOW_HOME), end to end; the rows they were drawn from, and the files read.
    DataError, naming the folder, when there is none."""
    import pyarrow.fs
    import pyarrow.parquet as pq

    folder = samples_folder(ws, name, storage)
    fs, root = filesystem(folder)
    listed = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    files = sorted(f.path for f in listed if f.base_name.startswith("requests-") and f.extension == "parquet")
    if not files:
        raise DataError(
            f"no served requests of {name} under {folder}: serve it (trainflow models serve {name}) "
            "and send it requests first"
        )
    tables = [pq.read_table(f, filesystem=fs) for f in files]
    seen = sum(int((t.schema.metadata or {}).get(SEEN.encode(), b"0")) for t in tables)
    return pd.concat([t.to_pandas() for t in tables], ignore_index=True), seen, len(files)


def served_drift(
    ws: Workspace, name: str, *, psi_threshold: float, ks_pvalue: float | None
) -> tuple[DriftReport, str]:
    """The served requests' drift from the champion's profile, and a line saying what was
    sampled. DataError when there are no samples, or the champion has no profile;
    RegistryError when there is no champion."""
    from trainflow.pipelines.data.profile import frame_profile
    from trainflow.pipelines.drift.compare import compare, registered_profile
    from trainflow.pipelines.registry.versions import RegistryError

    reference = registered_profile(ws, name)
    if reference is None:
        raise RegistryError(f"{name} has no champion to compare its served requests with")
    if reference.profile is None:
        raise DataError(f"{reference} was registered without a data profile; retrain it to measure drift")
    rows, seen, files = read_samples(ws, name, reference.storage)
    current = frame_profile(rows, list(reference.profile["numeric"]), list(reference.profile["categorical"]))
    report = compare(reference.profile, current, psi_threshold=psi_threshold, ks_pvalue=ks_pvalue)
    report.reference = str(reference)
    return report, f"{len(rows)} rows sampled from {seen} served rows ({files} replica file(s))"
