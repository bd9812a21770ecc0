"""The data files: where they are, how they are checked, copied and downloaded.

Every data file is pinned by its size and sha256 (:class:`~dpopt.data.catalogue.RemoteFile`),
which are checked on every load and on every download: the size first (from the file system, so
a huge or growing file is refused before it is read), then the sha256 of the bytes as they are
copied into a private temporary file, which is what gets parsed (so a file swapped in after the
check is never parsed). Only regular files are read: a FIFO, a device or a directory in place of
a data file is refused. A compressed file may instead be pinned by the sha256 of its
decompressed content (``RemoteFile.content_sha256``): then any compression of the same bytes is
accepted (MNIST: the mirror's original ``.gz`` files and the re-compressed shared copies differ
only in their gzip wrapper), up to a size bound derived from the content's size. Files live in
``<data dir>/<data set>/``; the data dir is ``data_dir`` if given, else :func:`default_data_dir`.
Data sets marked ``bundled`` ship inside the package (:data:`BUNDLED`) and load without any data
dir (a copy in the data dir is used first).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import http.client
import lzma
import os
import stat
import tempfile
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

import platformdirs

from dpopt.data.catalogue import Catalogue, Entry, RemoteFile, shipped
from dpopt.data.dataset import DataError

__all__ = ["BUNDLED", "PathLike", "default_data_dir", "fetch", "locate", "resolve", "verified_copy"]

#: Where the files of the bundled data sets ship.
BUNDLED = Path(__file__).with_name("bundled")
_CHUNK = 1 << 20
_DECOMPRESS: dict[str, Callable[..., IO[bytes]]] = {
    ".gz": gzip.open,  # type: ignore[dict-item]  # typeshed's GzipFile is no IO[bytes]
    ".bz2": bz2.open,
    ".xz": lzma.open,
}

PathLike = str | os.PathLike[str]


def default_data_dir() -> Path:
    """``$DPOPT_DATA`` if set, else ``<user cache dir>/dpopt/data``."""
    env = os.environ.get("DPOPT_DATA")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("dpopt")) / "data"


def fetch(name: str, data_dir: PathLike | None = None, *, base_url: str | None = None,
          catalogue: Catalogue | None = None) -> list[Path]:
    """Download the missing or corrupt files of ``name`` into ``<data_dir>/<name>/``.

    Each download goes to a temporary file in the same folder, is checked against its
    sha256 (or the sha256 of its decompressed content) and then renamed into place.
    ``base_url`` replaces the directory of the URLs (the file is fetched from
    ``<base_url>/<file name>``). Bundled data sets need no download: their bundled paths
    are returned. ``catalogue``: where ``name`` is looked up (default: the package's,
    :func:`dpopt.data.catalogue.shipped`).
    """
    entry = (shipped() if catalogue is None else catalogue).entry(name)
    if entry.bundled:
        return [BUNDLED / file.name for file in entry.files]
    folder = resolve(data_dir) / entry.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or exc
        raise DataError(f"data_dir={str(folder.parent)!r} cannot be written ({reason}); "
                        "pass another --data-dir or set DPOPT_DATA") from None
    paths = []
    for file in entry.files:
        target = folder / file.name
        if not (target.exists() and _check(target, file)[1] is None):
            _download(_url(file, base_url, folder), target, file)
        paths.append(target)
    return paths


def resolve(data_dir: PathLike | None) -> Path:
    """Absolute data dir: ``data_dir`` or the default one."""
    folder = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    return folder.resolve()


def locate(entry: Entry, data_dir: Path) -> list[Path]:
    """Paths of the files of ``entry``: the data dir first, then the bundled copy."""
    paths = []
    for file in entry.files:
        path = data_dir / entry.name / file.name
        if not path.exists() and entry.bundled:
            path = BUNDLED / file.name
        if not path.exists():
            raise DataError(f"data file {path} is missing: run `dpopt data fetch {entry.name}` "
                            "or pass --data-dir/DPOPT_DATA")
        paths.append(path)
    return paths


def verified_copy(path: Path, file: RemoteFile, entry: Entry, copy: Path) -> str:
    """Copy ``path`` to ``copy`` as it is verified to be ``file``; its sha256, or a :class:`DataError`."""
    actual, problem = _check(path, file, copy)
    if problem is not None:
        fix = ("delete it to use the bundled copy" if entry.bundled
               else f"run `dpopt data fetch {entry.name}` to download it again")
        raise DataError(f"data file {path} is corrupt: {problem}; {fix}")
    assert actual is not None  # (None only with a problem)
    return actual


def _check(path: Path, file: RemoteFile, copy: Path | None = None) -> tuple[str | None, str | None]:
    """The sha256 of the file at ``path`` (``None`` if its size already rules it out) and why it
    is not ``file`` (``None`` if it is); a :class:`DataError` if it is not a regular file.

    Its size is checked before a byte is read; with ``copy`` its bytes are written there as they
    are hashed, and a content check reads the copy, so ``copy`` holds exactly what was verified.
    """
    with _open_regular(path) as source:
        expected = os.fstat(source.fileno()).st_size
        if (problem := _size_problem(expected, file)) is not None:
            return None, problem
        with (open(copy, "xb") if copy is not None else contextlib.nullcontext()) as target:
            actual, size = _copy(source, target, file.max_size)
    if size != expected:
        return actual, f"its size changed from {expected:,} bytes while it was read"
    return actual, _mismatch(copy or path, file, actual)


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a FIFO is opened without waiting for a
    writer, then refused); a :class:`DataError` naming what it is otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DataError(f"data file {path} cannot be read ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
        kind = next((name for test, name in kinds if test(mode)), "not a file")
        raise DataError(f"data file {path} is {kind}, not a regular file: put the data file itself there")
    return os.fdopen(fd, "rb")


def _size_problem(size: int, file: RemoteFile) -> str | None:
    """Why a file of ``size`` bytes cannot be ``file`` (``None`` if it can)."""
    if size == file.size or (file.content_sha256 is not None and size <= file.max_size):
        return None
    if file.content_sha256 is None:
        return f"size {size:,} bytes != expected {file.size:,}"
    return f"size {size:,} bytes exceeds {file.max_size:,}, more than any compression of its content takes"


def _copy(source: IO[bytes], target: IO[bytes] | None, limit: int) -> tuple[str, int]:
    """Hex sha256 and length of ``source``, read to its end or to just past ``limit`` bytes,
    written to ``target`` (if any) as it is hashed."""
    digest, size = hashlib.sha256(), 0
    while size <= limit and (chunk := source.read(min(_CHUNK, limit + 1 - size))):
        digest.update(chunk)
        size += len(chunk)
        if target is not None:
            target.write(chunk)
    return digest.hexdigest(), size


def _mismatch(path: Path, file: RemoteFile, actual: str) -> str | None:
    """Why the file at ``path``, of sha256 ``actual``, is not ``file`` (``None`` if it is)."""
    if actual == file.sha256:
        return None
    if file.content_sha256 is None or file.content_size is None:  # (the catalogue gives both or neither)
        return f"sha256 {actual} != expected {file.sha256}"
    suffix = Path(file.name).suffix
    try:
        with _DECOMPRESS.get(suffix, open)(path, "rb") as stream:
            content, size = _copy(stream, None, file.content_size)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        return f"its sha256 {actual} is not the known copy's and it cannot be decompressed ({exc})"
    if size > file.content_size:
        return f"it decompresses to more than the {file.content_size:,} bytes of the expected content"
    if content == file.content_sha256:
        return None
    return (f"sha256 of its decompressed content {content} != expected {file.content_sha256} "
            f"(and its sha256 {actual} is not the known copy's {file.sha256})")


def _url(file: RemoteFile, base_url: str | None, folder: Path) -> str:
    """Download URL of ``file``, under ``base_url`` if given; else an error saying where to copy it."""
    if base_url is not None:
        return f"{base_url.rstrip('/')}/{file.name}"
    if file.url is None:
        raise DataError(f"data file {file.name} has no download URL: copy it by hand to {folder / file.name} "
                        f"({file.size:,} bytes, sha256 {file.sha256}); the folder is <data dir>/{folder.name}, the "
                        "data dir --data-dir, else $DPOPT_DATA, else the user cache (in Python, "
                        "dpopt.data.fetch(..., base_url=URL) downloads it from a server of yours)")
    return file.url


def _download(url: str, target: Path, file: RemoteFile) -> None:
    """Download ``url`` to ``target`` atomically, keeping it only if it verifies as ``file``."""
    handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".part")
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            actual, size = _copy_url(url, out, target, file.max_size)
        too_large = f"more than {file.max_size:,} bytes (expected {file.size:,})" if size > file.max_size else None
        problem = too_large or _size_problem(size, file) or _mismatch(temp, file, actual)
        if problem is not None:
            raise DataError(f"download {url} is corrupt: {problem}; nothing was written to "
                            f"{target.parent}")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def _copy_url(url: str, out: IO[bytes], target: Path, limit: int) -> tuple[str, int]:
    """Stream ``url`` into ``out`` (at most just past ``limit`` bytes); the hex sha256 and length."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return _copy(response, out, limit)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DataError(f"download {url} failed ({exc}); check the network, "
                        f"or copy the file to {target} by hand") from None
