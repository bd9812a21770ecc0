"""Preparation of a data set from public bounds: what ``dpopt run`` does to every data set, for
every model, before training.

Each record is prepared on its own, with public numbers only (ranges the user gives or a data
set's catalogue entry declares, never statistics of the data). So neighbouring data sets stay
neighbouring after preparation, the preparation costs no privacy, and the training's guarantee
holds for the raw records. Values outside a range are clipped to it, not refused (refusing
would reveal that a record lies outside).

:class:`PublicBounds`, for feature j with public range [lo_j, hi_j] and, for regression, a
target with public range [a, b]::

    x_j ← 2·(clip(x_j, lo_j, hi_j) − lo_j) / (hi_j − lo_j) − 1        ∈ [−1, 1]
    x   ← x · min(1, R / ‖x‖)                                           (with a row norm R)
    y   ← 2·(clip(y, a, b) − a) / (b − a) − 1                          ∈ [−1, 1]

:class:`AsGiven`: the features already lie in a public range (pixels / 255, LIBSVM's binary or
scaled features) and are used unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from dpopt._validate import DpoptError
from dpopt.data.dataset import Dataset


class Preparation(Protocol):
    """A per-record map of a data set's features and targets with public parameters."""

    def prepare(self, dataset: Dataset) -> Dataset:
        """Both splits prepared, each record on its own."""
        ...


@dataclass(frozen=True)
class Range:
    """A public interval [low, high] (low < high, both finite)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise DpoptError(f"range=[{self.low}, {self.high}] must be finite with low < high")

    @classmethod
    def parse(cls, name: str, text: str) -> Range:
        """``"LOW:HIGH"`` (the command line's form); errors name the argument ``name``."""
        low, sep, high = text.partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(float(low), float(high))
        except ValueError:
            raise DpoptError(f"{name}={text!r} must be LOW:HIGH with finite numbers LOW < HIGH") from None


@dataclass(frozen=True)
class PublicBounds:
    """Features clipped to public ranges and mapped onto [−1, 1]; rows then scaled to norm at most
    ``row_norm`` (None: not scaled); a regression target clipped to ``target`` and mapped onto
    [−1, 1] (see the module docstring). ``features``: one range for every feature, or one per
    feature in order. ``source``: where the bounds come from (shown with the results)."""

    features: Range | tuple[Range, ...]
    target: Range | None = None
    row_norm: float | None = None
    source: str = "given by the user"

    def __post_init__(self) -> None:
        if self.row_norm is not None and not (math.isfinite(self.row_norm) and self.row_norm > 0):
            raise DpoptError(f"row_norm={self.row_norm} must be > 0 and finite")

    def prepare(self, dataset: Dataset) -> Dataset:
        if isinstance(self.features, tuple) and len(self.features) != dataset.dim:
            raise DpoptError(f"feature_bounds has {len(self.features)} ranges; the data set {dataset.name!r} has "
                             f"{dataset.dim} features")
        if dataset.task == "regression" and self.target is None:
            raise DpoptError(f"target_bounds must be given for the regression data set {dataset.name!r} "
                             "(a public range of its target, LOW:HIGH)")
        if dataset.task != "regression" and self.target is not None:
            raise DpoptError(f"target_bounds is for regression; the data set {dataset.name!r} is a "
                             f"{dataset.task} task")
        return replace(dataset, X_train=self._features(dataset.X_train), X_test=self._features(dataset.X_test),
                       y_train=self._target(dataset.y_train), y_test=self._target(dataset.y_test),
                       source=f"{dataset.source}; prepared from public bounds ({self.source})")

    def _features(self, X: np.ndarray) -> np.ndarray:
        ranges = self.features if isinstance(self.features, tuple) else (self.features,) * X.shape[1]
        X = _to_unit(X, np.array([r.low for r in ranges]), np.array([r.high for r in ranges]))
        if self.row_norm is None:
            return X
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X * np.minimum(1.0, self.row_norm / np.maximum(norms, np.finfo(float).tiny))

    def _target(self, y: np.ndarray) -> np.ndarray:
        return y if self.target is None else _to_unit(y, self.target.low, self.target.high)


def _to_unit(values: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> np.ndarray:
    """Clipped to [low, high], then mapped affinely onto [−1, 1]."""
    return 2 * (np.clip(values, low, high) - low) / (high - low) - 1


@dataclass(frozen=True)
class AsGiven:
    """Features used unchanged: ``reason`` says which public range they already lie in."""

    reason: str

    def prepare(self, dataset: Dataset) -> Dataset:
        return dataset


def feature_ranges(text: str, columns: Sequence[str] | None = None) -> Range | tuple[Range, ...]:
    """``--feature-bounds``: ``LOW:HIGH`` for every feature, or a JSON file holding a list of
    ``[low, high]`` per feature in order or, for named ``columns`` (a CSV's header), an object
    mapping every column name to ``[low, high]``."""
    if not text.endswith(".json"):
        return Range.parse("feature_bounds", text)
    try:
        given = json.loads(Path(text).read_text())
    except (OSError, ValueError) as err:
        raise DpoptError(f"feature_bounds={text!r} must be LOW:HIGH or a readable JSON file ({err})") from None
    if isinstance(given, dict):
        if columns is None or set(given) != set(columns):
            wanted = "the feature columns " + ", ".join(columns) if columns else "a list (the data has no column names)"
            raise DpoptError(f"feature_bounds={text!r} must name exactly {wanted}")
        given = [given[column] for column in columns]
    if not isinstance(given, list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in given):
        raise DpoptError(f"feature_bounds={text!r} must hold a list of [low, high] pairs or an object of them")
    return tuple(Range(float(low), float(high)) for low, high in given)
