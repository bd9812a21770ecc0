"""``dpopt.fit``: private training of a PyTorch module in one call.

    history = dpopt.fit(model, loss_fn, train_data, algorithm="dp-srm", epsilon=3.0, delta=1e-5,
                        epochs=5, batch_size=256, lr=0.5)

``train_data`` is a ``torch.utils.data.Dataset`` of ``(x, y)`` pairs (or a tuple ``(X, y)`` of
tensors); it is read once into memory. ``loss_fn(output, target)`` must return one loss per
record (``reduction="none"``). The algorithm's noise is calibrated to (ε, δ) for the number of
steps ``epochs`` implies, training starts from the module's current parameters, and the output
θ is written back into the module. Everything else is :func:`dpopt.train.run`: Poisson batches
(random sizes, empty ones included, each step accounted), the ledger, checkpoints, History.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from . import _validate
from .accounting import calibrate
from .algorithms.by_name import NON_PRIVATE, build, steps_for_epochs
from .oracles import TorchModel
from .train import History, run


def as_tensors(data: Dataset | tuple[Tensor, Tensor], name: str = "train_data") -> tuple[Tensor, Tensor]:
    """``(X, y)`` stacked from a map-style Dataset of ``(x, y)`` pairs, or a pair of tensors."""
    if isinstance(data, tuple) and len(data) == 2:
        return torch.as_tensor(data[0]), torch.as_tensor(data[1])
    if not isinstance(data, Dataset) or not hasattr(data, "__len__"):
        raise _validate.DpoptError(f"{name} must be a map-style torch Dataset of (x, y) pairs or a tuple (X, y), "
                                   f"not {type(data).__name__}")
    if len(data) == 0:
        raise _validate.DpoptError(f"{name} is empty")
    pairs = [data[i] for i in range(len(data))]
    if not all(isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in pairs[:1]):
        raise _validate.DpoptError(f"{name}[0] must be an (x, y) pair")
    xs, ys = zip(*pairs)
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.stack([torch.as_tensor(y) for y in ys])


def fit(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], train_data: Dataset | tuple[Tensor, Tensor],
        *, algorithm: str = "dp-sgd", epsilon: float, delta: float, epochs: float, batch_size: int = 256,
        lr: float = 0.1, clip: float = 1.0, seed: int | None = None, accountant: str = "pld", engine: str = "ghost",
        microbatch_size: int = 512, test_data: Dataset | tuple[Tensor, Tensor] | None = None,
        checkpoint_path: str | Path | None = None, checkpoint_every: int | None = None,
        progress: bool = False, diagnostics: bool = False, **options: Any) -> History:
    """Train ``model`` with ``algorithm`` at (``epsilon``, ``delta``) for ``epochs`` passes.

    ``options`` go to :func:`dpopt.algorithms.by_name.build` (``clip_diff``, ``gamma``,
    ``sampling``, ``radius``, ``obj_clip``). Randomness comes from the operating system unless
    ``seed`` is given (see :func:`dpopt.run`). Returns the run's History (its ``final`` holds the
    guarantee ε and, with ``test_data``, the test error; non-private diagnostics only with
    ``diagnostics=True``, labelled); the module holds the output θ.
    """
    if algorithm in NON_PRIVATE:
        raise _validate.DpoptError(f"algorithm={algorithm!r} is not private (ε = ∞) and cannot meet epsilon={epsilon!r}: "
                                   "train it with dpopt.run as a non-private reference")
    _validate.positive("epsilon", epsilon)
    _validate.open_unit("delta", delta)
    _validate.positive("epochs", epochs)
    X, y = as_tensors(train_data)
    oracle = TorchModel(model, loss_fn, X, y, engine=engine, microbatch_size=microbatch_size)
    chosen = build(algorithm, n=oracle.n, batch_size=batch_size, lr=lr, clip=clip, **options)
    steps = steps_for_epochs(chosen, oracle.n, epochs)
    chosen = calibrate(chosen, epsilon=epsilon, delta=delta, n=oracle.n, steps=steps, accountant=accountant)
    test_error = None
    if test_data is not None:
        X_test, y_test = as_tensors(test_data, "test_data")
        test_error = lambda theta: oracle.error(theta, X_test, y_test)  # noqa: E731
    history = run(chosen, oracle, steps=steps, seed=seed, delta=delta, theta0=oracle.flat_params(),
                  accountant=accountant, test_error=test_error, checkpoint_path=checkpoint_path,
                  checkpoint_every=checkpoint_every, progress=progress, diagnostics=diagnostics)
    oracle.load(history.theta)
    return history
