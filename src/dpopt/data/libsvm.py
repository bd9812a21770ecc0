"""Fast, strict reader for LIBSVM (svmlight) text files into dense float64 arrays.

A LIBSVM line is ``label index:value index:value ...`` with 1-based, strictly increasing
feature indices. The whole file is tokenised with numpy on its raw bytes; plain decimals
(``[+-]digits[.digits]``, at most 15 digits, which is what data files hold) are converted
by a vectorised Horner scheme that gives exactly the same float64 as Python's ``float``.
Any other token (exponents, ``nan``, junk) goes through ``float`` one by one, so odd files
stay correct and bad ones are reported with their line number.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from dpopt._validate import positive_int
from dpopt.data.dataset import DataError

_OPENERS: dict[str, Callable[..., IO[bytes]]] = {
    ".bz2": bz2.open,
    ".gz": gzip.open,  # type: ignore[dict-item]  # typeshed's GzipFile is no IO[bytes]
    ".xz": lzma.open,
}
_COLON, _NEWLINE, _DOT, _PLUS, _MINUS, _ZERO, _SPACE = (ord(c) for c in ":\n.+-0 ")
_MAX_DIGITS = 15  # every integer below 10**15 is exact in float64
_MAX_FAST_WIDTH = _MAX_DIGITS + 2  # sign and decimal point
_POW10 = 10.0 ** np.arange(_MAX_DIGITS + 1)
_LINE_FORM = "'label index:value index:value ...'"


class _Tokens(NamedTuple):
    """Tokens of a buffer: byte offsets, label/index roles (the rest are values), newlines."""

    starts: np.ndarray
    ends: np.ndarray
    is_label: np.ndarray
    is_index: np.ndarray
    newlines: np.ndarray

    def line(self, token: int) -> int:
        """1-based line number of token number ``token``."""
        return int(np.searchsorted(self.newlines, self.starts[token]))


def read_libsvm(source: str | os.PathLike[str] | IO[bytes] | IO[str], n_features: int,
                *, binary: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Read a LIBSVM text file into dense ``X`` (float64 [n, n_features]) and ``y`` (float64 [n]).

    ``source`` is a path (decompressed by suffix: ``.bz2``, ``.gz``, ``.xz``) or an open file
    object. Feature indices are 1-based and must be <= ``n_features``. With ``binary=True``
    labels already in {-1, +1} are kept; otherwise they must take exactly two values, mapped
    to -1 (smaller) and +1 (larger). Blank lines are skipped; space and ASCII control
    characters separate tokens. Malformed lines, NaN or infinite numbers raise
    :class:`DataError` naming the file and line.
    """
    X, y, _, name = _read(source, n_features)
    return X, (binary_labels(y, name) if binary else y)


