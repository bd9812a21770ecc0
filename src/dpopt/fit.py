"""``dpopt.fit``: private training of a PyTorch module in one call.

    history = dpopt.fit(model, loss_fn, train_data, algorithm="dp-srm", epsilon=3.0, delta=1e-5,
                        epochs=5, batch_size=256, lr=0.5)

A thin loop over :class:`dpopt.Private` with the algorithm's own update: ``train_data`` (a
map-style Dataset of ``(x, y)`` pairs read lazily by index, a tuple ``(X, y)`` of tensors, or a
DataLoader whose dataset, ``collate_fn`` and workers load the batches, with ``split``),
the calibration to (ε, δ) for the steps ``epochs`` implies, the batches, the releases and the
ledger are the Private object's; the loop is :func:`dpopt.train.drive`, the loop of
:func:`dpopt.run` (log points, checkpoints, History). Training starts from the module's current
parameters, and the output θ is written back into the module.

Nothing is measured on the training data unless ``diagnostics=True`` (then on
``diagnostic_sample`` records, and each log point's ``train_loss``, labelled NOT PRIVATE). The
private log points (ε and, with
``test_data``, the test error, measured with the module in eval mode) come once per epoch
unless ``log_every`` says otherwise. Progress is shown on standard error: a bar on a terminal, else a line every 10 s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from . import _validate
from .building import private_entry
from .oracles import TorchModel, ghost, records
from .private import Private
from .train import DIAGNOSTIC_SAMPLE, History, Options, drive

#: Test records classified per forward pass.
TEST_CHUNK = 4096


def test_error(oracle: TorchModel, data: Dataset | tuple[Tensor, Tensor]) -> Callable[[Tensor], float]:
    """θ ↦ the classification error (:meth:`TorchModel.error`) on ``data``, with the module in
    eval mode (dropout off) and put back in the mode it was in."""
    test = records.of(data, name="test_data")

    def error(theta: Tensor) -> float:
        was_training = oracle.module.training
        oracle.module.eval()
        try:
            wrong = sum(oracle.error(theta, *test.gather(part)) * len(part)
                        for part in torch.arange(len(test)).split(TEST_CHUNK))
        finally:
            oracle.module.train(was_training)
        return wrong / len(test)

    return error


def fit(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor],
        train_data: Dataset | DataLoader | tuple[Tensor, Tensor],
        *, algorithm: str = "dp-sgd", epsilon: float, delta: float, epochs: float, batch_size: int = 256,
        lr: float = 0.1, clip: float = 1.0, seed: int | None = None, accountant: str = "pld", engine: str = "ghost",
        microbatch_size: int = 512, known_layers: ghost.Registry = ghost.KNOWN_LAYERS,
        test_data: Dataset | tuple[Tensor, Tensor] | None = None,
        log_every: int | None = None, checkpoint_path: str | Path | None = None,
        checkpoint_every: int | None = None, progress: bool | None = None, diagnostics: bool = False,
        train_metrics: bool = True, diagnostic_sample: int | None = DIAGNOSTIC_SAMPLE,
        allow_large_delta: bool = False, split: Callable[..., tuple[Tensor, Tensor]] | None = None,
        **options: Any) -> History:
    """Train ``model`` with ``algorithm`` at (``epsilon``, ``delta``) for ``epochs`` passes.

    ``options`` are more hyper-parameters of the algorithm by name (the fields of its parameter
    dataclass, :mod:`dpopt.algorithms.params`: ``clip_diff``, ``gamma``, ``sampling``, ``radius``,
    ``obj_clip``, …). Randomness comes from the operating system unless
    ``seed`` is given (see :func:`dpopt.run`). ``log_every``: steps between log points (default:
    one per epoch). ``diagnostics=True``: the non-private diagnostics of :func:`dpopt.run`, the
    training objective and gradient norm on ``diagnostic_sample`` records (None: all) unless
    ``train_metrics=False``, and ``train_loss``, the mean training loss of the batch of the step
    just taken (:meth:`dpopt.Private.diagnostics`). ``known_layers``: the ghost engine's layer registry
    (:data:`dpopt.oracles.KNOWN_LAYERS` extended with ``.with_per_record(MyLayer)``). ``progress``:
    None or True shows it (a bar on a terminal, else a line every 10 s), False hides it.
    ``allow_large_delta``: accept δ ≥ 1/n, ``split``: (x, y) of a
    DataLoader's batch (see :class:`dpopt.Private`).
    Returns the run's History (its ``final`` holds the guarantee ε and, with ``test_data``, the
    test error); the module holds the output θ.
    """
    private_entry(algorithm, epsilon)
    _validate.positive("epsilon", epsilon)
    _validate.open_unit("delta", delta)
    _validate.positive("epochs", epochs)
    private = Private(model, loss_fn, train_data, algorithm=algorithm, epsilon=epsilon, delta=delta, epochs=epochs,
                      batch_size=batch_size, lr=lr, clip=clip, seed=seed, accountant=accountant, engine=engine,
                      microbatch_size=microbatch_size, known_layers=known_layers, allow_large_delta=allow_large_delta,
                      split=split, **options)
    if log_every is None:
        log_every = max(1, round(private.steps / epochs))
    run_options = Options(seed=seed, test_error=None if test_data is None else test_error(private.oracle, test_data),
                          log_every=log_every, checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
                          progress=progress, diagnostics=diagnostics, train_metrics=train_metrics,
                          diagnostic_sample=diagnostic_sample,
                          log_metrics=lambda theta: {"train_loss": private.diagnostics()["train_loss"]})
    history = drive(private.stepper, run_options, private.theta0)
    private.oracle.load(history.theta)
    return history
