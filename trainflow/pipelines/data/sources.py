"""Where data lives: a path, folder, glob or URI resolved to a filesystem and a file list.

Everything here runs in the driver and reads metadata only (file listings, sizes, a
file's header), so a bad source fails before any Ray worker starts. Any filesystem
that pyarrow reaches through a URI works (``file://``, ``s3://``, ``gs://``, ``hdfs://``,
``abfs://``); other URI schemes go through fsspec when it knows the protocol.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from trainflow.files import publishing_folder

SUFFIX_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".npy": "numpy",
    ".npz": "numpy",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TORCHVISION = ("MNIST", "FashionMNIST", "CIFAR10")
# Inputs up to this many bytes are fingerprinted by their content; larger ones by
# their file list, sizes and modification times (reading them would cost a pass).
CONTENT_HASH_BYTES = 32 << 20
_GLOB_CHARS = set("*?[")


class SourceError(ValueError):
    """A source that cannot be read; the message names it and what would be valid."""


@dataclass(frozen=True)
class Listing:
    """The files of a source on its filesystem, and what they hold."""

    filesystem: pafs.FileSystem
    format: str  # parquet | csv | json | numpy | images
    files: list[str]  # paths on ``filesystem``
    sizes: list[int]
    mtimes_ns: list[int]


def resolve(source: str) -> tuple[pafs.FileSystem, str]:
    """A filesystem and the path on it for a local path or a URI."""
    scheme, sep, _ = source.partition("://")
    if not sep or len(scheme) < 2:  # a local path (a Windows drive letter is not a scheme)
        return pafs.LocalFileSystem(), str(Path(source).expanduser().resolve())
    try:
        return pafs.FileSystem.from_uri(source)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as arrow_error:
        import fsspec
        from fsspec.registry import known_implementations
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        if scheme not in known_implementations:
            raise SourceError(
                f"data.source {source}: no filesystem for the scheme {scheme!r} ({arrow_error})"
            ) from None
        fs, path = fsspec.core.url_to_fs(source)
        return PyFileSystem(FSSpecHandler(fs)), path


def _info(fs: pafs.FileSystem, path: str) -> pafs.FileInfo:
    return fs.get_file_info(path)


def _list_tree(fs: pafs.FileSystem, base: str) -> list[pafs.FileInfo]:
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(
        (i for i in infos if i.type == pafs.FileType.File and not _hidden(i.path, base)),
        key=lambda i: i.path,
    )


def _hidden(path: str, base: str) -> bool:
    # Dotfiles and _SUCCESS-style markers that writers leave beside their data files.
    rel = PurePosixPath(path).relative_to(PurePosixPath(base)) if path != base else PurePosixPath(path)
    return any(part.startswith((".", "_")) for part in rel.parts)


def _glob(fs: pafs.FileSystem, pattern: str) -> list[pafs.FileInfo]:
    parts = PurePosixPath(pattern).parts
    fixed = []
    for part in parts:
        if _GLOB_CHARS & set(part):
            break
        fixed.append(part)
    base = str(PurePosixPath(*fixed)) if fixed else "/"
    if _info(fs, base).type != pafs.FileType.Directory:
        return []
    # ** matches any depth: fnmatch's * already crosses "/".
    regex = pattern.replace("**/", "*")
    return [i for i in _list_tree(fs, base) if fnmatch.fnmatchcase(i.path, regex)]


def _image_folder(infos: list[pafs.FileInfo], base: str) -> bool:
    return bool(infos) and all(i.path.lower().endswith(IMAGE_SUFFIXES) for i in infos)


def list_source(source: str, format: str = "auto") -> Listing:
    """The files of a path, folder, glob or URI, all of one format."""
    fs, path = resolve(source)
    info = _info(fs, path)
    if _GLOB_CHARS & set(path):
        infos = _glob(fs, path)
        if not infos:
            raise SourceError(f"data.source {source}: the pattern matches no file")
    elif info.type == pafs.FileType.NotFound:
        raise SourceError(f"data.source {source}: no such file or folder")
    elif info.type == pafs.FileType.File:
        infos = [info]
    else:
        infos = _list_tree(fs, path)
        if not infos:
            raise SourceError(f"data.source {source}: the folder is empty")
        if format in ("auto", "images") and _image_folder(infos, path):
            return _images_listing(fs, path, infos, source)
    infos = [i for i in infos if not i.path.lower().endswith(IMAGE_SUFFIXES)] if format != "images" else infos
    if format == "auto":
        kinds = {SUFFIX_FORMATS.get(PurePosixPath(i.path).suffix.lower()) for i in infos}
        known = kinds - {None}
        if not known:
            suffix = PurePosixPath(infos[0].path).suffix if infos else ""
            raise SourceError(
                f"data.source {source}: unsupported file type {suffix!r}; use one of "
                f"{', '.join(sorted(SUFFIX_FORMATS))}, a folder of class folders of "
                f"{'/'.join(IMAGE_SUFFIXES)} images, builtin:digits, builtin:diabetes or torchvision:NAME"
            )
        if len(known) > 1:
            raise SourceError(
                f"data.source {source}: mixes {' and '.join(sorted(known))} files; keep one format"
            )
        format = known.pop()
        infos = [i for i in infos if SUFFIX_FORMATS.get(PurePosixPath(i.path).suffix.lower()) == format]
    elif format == "images":
        return _images_listing(fs, path, infos, source)
    return Listing(
        fs, format, [i.path for i in infos], [i.size for i in infos], [i.mtime_ns or 0 for i in infos]
    )


def _images_listing(fs, root: str, infos: list[pafs.FileInfo], source: str) -> Listing:
    images = [i for i in infos if i.path.lower().endswith(IMAGE_SUFFIXES)]
    flat = [i.path for i in images if PurePosixPath(i.path).parent == PurePosixPath(root)]
    if flat:
        raise SourceError(
            f"data.source {source}: image {flat[0]} sits in the root folder; an image folder holds "
            "one folder per class (root/<class>/*.png)"
        )
    if len({PurePosixPath(i.path).parent.name for i in images}) < 2:
        raise SourceError(f"data.source {source}: an image folder needs at least 2 class folders")
    return Listing(
        fs, "images", [i.path for i in images], [i.size for i in images], [i.mtime_ns or 0 for i in images]
    )


def digits_frame():
    """The handwritten digits bundled with scikit-learn (1,797 rows of 64 pixels and a label)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(
        digits.data.astype(np.float32), columns=[f"pixel_{i}" for i in range(digits.data.shape[1])]
    )
    frame["label"] = digits.target.astype(np.int64)
    return frame


