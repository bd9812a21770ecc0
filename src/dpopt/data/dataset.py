"""The data set type: a train/test split in memory, checked when it is made, and the error of the
whole :mod:`dpopt.data` package.

This module is the leaf of the package: the readers, the catalogue, the preparations and the
loaders all import it, and it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpopt._validate import DpoptError, one_of

__all__ = ["TASKS", "Arrays", "DataError", "Dataset"]

TASKS = ("binary", "regression", "multiclass")
#: A split's arrays as a reader returns them: ``X_train, y_train, X_test, y_test``.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class DataError(DpoptError):
    """A data file or data set cannot be used: the message names it and what to do."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split in memory: dense float64 features ``X [n, d]`` and labels ``y [n]``.

    Binary labels are -1.0/+1.0; multiclass labels are the class indices 0.0, 1.0, ... (cast
    them to ``long`` for ``cross_entropy``). Images are stored flattened, one row per image
    (MNIST: 784 pixels, row-major); models reshape them (``dpopt.models`` start with
    ``nn.Unflatten``). ``source`` is one line saying where the files came from.
    """

    name: str
    task: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    source: str

    def __post_init__(self) -> None:
        one_of("task", self.task, TASKS)
        for field in ("X_train", "y_train", "X_test", "y_test"):
            object.__setattr__(self, field, np.asarray(getattr(self, field), dtype=np.float64))
        _check_split("train", self.X_train, self.y_train, self.task)
        _check_split("test", self.X_test, self.y_test, self.task)
        if self.X_test.shape[1] != self.dim:
            raise DpoptError(f"X_test.shape[1]={self.X_test.shape[1]} must equal "
                             f"X_train.shape[1]={self.dim}")

    @property
    def n(self) -> int:
        """Number of training rows."""
        return int(self.X_train.shape[0])

    @property
    def dim(self) -> int:
        """Number of features."""
        return int(self.X_train.shape[1])

    def majority_error(self) -> float:
        """Test error of always predicting the training majority class (binary ties predict -1,
        multiclass ties the smallest label)."""
        if self.task == "binary":
            majority = 1.0 if np.count_nonzero(self.y_train == 1.0) * 2 > self.n else -1.0
        elif self.task == "multiclass":
            classes, counts = np.unique(self.y_train, return_counts=True)
            majority = classes[np.argmax(counts)]
        else:
            raise DpoptError(f"task={self.task!r} must be 'binary' or 'multiclass' for majority_error()")
        return float(np.mean(self.y_test != majority))


def _check_split(split: str, X: np.ndarray, y: np.ndarray, task: str) -> None:
    """``X`` is 2-D, ``y`` 1-D with one label per row, binary labels in {-1, +1}, multiclass
    labels integers >= 0."""
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise DpoptError(f"X_{split}.shape={X.shape} and y_{split}.shape={y.shape} "
                         "must be (n, d) and (n,)")
    if task == "binary" and not np.isin(y, (-1.0, 1.0)).all():
        raise DpoptError(f"y_{split} must hold only -1.0 and +1.0 for task='binary'")
    if task == "multiclass" and not (np.isfinite(y) & (y >= 0) & (y == np.floor(y))).all():
        raise DpoptError(f"y_{split} must hold only class indices 0.0, 1.0, ... for task='multiclass'")
