"""A module run on each record alone, with the ghost layers inside it tapped (see
:mod:`dpopt.oracles.ghost.stages`, "How layers are found").

:func:`run_block` runs a block (a module with its own forward) under ``torch.func.vmap``, each
record as a batch of one, so nothing in its forward can mix the records of a batch. Its ghost
layers (``Stage.inner``) stay ghost layers: forward hooks registered on them for one call and
removed in a ``finally`` (:class:`_Tap`) record each call's input and add a zero probe, an input
of the vmapped function, to its output; the loss's gradient with respect to a probe is that
call's output gradient. A block registered as acting per record runs once on the whole batch
instead (:func:`_whole_batch`), where a call's output gradient is taken at the output itself.
:func:`_discover` finds the calls once per record shape and refuses a parameter that reaches the
output outside its layer's call; every later call is checked against them.

A ``block`` or ``isolated`` module that ``vmap`` cannot run (``.item()``, Python control flow
on tensor values, in-place writes to captured tensors, torch's fused recurrent kernels) raises
a :class:`~dpopt._validate.DpoptError` naming its path, at the first call.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from ... import _validate
from .stages import Calls, Stage, hooked


def _one_record(module: nn.Module, params: dict[str, Tensor], x: Tensor) -> Tensor:
    return functional_call(module, params, (x.unsqueeze(0),), tie_weights=False).squeeze(0)


def per_record(stage: Stage, params: dict[str, Tensor], x: Tensor, shared: dict[str, Tensor] | None = None,
               tap: _Tap | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``stage.module`` on each record of ``x`` alone (``vmap``; ``params`` batched along dim 0
    with the records, or empty; ``shared`` the same for every record), so the records cannot
    interact whatever its forward does. With ``tap``, also the inputs of its ghost layers' calls,
    ``[B, *input per record]``, whose outputs are shifted by ``tap.probes`` (``[B, *output per
    record]`` zeros: the loss's gradient with respect to them is each call's output gradient)."""

    def one(ps: dict[str, Tensor], xi: Tensor, probes: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        if tap is None:
            return _one_record(stage.module, {**(shared or {}), **ps}, xi), ()
        with tap.recording(probes):
            return _one_record(stage.module, {**(shared or {}), **ps}, xi), tuple(tap.inputs)

    try:
        # attention by its math kernel, which vmap batches (the fused CPU kernel would run record by record)
        with sdpa_kernel(SDPBackend.MATH):
            return vmap(one, randomness="different")(params, x, tap.probes if tap is not None else ())
    except RuntimeError as error:
        why = ("has trainable parameters without a ghost rule" if stage.kind == "block" else
               "has no trainable parameters but is not known to act on each record on its own, so it might mix "
               "the records of a batch")
        known = ("" if stage.kind == "block" else
                 "; if its output for each record depends on that record alone, register it to run it on the whole "
                 f"batch: TorchModel(..., known_layers=dpopt.oracles.ghost.KNOWN_LAYERS.with_per_record("
                 f"{type(stage.module).__name__}))")
        raise _validate.DpoptError(
            f"engine='ghost' runs module {stage.path!r} ({type(stage.module).__name__}) on each record alone under "
            f"torch.func.vmap because it {why}, and vmap failed: {str(error).rstrip('. ')}. Write its forward with "
            "vmap-compatible operations (no .item() or Python branching on tensor values, no in-place writes to "
            f"tensors it does not own){known}") from error


class _Tap:
    """Scoped forward hooks on a block's ghost layers (``stage.inner``), registered by
    :meth:`hooked` and removed when it exits: each call's input is recorded and its output
    shifted by a probe; the calls must be those of ``expected`` (None: record them, and cut each
    output from its layer's parameters: :func:`_discover`)."""

    def __init__(self, stage: Stage, expected: tuple | None, probes: tuple[Tensor, ...], whole_batch: bool = False
                 ) -> None:
        self.stage, self.expected, self.probes, self.whole_batch = stage, expected, probes, whole_batch
        self.index = {id(inner.module): k for k, inner in enumerate(stage.inner)}
        self.inputs: list[Tensor] = []
        #: on the whole batch: each call's gradient target (its output where its rows are the records, else
        #: its probe) and the output's version counter when it was tapped (None for a probe)
        self.at_outputs = whole_batch
        self.targets: list[Tensor] = []
        self.versions: list[int | None] = []
        self.calls: list[tuple[int, tuple[int, ...], torch.dtype]] = []
        self._current: tuple[Tensor, ...] = ()

    @contextmanager
    def hooked(self) -> Iterator[_Tap]:
        handles = [inner.module.register_forward_hook(self._hook) for inner in self.stage.inner]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def recording(self, probes: tuple[Tensor, ...]) -> Iterator[_Tap]:
        self.inputs, self.calls, self._current, self.targets, self.versions = [], [], probes, [], []
        yield self

    def written_in_place(self) -> bool:
        """Whether the forward wrote in place into a tapped output after its call (its gradient
        would then be that of the value written, not of the call's output)."""
        return any(v is not None and t._version != v for t, v in zip(self.targets, self.versions))

    def _hook(self, module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        k, n = self.index[id(module)], len(self.inputs)
        if self.expected is not None and (n >= len(self.expected) or self.expected[n][0] != k):
            raise _validate.DpoptError(
                f"engine='ghost': module {self.stage.path!r} called its layers in another order than on the records "
                f"it was first traced with (call {n + 1} is {self.stage.inner[k].path!r}): its forward branches on "
                "the data; use engine='vmap'")
        if len(args) != 1 or not isinstance(out, Tensor):
            raise _validate.DpoptError(f"engine='ghost' taps layer {self.stage.inner[k].path!r} by its one input "
                                       "tensor and its output tensor; it was called otherwise: use engine='vmap'")
        if self.whole_batch:  # the batch's call: [B, *rest] where each record's was [1, *rest], or [1, *rest]
            probe = self._current[n][:, 0]  # for an input all records share (e.g. position ids)
            if out.shape[1:] != probe.shape[1:] or out.shape[0] not in (1, len(probe)):
                alone = tuple(self._current[n].shape[1:])
                raise _validate.DpoptError(
                    f"engine='ghost': layer {self.stage.inner[k].path!r} gave an output of shape {tuple(out.shape)} on "
                    f"the whole batch where each record's was {alone}, so its rows are not the records; use "
                    "engine='vmap'")
            self.inputs.append(args[0].expand(len(probe), *args[0].shape[1:]).unsqueeze(1))
            if self.at_outputs and out.shape[0] == len(probe):  # its rows are the records: its own gradient
                self.targets.append(out)
                self.versions.append(out._version)
                return out
            self.targets.append(self._current[n])
            self.versions.append(None)
            return out + probe
        self.calls.append((k, tuple(out.shape), out.dtype))
        self.inputs.append(args[0])
        return out.detach() if self.expected is None else out + self._current[n]


def _discover(stage: Stage, shared: dict[str, Tensor], params: dict[str, Tensor], x: Tensor
              ) -> tuple[Stage, tuple]:
    """The stage to run and the calls its forward makes to its ghost layers on one record shaped
    like those of ``x`` (cached per shape).

    Found by running the forward on the first record with every call's output cut from its
    layer's parameters: a parameter that still reaches the output or a tapped call's input is
    used outside its layer's call (e.g. ``nn.MultiheadAttention`` reads ``out_proj.weight``
    without calling ``out_proj``), where the layer's rule would miss it. Such layers leave the
    tapped set and join the block's own parameters, whose per-record gradients vmap gives: the
    stage returned is then that block, discovered anew."""
    key = (tuple(x.shape[1:]), x.dtype)
    if key in stage.calls.by_shape:
        return stage.calls.by_shape[key]
    leaves = {name: t.detach().requires_grad_(True) for name, t in shared.items()}
    tap = _Tap(stage, None, ())
    with torch.enable_grad(), tap.hooked():
        out, inputs = per_record(stage, {k: v[:1].detach() for k, v in params.items()}, x[:1], leaves, tap)
        ends = [t for t in (out, *inputs) if t.requires_grad]
        reached = (torch.autograd.grad(functools.reduce(operator.add, (t.sum() for t in ends)),
                                       list(leaves.values()), allow_unused=True)
                   if ends else [None] * len(leaves))
    owner = {alias: k for k, inner in enumerate(stage.inner) for aliases in inner.aliases for alias in aliases}
    bypassed = {owner[name] for name, grad in zip(leaves, reached) if grad is not None}
    if not bypassed:
        return stage.calls.remember(key, (stage, tuple(tap.calls)))
    moved = [inner for k, inner in enumerate(stage.inner) if k in bypassed]
    block = replace(stage, names=(*stage.names, *((aliases[0], theta) for inner in moved
                                                  for (_, theta), aliases in zip(inner.names, inner.aliases))),
                    aliases=(*stage.aliases, *(a for inner in moved for a in inner.aliases)),
                    inner=tuple(inner for k, inner in enumerate(stage.inner) if k not in bypassed), calls=Calls())
    return stage.calls.remember(key, (block, ()))


def run_block(stage: Stage, views: dict[str, Tensor], x: Tensor, taps: bool) -> tuple[Tensor, tuple]:
    """A block on each record alone: its output and ``(the stage run, its expanded parameters,
    calls, inputs, probes)``; the stage run is ``stage`` less the layers :func:`_discover` found
    used outside their calls."""
    for inner in stage.inner if taps else ():
        if hooked(inner.module):
            raise _validate.DpoptError(f"engine='ghost': layer {inner.path!r} has hooks registered after the "
                                       "oracle was made; make the oracle again (a hooked layer runs per record)")
    expanded, every, shared = _parameters(stage, views, x)
    if taps and stage.inner:
        run, calls = _discover(stage, shared, every, x)
        if run is not stage:
            return run_block(run, views, x, taps)
    whole = stage.whole_batch and not stage.names and (not taps or all(shape[:1] == (1,) for _, shape, _ in calls))
    if not (taps and stage.inner):
        out = _whole_batch(stage, shared, x) if whole else per_record(stage, every, x, shared)[0]
        return out, (stage, expanded, (), (), ())
    probes = tuple(_probe((len(x), *shape), dtype, x.device) for _, shape, dtype in calls)
    tap = _Tap(stage, calls, probes, whole)
    with tap.hooked():
        if whole:
            out = _whole_batch(stage, shared, x, tap)
            if tap.written_in_place():  # run again, every call shifted by its probe
                tap.at_outputs = False
                out = _whole_batch(stage, shared, x, tap)
            inputs, targets = tuple(tap.inputs), tuple(tap.targets)
        else:
            (out, inputs), targets = per_record(stage, every, x, shared, tap), probes
    if len(inputs) != len(calls):
        raise _validate.DpoptError(f"engine='ghost': module {stage.path!r} called fewer of its layers than on the "
                                   "records it was first traced with: its forward branches on the data; use "
                                   "engine='vmap'")
    return out, (stage, expanded, calls, inputs, targets)


def _whole_batch(stage: Stage, shared: dict[str, Tensor], x: Tensor, tap: _Tap | None = None) -> Tensor:
    """A block registered to act on each record on its own, with no parameters but its tapped ghost
    layers', run once on the whole batch ``x``: the ops of a non-private step, with no per-record copy.
    Its ghost layers' calls are tapped as under vmap, each call's input seen as ``[B, 1, *rest]``; the
    gradient of a call whose output rows are the records is taken at that output itself (no probe
    added: it is each record's output gradient, as the records do not mix), of a call on an input all
    records share (``[1, *rest]``) at its probe."""
    if tap is None:
        return functional_call(stage.module, shared, (x,), tie_weights=False)
    with tap.recording(tap.probes):
        return functional_call(stage.module, shared, (x,), tie_weights=False)


def _probe(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A zero probe of ``shape``: one zero expanded (no memory written), so adding it costs a read
    of the output only. The loss's gradient with respect to it is still the full ``[B, *output
    per record]`` gradient of the call's output (autograd returns the gradient arriving at the
    expanded tensor, not the one summed into the scalar)."""
    return torch.zeros((), dtype=dtype, device=device, requires_grad=True).expand(shape)


def _parameters(stage: Stage, views: dict[str, Tensor], x: Tensor
                ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """A block's own parameters expanded to one copy per record (by local name, and by every
    alias), and its ghost layers' parameters, shared by all records (by alias)."""
    expanded = {local: views[name].expand(len(x), *views[name].shape) for local, name in stage.names}
    every = {alias: expanded[local] for (local, _), aliases in zip(stage.names, stage.aliases) for alias in aliases}
    shared = {alias: views[name] for inner in stage.inner
              for (_, name), aliases in zip(inner.names, inner.aliases) for alias in aliases}
    return expanded, every, shared