def diabetes_frame():
    """scikit-learn's diabetes data in its own units (442 patients: age, sex, bmi, bp and six
    blood serum measurements s1-s6) and ``target``, the disease's progression a year later."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    return frame.astype({c: np.float32 for c in frame.columns if c != "target"})


# The inputs that ship with trainflow (through scikit-learn): read offline, in the driver.
BUILTINS = {"builtin:digits": digits_frame, "builtin:diabetes": diabetes_frame}


def image_label(path: str) -> str:
    """The class of an image in an image folder: the name of the folder it sits in."""
    return PurePosixPath(path).parent.name


def fingerprint(listing: Listing) -> str:
    """The file list with sizes; the content of small inputs, else modification times."""
    h = hashlib.sha256()
    by_content = sum(listing.sizes) <= CONTENT_HASH_BYTES
    h.update(b"content\n" if by_content else b"stat\n")
    for path, size, mtime in zip(listing.files, listing.sizes, listing.mtimes_ns, strict=True):
        h.update(f"{path}|{size}".encode())
        if by_content:
            with listing.filesystem.open_input_stream(path) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        else:
            h.update(f"|{mtime}".encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


# NumPy files: .npz arrays become columns (a 2-D array x becomes x_0, x_1, ...);
# a .npy holds a structured array (one column per field) or a 2-D array (col_0, ...).


def _npy_header(f) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _fortran, dtype = read(f)
    return shape, dtype


def _columns_of(name: str, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[str, np.dtype]]:
    if dtype.names:
        return [(field, dtype.fields[field][0]) for field in dtype.names]
    if len(shape) == 1:
        return [(name, dtype)]
    if len(shape) == 2:
        return [(f"{name}_{i}", dtype) for i in range(shape[1])]
    raise SourceError(f"array {name!r} has shape {shape}; use 1-D or 2-D arrays (rows first)")


def numpy_schema(fs: pafs.FileSystem, path: str) -> tuple[pa.Schema, int]:
    """The columns a NumPy file holds and its number of rows, from its headers only."""
    with fs.open_input_file(path) as f:
        if path.endswith(".npy"):
            shape, dtype = _npy_header(f)
            arrays = [("col", shape, dtype)]
        else:
            arrays = []
            with zipfile.ZipFile(f) as z:
                for member in z.namelist():
                    with z.open(member) as m:
                        shape, dtype = _npy_header(m)
                    arrays.append((member.removesuffix(".npy"), shape, dtype))
    rows = {shape[0] for _, shape, _ in arrays if shape}
    if len(rows) != 1:
        raise SourceError(f"{path}: arrays of different lengths {sorted(rows)}; every array is one column")
    fields = [pa.field(c, pa.from_numpy_dtype(t)) for n, s, d in arrays for c, t in _columns_of(n, s, d)]
    return pa.schema(fields), rows.pop()


def numpy_frame(data: bytes, path: str) -> dict[str, np.ndarray]:
    """The columns of one .npy/.npz file's bytes (runs in Ray workers)."""
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    arrays = [("col", loaded)] if isinstance(loaded, np.ndarray) else list(loaded.items())
    out: dict[str, np.ndarray] = {}
    for name, array in arrays:
        if array.dtype.names:
            out.update({field: array[field] for field in array.dtype.names})
        elif array.ndim == 1:
            out[name] = array
        else:
            out.update({f"{name}_{i}": array[:, i] for i in range(array.shape[1])})
    return out


