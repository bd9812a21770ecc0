"""A user's own data file (``dpopt run --data PATH``, ``dpopt tune --data PATH``), read against a
public schema: CSV, LIBSVM or NPZ.

The schema (:class:`Schema`: flags or a small JSON file) is what is public about the file, and it
alone fixes the shape of what is trained: the task, the target's column (CSV) or array (NPZ), the
number of features and, for a multiclass task, the number of classes K. None of them is read from
the data's values: were K the largest label plus one, one added row labelled 7 would grow the
model, and the model's size would tell that the row is there (ε = ∞ for it). The format is read
from the file name:

* ``.csv`` (``.csv.gz``): a header line naming the columns, then numbers separated by commas; the
  header is schema (the column ``target`` is the target, every other column a feature, in order).
* ``.npz``: an array ``X`` [n, d] of features and the 1-D array named ``target`` (default ``y``);
  the array's width d is its schema.
* ``.libsvm`` / ``.svm`` (also ``.bz2``, ``.gz``, ``.xz`` compressed): ``label index:value …``;
  the label is the target; the number of features D must be given (not the largest index).

Rows outside the schema are refused with the row's line in the file (1-based, as an editor shows
it; an NPZ row by its index from 1): a wrong number of columns, a value that is not a finite
number, a feature index above D, a binary label other than 1 (positive), 0 or −1 (negative), a
multiclass label that is not an integer in [0, K). Nothing is trained then.

The split. Unless a separate test file is given, a row is held out for testing iff u(row) < 0.2,
where u ∈ [0, 1) is a public hash of the row's own values (its features and target as read) with
the public seed 0 (:func:`held_out`). So every row stays on its side whatever other rows the file
holds: two files that differ by one row have training sets that differ by at most that row, and
neighbouring files give neighbouring training sets, which the guarantee protects. A permutation
of the n rows (as registered data sets are split) would move many rows when one is added, and a
row's line would move every row below an inserted one. The hash needs no secret: the held-out
rows are not protected anyway (their exact test error is released, labelled NOT PRIVATE). With a
separate public test file every row of the data file trains. Identical rows fall on the same side.
Values are then prepared from public bounds (:mod:`dpopt.data.bounds`).
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpopt._validate import one_of, positive_int
from dpopt.data.dataset import TASKS, DataError, Dataset
from dpopt.data.libsvm import read_libsvm_lines

LIBSVM_SUFFIXES = (".libsvm", ".svm")
#: The share of a file's rows held out for testing, and the public seed of the hash that holds them out.
HELD_OUT = 0.2
SPLIT_SEED = 0
#: What a schema file may hold.
SCHEMA_KEYS = ("task", "target", "features", "classes")


@dataclass(frozen=True)
class Schema:
    """What is public about a data file: ``task`` (binary, multiclass, regression); ``target``, the
    target's CSV column or NPZ array; ``features``, their number or (CSV) their column names in
    order; ``classes``, the number of classes K of a multiclass task (labels 0 … K−1).

    As a JSON file: ``{"task": "multiclass", "target": "label", "classes": 10, "features": 784}``
    (``features`` may be a list of column names)."""

    task: str
    target: str | None = None
    features: int | tuple[str, ...] | None = None
    classes: int | None = None

    def __post_init__(self) -> None:
        one_of("task", self.task, TASKS)
        if self.task == "multiclass" and self.classes is None:
            raise DataError("task='multiclass' needs its number of classes K (--classes K, or \"classes\" in "
                            "--schema): it is public, never read from the labels")
        if self.task != "multiclass" and self.classes is not None:
            raise DataError(f"classes={self.classes!r} is for task='multiclass' (the task is {self.task!r})")
        if self.classes is not None and positive_int("classes", self.classes) < 2:
            raise DataError(f"classes={self.classes!r} must be >= 2")
        if isinstance(self.features, tuple):
            if not self.features or len(set(self.features)) != len(self.features) or not all(
                    isinstance(name, str) for name in self.features):
                raise DataError(f"features={list(self.features)!r} must be distinct column names, at least one")
        elif self.features is not None:
            positive_int("features", self.features)

    @property
    def dim(self) -> int | None:
        """The number of features, if the schema fixes it."""
        return len(self.features) if isinstance(self.features, tuple) else self.features

    @classmethod
    def of(cls, path: str | Path | None = None, **given: object) -> Schema:
        """The schema of the JSON file at ``path`` (if any), completed by ``given`` (the command
        line's ``task``, ``target``, ``features``, ``classes``; None: not given); a value given
        both ways must be the same."""
        declared: dict[str, Any] = {} if path is None else _schema_file(Path(path))  # checked by Schema
        for key, value in given.items():
            if value is None:
                continue
            if key in declared and declared[key] != value:
                raise DataError(f"{key}={value!r} differs from {key}={declared[key]!r} in schema={str(path)!r}")
            declared[key] = value
        if "task" not in declared:
            raise DataError(f"--data needs --task: one of {', '.join(TASKS)} (or \"task\" in a --schema file)")
        return cls(**declared)


def _schema_file(path: Path) -> dict[str, str | int | tuple[str, ...]]:
    try:
        declared = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"schema={str(path)!r} must be a readable JSON file ({err})") from None
    if not isinstance(declared, dict) or not set(declared) <= set(SCHEMA_KEYS):
        raise DataError(f"schema={str(path)!r} must be a JSON object with keys among {', '.join(SCHEMA_KEYS)}")
    types: dict[str, type | tuple[type, ...]] = {"task": str, "target": str, "features": (int, list), "classes": int}
    for key, value in declared.items():
        if isinstance(value, bool) or not isinstance(value, types[key]):
            raise DataError(f"schema={str(path)!r}: {key}={value!r} has the wrong type")
    if isinstance(declared.get("features"), list):
        declared["features"] = tuple(declared["features"])
    return declared


@dataclass(frozen=True)
class Described:
    """A data set to train on and what the outputs state about it: ``classes`` (multiclass: K,
    public), ``protected`` (which records the guarantee protects), ``test_data`` (where test
    metrics are measured) and ``test_unprotected`` (they are rows of the user's own file, not
    protected: their metrics are released exactly, labelled NOT PRIVATE). ``columns``: a CSV's
    feature names."""

    dataset: Dataset
    protected: str
    test_data: str
    classes: int | None = None
    columns: tuple[str, ...] | None = None
    test_unprotected: bool = False


def read(path: str | Path, schema: Schema, *, test: str | Path | None = None) -> Described:
    """The file at ``path`` as a :class:`Described` data set of ``schema``: split as the module
    says, or, with a ``test`` file of the same schema, all of it for training."""
    path = Path(path)
    rows = _rows(path, schema)
    if test is not None:
        tested = _rows(Path(test), replace(schema, features=rows.columns or rows.X.shape[1]))
        dataset = Dataset(path.name, schema.task, rows.X, rows.y, tested.X, tested.y,
                          f"{path} (every row trains); test rows: {test}")
        return Described(dataset, f"all {len(rows.y)} rows of {path.name}",
                         f"{Path(test).name}, a separate test file of {len(tested.y)} rows", schema.classes,
                         rows.columns)
    held = held_out(rows.X, rows.y, HELD_OUT, SPLIT_SEED)
    kept = int((~held).sum())
    if held.all() or not held.any():
        raise DataError(f"data={str(path)!r}: the public split keeps {kept} of its {len(held)} rows for training; "
                        "a split needs rows on both sides: give --test-data FILE (a public test file) to train on all")
    dataset = Dataset(path.name, schema.task, rows.X[~held], rows.y[~held], rows.X[held], rows.y[held],
                      f"{path} (split by a public hash of each row's values, seed {SPLIT_SEED})")
    return Described(dataset, f"the {kept} rows of {path.name} that the public split keeps for training (a row is "
                              f"held out iff the hash of its values, seed {SPLIT_SEED}, falls below {HELD_OUT:g}: "
                              "dpopt.data.own.held_out)",
                     f"NOT PRIVATE: the {len(held) - kept} rows of {path.name} held out by the split; they are not "
                     "protected, and their exact test error is released without noise (give --test-data FILE, a "
                     "public test file, to avoid it)", schema.classes, rows.columns, test_unprotected=True)


def held_out(X: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Which rows are held out: u(row) < ``fraction``, u the public hash of the row's values in
    [0, 1) with ``seed`` (SplitMix64's mixer over the seed and the float64 bits of each feature,
    then the target; −0.0 counts as 0.0). A row's side depends on its own values only."""
    values = np.column_stack([X, y]).astype(np.float64) + 0.0  # −0.0 + 0.0 = +0.0
    state = _mixed(np.full(len(values), seed, dtype=np.uint64))
    for column in np.ascontiguousarray(values.T).view(np.uint64):
        state = _mixed(state ^ column)
    return (state >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < fraction


def _mixed(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014), elementwise, modulo 2⁶⁴."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class _Rows:
    """A file's rows: features, target (checked against the schema), the line (``unit``: "line",
    or "row" for NPZ) of each row, and a CSV's feature names."""

    X: np.ndarray
    y: np.ndarray
    lines: np.ndarray
    unit: str
    columns: tuple[str, ...] | None


def _rows(path: Path, schema: Schema) -> _Rows:
    if not path.is_file():
        raise DataError(f"data={str(path)!r} must be a readable file")
    if path.name.endswith((".csv", ".csv.gz")):
        rows = _csv(path, schema)
    elif path.name.endswith(".npz"):
        rows = _npz(path, schema)
    elif path.name.endswith(tuple(kind + packed for kind in LIBSVM_SUFFIXES for packed in ("", ".bz2", ".gz", ".xz"))):
        rows = _libsvm(path, schema)
    else:
        raise DataError(f"data={str(path)!r} must end in .csv, .csv.gz, .npz, {', '.join(LIBSVM_SUFFIXES)} "
                        "(optionally .bz2, .gz, .xz)")
    if len(rows.y) == 0:
        raise DataError(f"file {path} holds no rows")
    finite = np.isfinite(rows.X).all(axis=1) & np.isfinite(rows.y)
    if not finite.all():
        raise DataError(f"file {path} {rows.unit} {rows.lines[np.argmin(finite)]}: a value is not a finite number")
    return replace(rows, y=_labels(rows, schema, path))


def _labels(rows: _Rows, schema: Schema, path: Path) -> np.ndarray:
    """The target as the task wants it (binary: −1/+1; multiclass: 0 … K−1), or an error naming
    the first row whose label is outside the schema."""
    y = rows.y
    if schema.task == "binary":
        bad, wanted = ~np.isin(y, (-1.0, 0.0, 1.0)), "1 (positive), 0 or -1 (negative) for task='binary'"
    elif schema.task == "multiclass":
        assert schema.classes is not None  # (a multiclass Schema has it)
        bad = (y != np.floor(y)) | (y < 0) | (y >= schema.classes)
        wanted = f"an integer class in [0, {schema.classes - 1}] (classes={schema.classes})"
    else:
        return y
    if bad.any():
        k = int(np.argmax(bad))
        raise DataError(f"file {path} {rows.unit} {rows.lines[k]}: label {y[k]:g} must be {wanted}")
    return np.where(y == 1, 1.0, -1.0) if schema.task == "binary" else y


def _named(argument: str, value: str | None, kind: str) -> str:
    if value is None:
        raise DataError(f"{argument} must name the target column of a {kind} file (--{argument} NAME)")
    return value


def _csv(path: Path, schema: Schema) -> _Rows:
    target = _named("target", schema.target, "CSV")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as stream:
        lines = list(stream)
    header = next(csv.reader(lines[:1]), None)
    if header is None or target not in header:
        raise DataError(f"target={target!r} must be a column of the header line of {path} "
                        f"({', '.join(header or ['no header'])})")
    at = header.index(target)
    columns = tuple(header[:at] + header[at + 1:])
    if schema.dim is not None and (columns != schema.features if isinstance(schema.features, tuple)
                                   else len(columns) != schema.features):
        raise DataError(f"file {path} line 1: the feature columns {', '.join(columns)} must be the schema's "
                        f"features={list(schema.features) if isinstance(schema.features, tuple) else schema.features}")
    numbered = [(line, text) for line, text in enumerate(lines[1:], start=2) if text.strip()]
    table = _table(path, numbered, header)
    return _Rows(np.delete(table, at, axis=1), table[:, at], np.array([line for line, _ in numbered]), "line", columns)


def _table(path: Path, numbered: list[tuple[int, str]], header: list[str]) -> np.ndarray:
    """The numbers of the ``(line, text)`` rows, one column per header name: numpy's parser, and
    where it fails, one row at a time, to name the first bad line."""
    if not numbered:
        return np.zeros((0, len(header)))
    try:
        table = np.loadtxt([text for _, text in numbered], delimiter=",", dtype=np.float64, ndmin=2, comments=None)
        if table.shape == (len(numbered), len(header)):
            return table
    except ValueError:
        pass
    return np.array([_cells(path, line, text, header) for line, text in numbered])


def _cells(path: Path, line: int, text: str, header: list[str]) -> list[float]:
    cells = text.rstrip("\r\n").split(",")
    if len(cells) != len(header):
        raise DataError(f"file {path} line {line} has {len(cells)} columns; the header has {len(header)}")
    numbers = []
    for name, cell in zip(header, cells):
        try:
            numbers.append(float(cell))
        except ValueError:
            shown = cell.strip()[:40]
            raise DataError(f"file {path} line {line}, column {name!r}: {shown!r} is not a number") from None
    return numbers


def _npz(path: Path, schema: Schema) -> _Rows:
    target = schema.target or "y"
    with np.load(path, allow_pickle=False) as arrays:
        if "X" not in arrays or target not in arrays:
            raise DataError(f"file {path} must hold the arrays 'X' and {target!r} (it holds "
                            f"{', '.join(arrays.files)})")
        X, y = np.asarray(arrays["X"], dtype=np.float64), np.asarray(arrays[target], dtype=np.float64)
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise DataError(f"file {path}: X.shape={X.shape} and {target}.shape={y.shape} must be (n, d) and (n,)")
    if schema.dim is not None and X.shape[1] != schema.dim:
        raise DataError(f"file {path}: X has {X.shape[1]} columns; the schema says features={schema.dim}")
    return _Rows(X, y, np.arange(1, len(y) + 1), "row", None)


def _libsvm(path: Path, schema: Schema) -> _Rows:
    if schema.target is not None:
        raise DataError(f"target={schema.target!r} is for CSV and NPZ files; a LIBSVM file's target is its label")
    if schema.dim is None:
        raise DataError(f"file {path} is LIBSVM: give its number of features (--features D, or \"features\" in "
                        "--schema); it is public, never read from the largest index in the file")
    X, y, lines = read_libsvm_lines(path, schema.dim)
    return _Rows(X, y, lines, "line", None)