def read_libsvm_lines(source: str | os.PathLike[str] | IO[bytes] | IO[str],
                      n_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`read_libsvm` without ``binary``, and the 1-based line number (as an editor shows it)
    of every row: ``(X, y, lines)``."""
    X, y, lines, _ = _read(source, n_features)
    return X, y, lines


def _read(source: str | os.PathLike[str] | IO[bytes] | IO[str],
          n_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    positive_int("n_features", n_features)
    data, name = read_bytes(source)
    buffer = np.frombuffer(b"\n" + data + b"\n", dtype=np.uint8)
    tokens = _tokenise(buffer, name)
    values = _numbers(buffer, tokens, name)
    X, y = _assemble(values, tokens, n_features, name)
    return X, y, np.searchsorted(tokens.newlines, tokens.starts[tokens.is_label]), name


def read_bytes(source: str | os.PathLike[str] | IO[bytes] | IO[str]) -> tuple[bytes, str]:
    """All bytes of ``source`` and a name for messages."""
    if not isinstance(source, (str, os.PathLike)):
        content: Any = source.read()
        name = str(getattr(source, "name", "<stream>"))
        return (content.encode() if isinstance(content, str) else content), name
    path = Path(source)
    opener = _OPENERS.get(path.suffix, open)
    try:
        with opener(path, "rb") as stream:
            return stream.read(), str(path)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise DataError(f"file {path} cannot be read: {exc}") from None


def _tokenise(buffer: np.ndarray, name: str) -> _Tokens:
    """Split ``buffer`` at blanks and colons and check every line is ``label (index:value)*``.

    ``buffer`` must start and end with a newline so every token has a byte on each side.
    """
    separator = (buffer <= _SPACE) | (buffer == _COLON)
    edges = np.diff((~separator).view(np.int8))
    starts = np.flatnonzero(edges == 1) + 1
    ends = np.flatnonzero(edges == -1) + 1
    newlines = np.flatnonzero(buffer == _NEWLINE)
    is_index = buffer[ends] == _COLON
    is_value = buffer[starts - 1] == _COLON
    is_label = ~(is_index | is_value)
    first_on_line = np.zeros(starts.size, dtype=bool)
    heads = np.searchsorted(starts, newlines)
    first_on_line[heads[heads < starts.size]] = True
    bad = (is_index & is_value) | (is_label != first_on_line)
    n_colons = np.count_nonzero(buffer == _COLON)
    if bad.any() or not n_colons == np.count_nonzero(is_index) == np.count_nonzero(is_value):
        line = _first_bad_line(buffer, starts[bad][:1], newlines)
        raise DataError(f"file {name} line {line} is malformed: each line must be {_LINE_FORM}")
    return _Tokens(starts, ends, is_label, is_index, newlines)


def _first_bad_line(buffer: np.ndarray, bad_starts: np.ndarray, newlines: np.ndarray) -> int:
    """Line of the first bad token start or colon without a token on both sides."""
    colons = np.flatnonzero(buffer == _COLON)
    blank = (buffer[colons - 1] <= _SPACE) | (buffer[colons + 1] <= _SPACE)
    dangling = colons[blank | (buffer[colons - 1] == _COLON) | (buffer[colons + 1] == _COLON)]
    first = np.concatenate([bad_starts, dangling[:1]]).min()
    return int(np.searchsorted(newlines, first))


def _numbers(buffer: np.ndarray, tokens: _Tokens, name: str) -> np.ndarray:
    """float64 value of every token; non-numbers and NaN/inf raise :class:`DataError`."""
    values, fast = _fast_decimals(buffer, tokens.starts, tokens.ends)
    for k in np.flatnonzero(~fast):
        try:
            values[k] = _finite_float(buffer[tokens.starts[k]:tokens.ends[k]].tobytes())
        except ValueError as exc:
            raise DataError(f"file {name} line {tokens.line(int(k))}: {exc}") from None
    return values


def _fast_decimals(buffer: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of tokens ``[+-]digits[.digits]`` with 1 to 15 digits, and a mask of those tokens.

    Tokens are read right-aligned, one character column at a time (Horner's scheme, the
    decimal point multiplies by 1). The mantissa is an exact integer < 10**15, divided once
    by an exact power of ten, so the result is the correctly rounded decimal, like ``float``.
    """
    size = np.minimum(ends - starts, _MAX_FAST_WIDTH + 1).astype(np.uint8)
    mantissa = np.zeros(starts.size, dtype=np.int64)
    digits, dots, decimals = (np.zeros(starts.size, dtype=np.uint8) for _ in range(3))
    for place in range(min(int(size.max(initial=0)), _MAX_FAST_WIDTH) - 1, -1, -1):
        char = buffer[ends - (place + 1)]  # out-of-token offsets may wrap: masked below
        within = size > place
        digit = char - np.uint8(_ZERO)
        is_digit = (digit < 10) & within
        is_dot = (char == _DOT) & within
        mantissa *= 10 - 9 * is_dot.view(np.uint8)
        mantissa += digit * is_digit
        digits += is_digit
        dots += is_dot
        decimals += is_dot * np.uint8(place)
    first = buffer[starts]
    signed = (first == _PLUS) | (first == _MINUS)
    fast = ((size == digits + dots + signed) & (dots <= 1)
            & (digits >= 1) & (digits <= _MAX_DIGITS))
    values = mantissa / _POW10[np.minimum(decimals, _MAX_DIGITS)]
    return np.where(first == _MINUS, -values, values), fast


def _finite_float(text: bytes) -> float:
    """``float(text)``, or a ``ValueError`` quoting ``text`` if it is not a finite number."""
    number: float | None
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is None or not math.isfinite(number):
        shown = text[:40].decode("ascii", "replace")
        what = "a number" if number is None else "a finite number (no NaN or inf)"
        raise ValueError(f"{shown!r} must be {what}; each line must be {_LINE_FORM}")
    return number


def _assemble(values: np.ndarray, tokens: _Tokens, n_features: int,
              name: str) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``X`` and ``y`` from token values; checks the feature indices."""
    index_tokens = np.flatnonzero(tokens.is_index)
    rows = np.cumsum(tokens.is_label)[index_tokens] - 1
    index = values[index_tokens]
    bad = (index != np.floor(index)) | (index < 1) | (index > n_features)
    if bad.any():
        k = int(np.argmax(bad))
        raise DataError(f"file {name} line {tokens.line(index_tokens[k])}: feature index "
                        f"{index[k]:g} must be an integer in [1, n_features={n_features}]")
    unordered = (rows[1:] == rows[:-1]) & (index[1:] <= index[:-1])
    if unordered.any():
        k = int(np.argmax(unordered)) + 1
        raise DataError(f"file {name} line {tokens.line(index_tokens[k])}: "
                        "feature indices must be strictly increasing")
    X = np.zeros((np.count_nonzero(tokens.is_label), n_features))
    X[rows, index.astype(np.intp) - 1] = values[index_tokens + 1]
    return X, values[tokens.is_label]


def binary_labels(y: np.ndarray, name: str) -> np.ndarray:
    """Labels as -1.0/+1.0: kept if already so, else the two classes mapped in order."""
    classes = np.unique(y)
    if np.isin(classes, (-1.0, 1.0)).all():
        return y
    if classes.size != 2:
        shown = ", ".join(f"{c:g}" for c in classes[:5])
        raise DataError(f"file {name}: labels ({shown}{', ...' if classes.size > 5 else ''}) "
                        "must take two values for a binary data set")
    return np.where(y == classes[1], 1.0, -1.0)
