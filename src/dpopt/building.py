"""Models and algorithms built by name: the one place a model's name becomes an oracle.

:data:`dpopt.names.MODELS` lists every name :func:`oracle_for` builds (plain strings, for the
command line's choices): the generalised linear models of :mod:`dpopt.oracles.glm`
(:data:`~dpopt.names.GLMS`), the DIFF2 paper's network ``"mlp"`` (:func:`dpopt.models.mlp_oracle`)
and the networks of :data:`dpopt.models.NETWORKS` (:func:`classifier_oracle`: per-record
cross-entropy on image rows). :func:`metric_of` measures each one's test metric, :func:`fits`
says which data sets' tasks it can learn, and :func:`private_entry` refuses, in one line, an
algorithm by name that is not private (its ε is ∞, so no target ε can be met).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import torch
from torch import Tensor

from . import _validate
from .algorithms import registry
from .base import Scored
from .json_types import JsonValue
from .models import cross_entropy, logistic_loss, make_model, mlp_oracle
from .names import GLMS, MLP, MODELS, NETWORKS
from .oracles import TorchModel, make

if TYPE_CHECKING:
    from .data import Dataset
    from .oracles.glm import GLM

#: The tasks of the data sets each model learns.
TASKS = {"logistic": ("binary",), "nonconvex-logistic": ("binary",), "ridge": ("regression",),
         MLP: ("regression", "multiclass", "binary")} | {name: ("multiclass",) for name in NETWORKS}

#: Records as a tensor or an array (rows of features, or targets).
Records: TypeAlias = Tensor | np.ndarray


def oracle_for(model: str, X: Records, y: Records, *, task: str = "regression", classes: int | None = None,
               reg: float = 0.0, microbatch_size: int = 512, **options: JsonValue) -> GLM | TorchModel:
    """The oracle of ``model`` (one of :data:`dpopt.names.MODELS`) on the records ``(X, y)``:

    * a GLM (:data:`dpopt.names.GLMS`): :func:`dpopt.oracles.make` with regularisation ``reg``;
    * ``"mlp"``: :func:`dpopt.models.mlp_oracle`: ``classes`` logits and cross-entropy, or, on a
      ``"binary"`` ``task``, one logit and the logistic loss, else one output and the squared loss;
    * a network of :data:`dpopt.models.NETWORKS`: :func:`classifier_oracle` in chunks of
      ``microbatch_size`` records, with the network's ``options`` (:func:`dpopt.models.make_model`).
    """
    _validate.one_of("model", model, MODELS)
    if model in GLMS:
        return make(model, torch.as_tensor(X), torch.as_tensor(y), reg=reg)
    if model == MLP:
        return mlp_oracle(X, y, classes=classes, loss=logistic_loss if task == "binary" else None)
    return classifier_oracle(model, X, y, microbatch_size=microbatch_size, loss=cross_entropy, **options)


def classifier_oracle(model: str, X: Records, y: Records, *, microbatch_size: int,
                      loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy, **options: JsonValue) -> TorchModel:
    """The per-record ``loss`` (default cross-entropy) of ``make_model(model, seed=0, **options)``
    on float32 rows ``X``, labels ``y``."""
    activation = options.pop("activation", None)  # the one option make_model names (a string)
    if activation is not None and not isinstance(activation, str):
        raise _validate.DpoptError(f"activation={activation!r} must be the name of an activation")
    return TorchModel(make_model(model, seed=0, activation=activation, **options), loss,
                      torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y), microbatch_size=microbatch_size)


def metric_of(model: str, oracle: Scored, X: Records, y: Records, *,
                  task: str = "regression") -> Callable[[Tensor], float]:
    """θ ↦ the test metric of ``model``'s ``oracle`` on the records ``(X, y)``: for the MLP on a
    regression task the mean squared loss, (f(x) − y)² averaged over the records; otherwise the
    oracle's ``error`` (a misclassification rate, or a GLM's regression error)."""
    if model == MLP and task == "regression":
        test = mlp_oracle(X, y)
        return lambda theta: float(test.loss(theta))
    X_test, y_test = torch.as_tensor(X), torch.as_tensor(y)
    return lambda theta: float(oracle.error(theta, X_test, y_test))


def fits(model: str, dataset: Dataset) -> None:
    """``model`` must be able to learn ``dataset``'s task (:data:`TASKS`)."""
    needed = TASKS[_validate.one_of("model", model, MODELS)]
    if dataset.task not in needed:
        raise _validate.DpoptError(f"dataset={dataset.name!r} is a {dataset.task} task; model={model!r} "
                                   f"needs a {' or '.join(needed)} data set")


def private_entry(algorithm: str, epsilon: float | None = None) -> registry.Entry:
    """The registered ``algorithm`` (:func:`dpopt.algorithms.registry.entry`), refused if it is not
    private: its ε is ∞, so it cannot meet ``epsilon`` (any target)."""
    entry = registry.entry(algorithm)
    if not entry.private:
        target = "" if epsilon is None else f" and cannot meet epsilon={epsilon!r}"
        raise _validate.DpoptError(f"algorithm={algorithm!r} is not private (ε = ∞){target}: train it with "
                                   "dpopt.run as a non-private reference")
    return entry
