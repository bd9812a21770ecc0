"""Loading a data set: its files located, verified while they are copied privately, the copies
parsed (parses cached in-process by the files' sha256s), a fresh :class:`~dpopt.data.Dataset`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dpopt.data.catalogue import Catalogue, Entry, shipped
from dpopt.data.dataset import Arrays, Dataset
from dpopt.data.files import PathLike, locate, resolve, verified_copy

__all__ = ["load"]


def load(name: str, data_dir: PathLike | None = None, *, catalogue: Catalogue | None = None) -> Dataset:
    """Load data set ``name`` from ``data_dir`` (default :func:`~dpopt.data.default_data_dir`).

    On each call every file is checked (a regular file of its catalogued size, then its sha256)
    while it is copied into a private temporary directory, and the copies are parsed: what is
    parsed is exactly what was verified. Parsing is cached in-process by the files' digests. The
    returned arrays are fresh copies, so callers may modify them. ``catalogue``: where ``name`` is
    looked up (default: the package's, :func:`dpopt.data.catalogue.shipped`).
    """
    entry = (shipped() if catalogue is None else catalogue).entry(name)
    paths = locate(entry, resolve(data_dir))
    with tempfile.TemporaryDirectory(prefix="dpopt-data-") as private:
        copies = [Path(private, file.name) for file in entry.files]
        digests = tuple(verified_copy(path, file, entry, copy)
                        for path, file, copy in zip(paths, entry.files, copies))
        X_train, y_train, X_test, y_test = _parse(entry, digests, copies)
    where = ", ".join(str(path) for path in paths)
    return Dataset(entry.name, entry.task, X_train.copy(), y_train.copy(), X_test.copy(), y_test.copy(),
                   f"{entry.source}; read from {where}")


#: Parsed data sets by (parser, number of features, the sha256 of each file): the same bytes parse to
#: the same arrays.
_PARSED: dict[tuple[str, int, tuple[str, ...]], Arrays] = {}
_PARSED_MAX = 4


def _parse(entry: Entry, digests: tuple[str, ...], copies: list[Path]) -> Arrays:
    """The arrays of the (verified) files ``copies`` of ``entry``, whose sha256s are ``digests``."""
    key = (entry.parser, entry.dim, digests)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]  # the oldest
        _PARSED[key] = entry.parse(copies)
    return _PARSED[key]
