"""Files and folders that appear under their final name only once complete.

Everything trainflow writes for later readers (prepared splits, converted datasets,
downloaded models, predictions, plots, configs) is written beside its final path under a
temporary name and renamed when complete: a crash, a kill or an error never leaves a
half-written file or folder that a later run would take for a finished one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _temporary(path: Path) -> Path:
    # Hidden (a leading dot), so listings of the folder and source readers skip it.
    return path.with_name(f".tmp-{uuid.uuid4().hex[:8]}-{path.name}")


@contextmanager
def replacing_file(path: str | Path) -> Iterator[Path]:
    """A temporary path to write the file at ``path``; it replaces ``path`` when the block
    ends without error, else it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def publishing_folder(path: str | Path, finished: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """A temporary folder to fill; renamed to ``path`` when the block ends without error,
    else removed.

    ``finished`` tells a complete folder from any other: when ``path`` already holds a
    finished one (another run wrote the same thing first), it is kept and the new one
    dropped; a folder at ``path`` that is not finished (a crash of an older writer, a
    copy by hand) is replaced. Without ``finished`` an existing folder is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.exists():
                raise
            if finished is not None and finished(path):
                shutil.rmtree(tmp)
                return
            shutil.rmtree(path)
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