# torchvision datasets: downloaded with torchvision's own code on first use, then
# converted once to Parquet that the image path reads: one row per image, its pixels as
# a uint8 tensor ([H, W] grayscale, [H, W, C] colour), its class name and its index.

TORCHVISION_IMAGE = "image"
TORCHVISION_LABEL = "label"
TORCHVISION_INDEX = "index"  # the row's place in the converted dataset: train rows first
# What _done.json calls the converted form; a folder of another (or no) version is an
# older trainflow's conversion and is converted again.
TORCHVISION_VERSION = 2
TORCHVISION_DONE = "_done.json"
_TORCHVISION_ROW_GROUP = 10_000


def converted_meta(folder: str | Path) -> dict | None:
    """What a finished conversion says about itself (rows, classes, the images' shape and
    mode), or None when the folder holds no conversion of this version."""
    done = Path(folder) / TORCHVISION_DONE
    if not done.is_file():
        return None
    meta = json.loads(done.read_text())
    return meta if meta.get("version") == TORCHVISION_VERSION else None


def torchvision_parquet(name: str, root: Path) -> Path:
    """The Parquet folder of a torchvision dataset, downloaded and converted on first use.

    ``root`` holds torchvision's own download (``root/MNIST/raw/...``), so files put
    there in torchvision's format, by hand or by an earlier download, are used as is.
    """
    if name not in TORCHVISION:
        raise SourceError(f"data.source torchvision:{name}: use one of {', '.join(TORCHVISION)}")
    out = root / f"{name}.parquet"
    if converted_meta(out) is not None:
        return out
    import torchvision.datasets as tvd

    cls = getattr(tvd, name)
    parts = []
    for train in (True, False):
        try:
            parts.append(cls(str(root), train=train, download=False))
        except RuntimeError:
            try:
                parts.append(cls(str(root), train=train, download=True))
            except Exception as e:
                raise SourceError(
                    f"data.source torchvision:{name}: not in {root} and the download failed ({e}); "
                    f"put torchvision's files for {name} under {root}"
                ) from None
    with publishing_folder(out, finished=lambda path: converted_meta(path) is not None) as tmp:
        rows = 0
        for i, part in enumerate(parts):
            images = np.asarray(part.data, dtype=np.uint8)  # MNIST keeps a tensor, CIFAR10 an array
            labels = np.asarray(part.classes, dtype=object)[np.asarray(part.targets, dtype=np.int64)]
            _write_images(tmp / f"part-{i}.parquet", images, labels, first_index=rows)
            rows += len(images)
        shape = list(images.shape[1:])
        meta = {
            "version": TORCHVISION_VERSION,
            "rows": rows,
            "classes": list(parts[0].classes),
            "shape": shape,
            "mode": "L" if len(shape) == 2 else "RGB",
        }
        (tmp / TORCHVISION_DONE).write_text(json.dumps(meta))
    return out


def _write_images(path: Path, images: np.ndarray, labels: np.ndarray, first_index: int) -> None:
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    writer = None
    try:
        for start in range(0, len(images), _TORCHVISION_ROW_GROUP):
            chunk = slice(start, start + _TORCHVISION_ROW_GROUP)
            table = pa.table(
                {
                    TORCHVISION_IMAGE: ArrowTensorArray.from_numpy(images[chunk]),
                    TORCHVISION_LABEL: pa.array(labels[chunk].tolist(), pa.string()),
                    TORCHVISION_INDEX: np.arange(
                        first_index + start, first_index + start + len(labels[chunk])
                    ),
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, write_statistics=False)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
