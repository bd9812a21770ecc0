"""Strict reader for IDX files (the format of MNIST), plain or gzip-compressed.

An IDX file is a 4-byte magic number, one big-endian uint32 per dimension, then the items
in C order, big-endian (LeCun, Cortes & Burges, "THE MNIST DATABASE of handwritten digits",
file format section). The magic's first two bytes are zero, the third is the item type and
the fourth the number of dimensions; MNIST uses 2049 = ``0x00000801`` (labels: uint8, one
dimension) and 2051 = ``0x00000803`` (images: uint8, three dimensions). Every type of the
format is read; the MNIST parser (:mod:`dpopt.data.parsers`) checks the shapes it expects on top.

gzip input is recognised by its own magic bytes (``1f 8b``), not by the file name, so a
decompressed copy named ``*.gz`` or a compressed one without the suffix both work.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from dpopt.data.dataset import DataError

__all__ = ["IDX_LABELS", "IDX_IMAGES", "read_idx"]

IDX_LABELS = 2049  # 0x00000801: uint8 items, one dimension (MNIST labels)
IDX_IMAGES = 2051  # 0x00000803: uint8 items, three dimensions (MNIST images)

_GZIP_MAGIC = b"\x1f\x8b"
_TYPES: dict[int, np.dtype] = {  # IDX type code -> big-endian item dtype
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(source: str | os.PathLike[str] | IO[bytes]) -> np.ndarray:
    """Read the IDX file ``source`` (a path or a binary file object, plain or gzip) into an array.

    Returns a writable array in native byte order with the file's shape and item type
    (``uint8 [60000, 28, 28]`` for MNIST's training images). A file that cannot be
    decompressed, has a bad magic number, or whose size does not match the dimensions in
    its header raises :class:`DataError` naming the file and the problem.
    """
    data, name = _read_bytes(source)
    if len(data) < 4:
        raise DataError(f"file {name} is not an IDX file: {len(data)} bytes, shorter than the "
                        "4-byte magic number")
    zero, code, ndim = data[:2], data[2], data[3]
    magic = int.from_bytes(data[:4], "big")
    if zero != b"\0\0" or code not in _TYPES or ndim == 0:
        raise DataError(f"file {name} is not an IDX file: magic number {magic} (0x{magic:08x}) must be "
                        "0x0000TTDD with a known item type TT and DD >= 1 dimensions "
                        f"(MNIST: {IDX_LABELS} labels, {IDX_IMAGES} images)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"file {name} is truncated: its magic number {magic} announces {ndim} "
                        f"dimensions ({header} header bytes), but the file has {len(data)} bytes")
    dims = tuple(int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    dtype = _TYPES[code]
    expected = int(np.prod(dims, dtype=object)) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        what = "truncated" if found < expected else "too long"
        raise DataError(f"file {name} is {what}: its header says shape {dims} of {dtype.name} "
                        f"= {expected:,} data bytes, but {found:,} follow the header")
    items = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return items.astype(dtype.newbyteorder("="))  # a copy: writable and in native byte order


def _read_bytes(source: str | os.PathLike[str] | IO[bytes]) -> tuple[bytes, str]:
    """All (decompressed) bytes of ``source`` and a name for messages."""
    if isinstance(source, (str, os.PathLike)):
        name = str(Path(source))
        try:
            with open(source, "rb") as stream:
                raw = stream.read()
        except OSError as exc:
            raise DataError(f"file {name} cannot be read: {exc.strerror or exc}") from None
    else:
        name = str(getattr(source, "name", "<stream>"))
        raw = source.read()
        if isinstance(raw, str):
            raise DataError(f"file {name} must be opened in binary mode ('rb') to read IDX data")
        raw = bytes(raw)
    if raw[:2] != _GZIP_MAGIC:
        return raw, name
    try:
        return gzip.decompress(raw), name
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"file {name} cannot be decompressed (gzip): {exc}") from None
