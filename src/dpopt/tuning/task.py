"""A tuning task on a registered data set: the protected training records, a held-out
validation split that scores candidates, and the test file that reports the selected θ.

The training file is split once by a fixed public permutation (seed 0); the last
``validation_fraction`` of it is held out. A file of one's own is split by a public hash of each
row's values instead (:func:`by_content`), so that one added row moves no other. The validation
records are not protected by the guarantee: the protected data set is the rest of the training file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import _validate, data
from ..algorithms import registry
from ..base import Algorithm
from ..building import Records, Scored, oracle_for
from ..data.bounds import Preparation
from ..names import GLMS
from .private import Tuned, tune
from .space import Space, Value
from .trials import Trials


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


#: The public seed of :func:`by_content`'s hash (the test split of a file of one's own uses 0).
VALIDATION_SEED = 1


def by_content(X: Tensor, y: Tensor, fraction: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, y_train, X_val, y_val): a row is held out iff the public hash of its values with
    seed :data:`VALIDATION_SEED` is below ``fraction`` (:func:`dpopt.data.own.held_out`): a row's
    side does not depend on the other rows."""
    from ..data.own import held_out

    _validate.open_unit("validation_fraction", fraction)
    held = torch.as_tensor(held_out(X.numpy(), y.numpy(), fraction, VALIDATION_SEED))
    if held.all() or not held.any():
        raise _validate.DpoptError(f"validation_fraction={fraction!r} holds out {int(held.sum())} of {len(held)} "
                                   "training rows; a validation split needs rows on both sides")
    return X[~held], y[~held], X[held], y[held]


def _error(oracle: Scored, X: Tensor, y: Tensor) -> Callable[[Tensor], float]:
    """θ ↦ ``oracle.error(θ, X, y)``."""
    return lambda theta: oracle.error(theta, X, y)


def held_out_task(oracle_on: Callable[[Tensor, Tensor], Scored], X: Records, y: Records, X_test: Records,
                  y_test: Records, *, validation_fraction: float, metric: str = "test_error",
                  measure: Callable[[Scored, Tensor, Tensor], Callable[[Tensor], float]] = _error,
                  split_by: Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor, Tensor, Tensor]] = split) -> Task:
    """``oracle_on(X_train, y_train)`` on the training arrays ``(X, y)`` less their validation split
    (``split_by``: :func:`split` or :func:`by_content`); θ is scored by ``measure(oracle, X', y')``
    (default: ``oracle.error`` on (X', y')) on the validation split and on ``(X_test, y_test)``."""
    X_train, y_train, X_val, y_val = split_by(torch.as_tensor(X), torch.as_tensor(y), validation_fraction)
    oracle = oracle_on(X_train, y_train)
    return Task(oracle, measure(oracle, X_val, y_val),
                measure(oracle, torch.as_tensor(X_test), torch.as_tensor(y_test)), metric)


def glm_task(dataset: str | data.Dataset, model: str, *, reg: float, validation_fraction: float,
             data_dir: str | None = None, preparation: Preparation | None = None) -> Task:
    """A GLM ``model`` (:data:`dpopt.building.GLMS`) on registered ``dataset`` (a name; prepared by
    ``preparation``, a per-record map of public bounds; None: as loaded), split as the module says,
    or on a loaded file of one's own (a :class:`~dpopt.data.Dataset`, already prepared, split
    :func:`by_content`); its metric is the misclassification rate (logistic models) or the mean
    squared error (ridge)."""
    if isinstance(dataset, str):
        _validate.one_of("dataset", dataset, data.names())
    _validate.one_of("model", model, GLMS)
    loaded, split_by = (data.load(dataset, data_dir), split) if isinstance(dataset, str) else (dataset, by_content)
    if preparation is not None:
        loaded = preparation.prepare(loaded)
    return held_out_task(lambda X, y: oracle_for(model, X, y, reg=reg), loaded.X_train, loaded.y_train,
                         loaded.X_test, loaded.y_test, validation_fraction=validation_fraction,
                         metric=GLMS[model], split_by=split_by)


def builder(algorithm: str, n: int, fixed: Mapping[str, object]) -> Callable[[Mapping[str, Value]], Algorithm[object]]:
    """candidate ↦ the private algorithm ``algorithm`` (by name, :mod:`dpopt.algorithms.registry`) for n
    records with the ``fixed`` settings, the candidate's on top."""
    _validate.one_of("algorithm", algorithm, registry.REGISTRY.private)
    return lambda candidate: registry.build(algorithm, n=n, **(dict(fixed) | dict(candidate)))


def tune_task(task: Task, algorithm: str, fixed: Mapping[str, object], *, space: Space, trials: Trials,
              epsilon: float, delta: float, steps: int, seed: int | None = None, diagnostics: bool = False,
              allow_large_delta: bool = False) -> Tuned:
    """The registered ``algorithm`` with the ``fixed`` settings tuned privately on ``task``
    (:func:`dpopt.tuning.tune`; :func:`builder`): every trial starts at the task's θ0, candidates
    are scored by its validation error and the selected θ reports its test metric."""
    return tune(builder(algorithm, task.oracle.n, fixed), task.oracle, space=space, trials=trials, epsilon=epsilon,
                delta=delta, steps=steps, score=task.validation_error, seed=seed, theta0=task.theta0,
                test_error=task.test_error, diagnostics=diagnostics, allow_large_delta=allow_large_delta)
