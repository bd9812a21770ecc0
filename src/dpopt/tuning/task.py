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
from ..oracles import make

MODELS = ("logistic", "nonconvex-logistic", "ridge")


@dataclass(frozen=True)
class Task:
    """``oracle`` on the protected records; ``validation_error(θ)`` and ``test_error(θ)`` on data
    outside them (for regression models: the oracle's error, its mean squared error)."""

    oracle: Any
    validation_error: Callable[[Tensor], float]
    test_error: Callable[[Tensor], float]


def split(X: Tensor, y: Tensor, fraction: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, y_train, X_val, y_val): a fixed public permutation (seed 0), the last ``fraction`` held out."""
    _validate.open_unit("validation_fraction", fraction)
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    held = max(1, round(fraction * len(X)))
    return X[order[:-held]], y[order[:-held]], X[order[-held:]], y[order[-held:]]


def glm_task(dataset: str, model: str, *, reg: float, validation_fraction: float,
             data_dir: str | None = None) -> Task:
    """A GLM ``model`` (:data:`MODELS`) on registered ``dataset``, split as the module says."""
    _validate.one_of("dataset", dataset, data.names())
    _validate.one_of("model", model, MODELS)
    loaded = data.load(dataset, data_dir)
    X_train, y_train, X_val, y_val = split(torch.as_tensor(loaded.X_train), torch.as_tensor(loaded.y_train),
                                           validation_fraction)
    oracle = make(model, X_train, y_train, reg=reg)
    X_test, y_test = torch.as_tensor(loaded.X_test), torch.as_tensor(loaded.y_test)
    return Task(oracle, lambda theta: oracle.error(theta, X_val, y_val), lambda theta: oracle.error(theta, X_test, y_test))


def builder(algorithm: str, n: int, fixed: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Any]:
    """candidate ↦ algorithm ``algorithm`` for n records with the ``fixed`` settings, the candidate's on top."""
    _validate.one_of("algorithm", algorithm, [name for name in NAMES if name not in NON_PRIVATE])
    return lambda candidate: build(algorithm, n=n, **(dict(fixed) | dict(candidate)))
