"""``dpopt.fix(model)``: a copy of a model with what the per-record engines refuse or mishandle
replaced by layers they handle, and the list of what was replaced.

    fixed, changes = dpopt.fix(model)   # model itself is not modified
    print(*changes, sep="\\n")

Like Opacus's ``ModuleValidator.fix``, but it returns a new module (a deep copy) and says what
it changed, one line per module, instead of editing the model silently. The rules:

* BatchNorm (``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``) normalises each record with the
  statistics of its batch, so a record's gradient depends on the other records and clipping no
  longer bounds its influence. It becomes ``nn.GroupNorm(G, C)``, which normalises each record on
  its own: G = the largest divisor of C that is at most 32 (GroupNorm's customary 32 groups,
  fewer when 32 does not divide C) for BatchNorm2d/3d and SyncBatchNorm; G = 1 for BatchNorm1d,
  whose input may be ``[B, C]`` features, where a group of one feature would normalise it to a
  constant (G = 1 normalises a record's features together, as LayerNorm does). ``eps``,
  ``affine`` and the affine weight and bias (γ, β, with their ``requires_grad``), dtype and
  device are copied; the running statistics are dropped.
* torch's ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their cells run fused kernels without a
  complete ``vmap`` rule: they become :mod:`dpopt.nn`'s modules of the same settings, parameters
  copied (same names and state dict).
* ``nn.InstanceNorm1d/2d/3d`` with ``track_running_stats=True`` updates its running statistics in
  place during the forward, which ``vmap`` cannot do per record (both engines fail), and those
  statistics would be computed from the training data without noise: it becomes the same layer
  without running statistics (it then normalises with each record's own statistics in eval
  mode too).
* an in-place activation or dropout of ``torch.nn`` (``nn.ReLU(inplace=True)``, ...) overwrites
  its input; the ghost engine keeps a layer's output to differentiate against, so one run on the
  output of a layer makes the engine refuse the model: it becomes its out-of-place form (the
  same values).

Nothing else changes: the copy keeps the model's other modules, parameters, ``requires_grad``
flags and training mode. What no rule covers is left as is (``TorchModel`` refuses it with its
reason).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.modules.lazy import LazyModuleMixin

from . import _validate
from .nn import recurrent

#: GroupNorm's customary number of groups, the most :func:`groups` chooses.
MAX_GROUPS = 32

Rule = Callable[[nn.Module], "tuple[nn.Module, str] | None"]


def groups(channels: int) -> int:
    """The largest divisor of ``channels`` that is at most :data:`MAX_GROUPS`."""
    return max(g for g in range(1, min(MAX_GROUPS, channels) + 1) if channels % g == 0)


def _batch_norm(m: nn.Module) -> tuple[nn.Module, str] | None:
    if not isinstance(m, _BatchNorm):
        return None
    channels = m.num_features
    count = 1 if isinstance(m, nn.BatchNorm1d) else groups(channels)
    like = m.running_mean if m.weight is None else m.weight
    norm = nn.GroupNorm(count, channels, eps=m.eps, affine=m.affine, bias=m.bias is not None,
                        **({} if like is None else {"device": like.device, "dtype": like.dtype}))
    copied = ["eps"]
    with torch.no_grad():
        for name in ("weight", "bias"):
            if (theirs := getattr(m, name)) is not None:
                getattr(norm, name).copy_(theirs).requires_grad_(theirs.requires_grad)
                copied.append(name)
    rule = ("1 group: BatchNorm1d's input may be [B, C] features" if count == 1 and channels > 1 else
            f"{count} = the largest divisor of {channels} that is at most {MAX_GROUPS}")
    copied_text = copied[0] if len(copied) == 1 else f"{', '.join(copied[:-1])} and {copied[-1]}"
    return norm, f"({rule}; {copied_text} copied, running statistics dropped): BatchNorm mixes the records of a batch"


def _recurrent(m: nn.Module) -> tuple[nn.Module, str] | None:
    if type(m) not in recurrent.REPLACEMENTS:
        return None
    return recurrent.from_torch(m), "(weights copied): torch's fused recurrent kernels have no per-record rule"


def _instance_norm(m: nn.Module) -> tuple[nn.Module, str] | None:
    if not (isinstance(m, _InstanceNorm) and m.track_running_stats):
        return None
    norm = copy.deepcopy(m)
    norm.track_running_stats = False
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        norm.register_buffer(name, None)
    return norm, ("(running statistics dropped): they are updated in place from the training data, which the "
                  "engines cannot do per record")


def _in_place(m: nn.Module) -> tuple[nn.Module, str] | None:
    if getattr(m, "inplace", False) is not True or not type(m).__module__.startswith("torch.nn."):
        return None
    out_of_place = copy.deepcopy(m)
    setattr(out_of_place, "inplace", False)  # a module attribute: nn.Module types it as a submodule
    return out_of_place, "(the same values): an in-place layer overwrites the output the ghost engine keeps"


RULES: tuple[Rule, ...] = (_batch_norm, _recurrent, _instance_norm, _in_place)


def fix(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """A copy of ``model`` with each module the engines refuse or mishandle replaced (the rules
    of :mod:`dpopt.fixing`), and one line per replacement: ``"path: old → new (how): why"``.
    ``model`` is not modified; a module reached by two paths is replaced once (one new module
    at both places)."""
    if not isinstance(model, nn.Module):
        raise _validate.DpoptError(f"model={type(model).__name__} must be a torch.nn.Module")
    for name, m in model.named_modules():
        # (torch types the method's self as its _LazyProtocol, which its own mixin does not declare)
        if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params():  # type: ignore[misc]
            raise _validate.DpoptError(f"module={name or type(model).__name__!r} ({type(m).__name__}) has "
                                       "uninitialised parameters: run one forward pass before dpopt.fix")
    fixed, changes = copy.deepcopy(model), []
    done: dict[int, nn.Module] = {}

    def replaced(m: nn.Module, path: str) -> nn.Module:
        if id(m) in done:
            return done[id(m)]
        for rule in RULES:
            if (result := rule(m)) is not None:
                new, how = result
                changes.append(f"{path or '<model>'}: {_name(m)} → {_name(new)} {how}")
                done[id(m)] = new
                return new
        done[id(m)] = m
        for name, child in list(m._modules.items()):
            if child is not None:
                setattr(m, name, replaced(child, f"{path}.{name}" if path else name))
        return m

    return replaced(fixed, ""), changes


def _name(m: nn.Module) -> str:
    """A module's one-line description, with its package for dpopt's (``dpopt.nn.LSTM(...)``)."""
    text = m.extra_repr().replace("\n", " ")
    package = "dpopt.nn." if type(m).__module__.startswith("dpopt.") else "nn."
    return f"{package}{type(m).__name__}({text})"
