"""A user's own data file (``dpopt run --data PATH``): CSV, LIBSVM or NPZ, split 80/20.

The format is read from the file name:

* ``.csv`` (``.csv.gz``): a header line naming the columns, then numbers separated by commas;
  the column named ``target`` is the target, every other column a feature.
* ``.npz``: an array ``X`` [n, d] of features and the 1-D array named ``target`` (default ``y``).
* ``.libsvm`` / ``.svm`` (also ``.bz2``, ``.gz``, ``.xz`` compressed): ``label index:value …``;
  the label is the target; the number of features is the largest index in the file.

Only the schema (column names, the number of features) is taken from the file; values are
prepared from public bounds (:mod:`dpopt.data.bounds`). The rows are split into training and
test rows by a uniformly random permutation fixed by seed 0 (:func:`dpopt.data.tabular.split`),
which depends on the number of rows only. Binary labels may be any two values (the smaller
becomes −1, the larger +1); multiclass labels must be the class indices 0, 1, ….
"""

from __future__ import annotations

import csv
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpopt._validate import one_of
from dpopt.data.libsvm import DataError, binary_labels, read_bytes, read_libsvm
from dpopt.data.registry import TASKS, Dataset
from dpopt.data.tabular import split

LIBSVM_SUFFIXES = (".libsvm", ".svm")


@dataclass(frozen=True)
class OwnData:
    """The data set read from the user's file, and its feature columns' names (CSV only)."""

    dataset: Dataset
    columns: tuple[str, ...] | None


def read(path: str | Path, *, task: str, target: str | None) -> OwnData:
    """The file at ``path`` as a :class:`Dataset` of ``task`` (binary, multiclass, regression),
    its target the column (CSV) or array (NPZ) named ``target``; see the module docstring."""
    one_of("task", task, TASKS)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data={str(path)!r} must be a readable file")
    if path.name.endswith((".csv", ".csv.gz")):
        X, y, columns = _csv(path, _named("target", target, "CSV"))
    elif path.name.endswith(".npz"):
        X, y, columns = *_npz(path, target or "y"), None
    elif path.name.endswith(tuple(kind + packed for kind in LIBSVM_SUFFIXES for packed in ("", ".bz2", ".gz", ".xz"))):
        if target is not None:
            raise DataError(f"target={target!r} is for CSV and NPZ files; a LIBSVM file's target is its label")
        X, y, columns = *_libsvm(path), None
    else:
        raise DataError(f"data={str(path)!r} must end in .csv, .csv.gz, .npz, {', '.join(LIBSVM_SUFFIXES)} "
                        "(optionally .bz2, .gz, .xz)")
    if not np.isfinite(X).all() or not np.isfinite(y).all():
        raise DataError(f"data={str(path)!r} must hold finite numbers only")
    if task == "binary":
        y = binary_labels(y, str(path))
    X_train, y_train, X_test, y_test = split(X, y)
    return OwnData(Dataset(path.name, task, X_train, y_train, X_test, y_test, f"{path} (80/20 split, seed 0)"),
                   columns)


def _named(argument: str, value: str | None, kind: str) -> str:
    if value is None:
        raise DataError(f"{argument} must name the target column of a {kind} file (--{argument} NAME)")
    return value


def _csv(path: Path, target: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as stream:
        header = next(csv.reader(stream), None)
        if header is None or target not in header:
            raise DataError(f"target={target!r} must be a column of the header line of {path} "
                            f"({', '.join(header or ['no header'])})")
        try:
            table = np.loadtxt(stream, delimiter=",", dtype=np.float64, ndmin=2)
        except ValueError as err:
            raise DataError(f"file {path} must hold numbers only below its header ({err})") from None
    if table.shape[1] != len(header):
        raise DataError(f"file {path} has {table.shape[1]} columns below a header of {len(header)}")
    at = header.index(target)
    return np.delete(table, at, axis=1), table[:, at], tuple(header[:at] + header[at + 1:])


def _npz(path: Path, target: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as arrays:
        if "X" not in arrays or target not in arrays:
            raise DataError(f"file {path} must hold the arrays 'X' and {target!r} (it holds "
                            f"{', '.join(arrays.files)})")
        X, y = np.asarray(arrays["X"], dtype=np.float64), np.asarray(arrays[target], dtype=np.float64)
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise DataError(f"file {path}: X.shape={X.shape} and {target}.shape={y.shape} must be (n, d) and (n,)")
    return X, y


def _libsvm(path: Path) -> tuple[np.ndarray, np.ndarray]:
    indices = re.findall(rb"(\d+):", read_bytes(path)[0])
    if not indices:
        raise DataError(f"file {path} holds no 'index:value' feature")
    return read_libsvm(path, max(int(index) for index in indices), binary=False)
