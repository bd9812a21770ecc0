"""An image classifier as a reproduction :class:`Problem`: a network of :mod:`dpopt.models` with
per-record cross-entropy on flat rows, its test error, and its initial weights as θ0."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import Tensor

from ..building import classifier_oracle
from ..json_types import JsonValue
from ..models import cross_entropy
from ..train import History
from ._runner import Problem


def classifier_problem(model: str, X: np.ndarray, y: np.ndarray, X_test: np.ndarray, y_test: np.ndarray, *,
                       microbatch_size: int, train_metrics: bool = True,
                       history_metrics: Callable[[History], dict[str, float]] | None = None,
                       model_options: Mapping[str, JsonValue] | None = None,
                       loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy) -> Problem:
    """``make_model(model, seed=0, **model_options)`` on float32 rows ``X`` with the per-record
    ``loss`` (default cross-entropy; its test error on ``X_test``); θ0 = its initial
    weights (the same for every run: seeds vary batches and noise). With ``train_metrics=False``
    the logged points skip F and ‖∇F‖ (each a full pass over X) and F is measured once, at the
    output."""
    oracle = classifier_oracle(model, X, y, microbatch_size=microbatch_size, loss=loss, **(model_options or {}))
    X_test_t, y_test_t = torch.as_tensor(X_test, dtype=torch.float32), torch.as_tensor(y_test)

    def final_objective(theta: Tensor) -> dict[str, float]:
        return {"objective": float(oracle.loss(theta))}

    return Problem(oracle, lambda theta: oracle.error(theta, X_test_t, y_test_t),
                   extra_metrics=None if train_metrics else final_objective, history_metrics=history_metrics,
                   theta0=oracle.flat_params().double(), train_metrics=train_metrics)
