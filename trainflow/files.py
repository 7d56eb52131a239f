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


# Locations: a local folder, or a URI that pyarrow reaches (s3://, gs://, hdfs://,
# abfs://, file://). A URI may carry its filesystem's options as a query
# (``s3://bucket/cache?region=eu-west-1``); joining keeps the query at the end.


def is_uri(location: str | Path) -> bool:
    return "://" in str(location)


def redacted(location: str | Path) -> str:
    """``location`` fit for a log: a URI's ``user:secret@`` left out."""
    text = str(location)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def join(location: str | Path, *parts: str) -> str:
    """``location`` with ``parts`` appended, as a string; a URI's query stays last."""
    base, sep, query = str(location).partition("?")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def filesystem(location: str | Path):
    """A pyarrow filesystem and the path on it of a local folder or a URI: how every
    process (the driver, a Ray task, a training worker) reaches the same place."""
    import pyarrow.fs

    if is_uri(location):
        return pyarrow.fs.FileSystem.from_uri(str(location))
    return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser().resolve())


def read_text(location: str | Path) -> str | None:
    """A file's text, or None when there is no such file."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return f.read().decode()


def write_text(location: str | Path, text: str) -> None:
    """Write a file in one piece (an object store's single put). Not for a file that a
    reader may open while it is written: see :func:`replacing_file`."""
    fs, path = filesystem(location)
    fs.create_dir(path.rpartition("/")[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(text.encode())


@contextmanager
def publishing_attempt(location: str, marker: str) -> Iterator[str]:
    """On a store without renames (a URI): a new folder ``<location>/attempt-<id>`` to
    fill. When the block ends without error the file ``<location>/<marker>``, written
    in one piece, names it, which publishes it: readers (:func:`published_attempt`) see
    either nothing or a complete folder. When another writer's marker is there first,
    theirs is kept and this folder removed; on an error it is removed too. A writer
    that crashed leaves its unpublished folder behind, never read."""
    attempt = f"attempt-{uuid.uuid4().hex[:12]}"
    folder = join(location, attempt)
    fs, path = filesystem(folder)
    fs.create_dir(path, recursive=True)
    try:
        yield folder
        if published_attempt(location, marker) is not None:
            fs.delete_dir(path)
            return
        write_text(join(location, marker), attempt)
    except BaseException:
        try:
            fs.delete_dir(path)
        except OSError:
            pass
        raise


def published_attempt(location: str, marker: str) -> str | None:
    """The folder that :func:`publishing_attempt` published at ``location``, or None."""
    attempt = read_text(join(location, marker))
    return join(location, attempt.strip()) if attempt else None
