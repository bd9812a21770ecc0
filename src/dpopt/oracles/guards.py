"""What :class:`~dpopt.oracles.torch_model.TorchModel` refuses to train, and why: what would let one
record reach another's clipped gradient, or leave un-noised statistics of the training data in the
module.

Modules with BatchNorm are refused: it mixes the records of a batch, so per-record clipping
would not bound a record's influence. So are torch's recurrent layers (``nn.RNN``, ``nn.LSTM``,
``nn.GRU`` and their cells): their fused kernels have no complete ``vmap`` rule, so neither
engine can keep records apart in them; a recurrence written with ``nn.Linear`` layers in a
module of one's own works under both. So are layers with ``track_running_stats=True``
(InstanceNorm's option): their forward writes running statistics of the training inputs into the
module's buffers, without noise. Beyond those, every computation that runs the module compares
its buffers before and after: a change (a running statistic of one's own, even a count of calls)
is refused, the buffers restored, so nothing of the training data stays in the module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _validate


def reject_batch_norm(module: nn.Module) -> None:
    """Raise :class:`DpoptError` if ``module`` contains a BatchNorm layer, saying why and what to use."""
    for name, m in module.named_modules():
        if isinstance(m, _BatchNorm):
            raise _validate.DpoptError(
                f"module={name or type(module).__name__!r} is {type(m).__name__}, which cannot be trained with "
                "differential privacy: BatchNorm normalises each record with the statistics of its whole batch, so one "
                "record's gradient depends on the other records in the batch and clipping each record's gradient no "
                "longer bounds its influence (the sensitivity). Use nn.GroupNorm instead (e.g. nn.GroupNorm(G, C), G "
                "the largest divisor of C up to 32), or nn.LayerNorm / nn.InstanceNorm2d: they normalise each record "
                "on its own; dpopt.fix(model) returns a copy with every BatchNorm replaced by GroupNorm")


def reject_recurrent(module: nn.Module) -> None:
    """Raise :class:`DpoptError` if ``module`` contains one of torch's recurrent layers, saying why
    and what to write instead."""
    for name, m in module.named_modules():
        if isinstance(m, (nn.RNNBase, nn.RNNCellBase)):
            raise _validate.DpoptError(
                f"module={name or type(module).__name__!r} is {type(m).__name__}, whose per-record gradients dpopt "
                "cannot compute: torch's fused recurrent kernels (nn.RNN, nn.LSTM, nn.GRU and their Cell versions) "
                "have no complete rule for torch.func.vmap, which both engines use to keep the records of a batch "
                "apart. Write the recurrence with nn.Linear layers and a loop over the time steps in a module of your "
                "own, as dpopt.nn's RNN, LSTM, GRU and their cells do (torch's arguments, parameter names and "
                "outputs): it runs under both engines; dpopt.fix(model) returns a copy with each of torch's recurrent "
                "layers replaced by dpopt.nn's, weights copied")


def reject_running_stats(module: nn.Module) -> None:
    """Raise :class:`DpoptError` if a layer of ``module`` tracks running statistics
    (``track_running_stats=True``: InstanceNorm's option, or a layer of one's own that follows
    torch's convention), saying why and what to use."""
    for name, m in module.named_modules():
        if getattr(m, "track_running_stats", False) is True:
            raise _validate.DpoptError(
                f"module={name or type(module).__name__!r} is {type(m).__name__} with track_running_stats=True, which "
                "cannot be trained with differential privacy: in training mode its forward writes a running mean and "
                "variance of the training inputs into the module's buffers, without noise (eval mode then normalises "
                "with them), so the trained module would carry statistics of the training data that no ε accounts "
                "for. Use track_running_stats=False (InstanceNorm's default: each record is normalised by its own "
                "statistics, in training and in evaluation), or nn.GroupNorm / nn.LayerNorm")


@contextlib.contextmanager
def unchanged_buffers(modules: tuple[tuple[str, nn.Module], ...]) -> Iterator[None]:
    """Run the block, then refuse (:class:`DpoptError`) a change of the buffers of ``modules``
    (``(path, module)`` pairs: a module's ``named_modules()``, walked once by the caller), after
    restoring them: a buffer that a forward pass on the training data writes (a running
    statistic, a count of calls) would keep un-noised information about the records in the
    module. A buffer changes if its values, shape or dtype change, or it is replaced, added or
    removed. Costs a copy and a comparison of the buffers per block (nothing without buffers)."""
    before = [(path, m, dict(m._buffers), {name: b.detach().clone() for name, b in m._buffers.items() if b is not None})
              for path, m in modules]
    try:
        yield
    finally:
        changed = [(path, m, name) for path, m, buffers, copies in before for name in _changed(m, buffers, copies)]
        if changed:
            _restore(before)
            path, m, name = changed[0]
            raise _validate.DpoptError(
                f"module={path or type(m).__name__!r} ({type(m).__name__}) changed its buffer "
                f"{f'{path}.{name}' if path else name!r} in a forward pass on the training data: a buffer written from "
                "the records (a running statistic, even a count of calls) would stay in the trained module without "
                "noise, which no ε accounts for. The buffers were restored; keep them constant in forward (a statistic "
                "the model needs: compute it from public data before training)")


def _changed(m: nn.Module, buffers: dict[str, Tensor | None], copies: dict[str, Tensor]) -> list[str]:
    """The names of ``m``'s own buffers that are not ``buffers`` (the same tensors) with the values
    of ``copies``: replaced, changed, added or removed."""
    names = [*buffers, *(name for name in m._buffers if name not in buffers)]
    return [name for name in names if m._buffers.get(name) is not buffers.get(name)
            or (name in copies and not _same(copies[name], buffers[name]))]


def _same(a: Tensor, b: Tensor | None) -> bool:
    """Equal shape, dtype and values (NaN where the other has NaN); never equal to None."""
    if b is None or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                 and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def _restore(before: list[tuple[str, nn.Module, dict[str, Tensor | None], dict[str, Tensor]]]) -> None:
    """Put back each module's buffers: the same tensor objects, with their old values."""
    with torch.no_grad():
        for _, m, buffers, copies in before:
            m._buffers.clear()
            m._buffers.update(buffers)
            for name, copy in copies.items():
                tensor = buffers[name]
                assert tensor is not None  # a copy is made of a tensor only
                if tensor.shape == copy.shape and tensor.dtype == copy.dtype:
                    tensor.copy_(copy)
                else:
                    tensor.set_(copy)  # type: ignore[call-overload]  # torch's stubs omit set_(Tensor)
