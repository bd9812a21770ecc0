"""A tuning task on a registered data set: the protected training records, a held-out
validation split that scores candidates, and the test file that reports the selected θ.

The training file is split once by a fixed public permutation (seed 0); the last
``validation_fraction`` of it is held out. The validation records are not protected by the
guarantee: the protected data set is the rest of the training file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import _validate, data
from ..algorithms.by_name import NAMES, NON_PRIVATE, build
from ..data.bounds import Preparation
from ..oracles import make

#: The GLM models a task may use, each with the metric its ``error`` computes.
METRICS = {"logistic": "test_error", "nonconvex-logistic": "test_error", "ridge": "test_mse"}
MODELS = tuple(METRICS)


@dataclass(frozen=True)
class Task:
    """``oracle`` on the protected records; ``validation_error(θ)`` and ``test_error(θ)`` on data
    outside them, both the quantity named ``metric`` ("test_error": a misclassification rate;
    "test_mse", "test_mae", "test_loss" otherwise); ``theta0`` where every run starts (None: 0)."""

    oracle: Any
    validation_error: Callable[[Tensor], float]
    test_error: Callable[[Tensor], float]
    metric: str = "test_error"
    theta0: Tensor | None = None


def split(X: Tensor, y: Tensor, fraction: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, y_train, X_val, y_val): a fixed public permutation (seed 0), the last ``fraction`` held out."""
    _validate.open_unit("validation_fraction", fraction)
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    held = max(1, round(fraction * len(X)))
    return X[order[:-held]], y[order[:-held]], X[order[-held:]], y[order[-held:]]


def held_out_task(oracle_on: Callable[[Tensor, Tensor], Any], X: Any, y: Any, X_test: Any, y_test: Any, *,
                  validation_fraction: float, metric: str = "test_error",
                  measure: Callable[[Any, Tensor, Tensor], Callable[[Tensor], float]] | None = None) -> Task:
    """``oracle_on(X_train, y_train)`` on the training arrays ``(X, y)`` less their validation split
    (:func:`split`); θ is scored by ``measure(oracle, X', y')`` (default: ``oracle.error`` on
    (X', y')) on the validation split and on ``(X_test, y_test)``."""
    X_train, y_train, X_val, y_val = split(torch.as_tensor(X), torch.as_tensor(y), validation_fraction)
    oracle = oracle_on(X_train, y_train)
    on = measure or (lambda o, X_, y_: lambda theta: o.error(theta, X_, y_))
    return Task(oracle, on(oracle, X_val, y_val), on(oracle, torch.as_tensor(X_test), torch.as_tensor(y_test)),
                metric)


def glm_task(dataset: str, model: str, *, reg: float, validation_fraction: float,
             data_dir: str | None = None, preparation: Preparation | None = None) -> Task:
    """A GLM ``model`` (:data:`MODELS`) on registered ``dataset`` (prepared by ``preparation``, a
    per-record map of public bounds; None: as loaded), split as the module says; its metric is the
    misclassification rate (logistic models) or the mean squared error (ridge)."""
    _validate.one_of("dataset", dataset, data.names())
    _validate.one_of("model", model, MODELS)
    loaded = data.load(dataset, data_dir)
    if preparation is not None:
        loaded = preparation.prepare(loaded)
    return held_out_task(lambda X, y: make(model, X, y, reg=reg), loaded.X_train, loaded.y_train, loaded.X_test,
                         loaded.y_test, validation_fraction=validation_fraction,
                         metric=METRICS[model])


def builder(algorithm: str, n: int, fixed: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Any]:
    """candidate ↦ algorithm ``algorithm`` for n records with the ``fixed`` settings, the candidate's on top."""
    _validate.one_of("algorithm", algorithm, [name for name in NAMES if name not in NON_PRIVATE])
    return lambda candidate: build(algorithm, n=n, **(dict(fixed) | dict(candidate)))
