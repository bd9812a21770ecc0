"""Parsers of the DIFF2 paper's tabular data sets, their 80/20 split and the paper's preparation.

Murata & Suzuki (2023, §6): "we randomly split the original dataset into a 80 % train dataset
and a 20 % test dataset. Then, we normalized the numeric attributes to have mean zero and
standard deviation one. Also, we normalized the target variable by dividing the maximum
absolute value of the target variable in the whole dataset." The parsers here return the raw
rows split 80/20 by a fixed permutation (:func:`split`, seed 0), so every load gives the same
split; :func:`prepared` applies the normalisations.
"""

from __future__ import annotations

import gzip
import lzma
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpopt.data.dataset import Arrays, DataError, Dataset

SPLIT_SEED = 0
TRAIN_FRACTION = 0.8


def split(X: np.ndarray, y: np.ndarray, seed: int = SPLIT_SEED) -> Arrays:
    """A uniformly random 80/20 train/test split (⌊0.8·n⌋ training rows), fixed by ``seed``."""
    order = np.random.default_rng(seed).permutation(len(X))
    cut = int(TRAIN_FRACTION * len(X))
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def _table(stream, columns: int, path: Path | str) -> np.ndarray:
    table = np.loadtxt(stream, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != columns:
        raise DataError(f"file {path} must hold {columns} comma-separated columns, not {table.shape[1]}")
    return table


def california_housing(paths: Sequence[Path]) -> Arrays:
    """``cal_housing.data`` (StatLib): 8 raw features (longitude, latitude, housing median
    age, total rooms, total bedrooms, population, households, median income), target the
    median house value (the paper's "California Housing Data Set" of 20,640 × 8)."""
    (path,) = paths
    with lzma.open(path, "rt", encoding="ascii") as stream:
        table = _table(stream, 9, path)
    return split(table[:, :8], table[:, 8])


def gas_turbine(paths: Sequence[Path]) -> Arrays:
    """``gt_2011.csv`` … ``gt_2015.csv`` stacked (36,733 rows): the 9 ambient and process
    variables as features, CO as the target; NOx is removed (the paper's choice)."""
    parts = []
    for path in paths:
        with lzma.open(path, "rt", encoding="ascii") as stream:
            parts.append(_table(stream, 11, path))
    table = np.vstack(parts)
    return split(table[:, :9], table[:, 9])


def blogfeedback(paths: Sequence[Path]) -> Arrays:
    """``BlogFeedback.zip``: ``blogData_train.csv`` and the 60 test files stacked (60,021 rows ×
    280 features; target: comments in the next 24 h), then split 80/20 as in the paper."""
    (path,) = paths
    with zipfile.ZipFile(path) as archive:
        names = ["blogData_train.csv"] + sorted(n for n in archive.namelist() if n.startswith("blogData_test-"))
        table = np.vstack([_table(archive.open(name), 281, f"{path}:{name}") for name in names])
    return split(table[:, :280], table[:, 280])


#: KDDCup99's three symbolic attributes (columns 1, 2, 3: protocol_type, service, flag).
KDD_SYMBOLIC = (1, 2, 3)


def kddcup99(paths: Sequence[Path]) -> Arrays:
    """``kddcup.data_10_percent`` (494,021 rows of 41 attributes and a label): the 38 numeric
    attributes, then one-hot columns of the 3 symbolic ones (values sorted), 118 features in
    all; the label is the index of the record's class among the 23 sorted class names."""
    (path,) = paths
    with gzip.open(path, "rt", encoding="ascii") as stream:
        rows = [line.rstrip("\n").split(",") for line in stream if line.strip()]
    if any(len(row) != 42 for row in rows[:1000]):
        raise DataError(f"file {path} must hold 42 comma-separated columns per line")
    columns = list(zip(*rows))
    numeric = [np.asarray(column, dtype=np.float64) for i, column in enumerate(columns[:41]) if i not in KDD_SYMBOLIC]
    onehot = []
    for i in KDD_SYMBOLIC:
        values = np.asarray(columns[i])
        onehot += [(values == value).astype(np.float64) for value in sorted(set(columns[i]))]
    labels = np.asarray(columns[41])
    classes = sorted(set(columns[41]))
    y = np.searchsorted(np.asarray(classes), labels).astype(np.float64)
    return split(np.column_stack(numeric + onehot), y)


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both scaled by the training columns' mean and standard deviation (constant columns: by 1)."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (train - mean) / std, (test - mean) / std


def prepared(dataset: Dataset) -> Dataset:
    """The paper's preparation of a loaded data set: features standardised (statistics of the
    training rows, applied to both splits) and, for regression, the target divided by its
    maximum absolute value over the whole data set (train and test)."""
    X_train, X_test = standardise(dataset.X_train, dataset.X_test)
    y_train, y_test = dataset.y_train, dataset.y_test
    if dataset.task == "regression":
        scale = max(np.abs(y_train).max(), np.abs(y_test).max())
        y_train, y_test = y_train / scale, y_test / scale
    return Dataset(dataset.name, dataset.task, X_train, y_train, X_test, y_test,
                   dataset.source + "; standardised" + ("; target / max |y|" if dataset.task == "regression" else ""))
