"""The plan of a module's forward for the ghost engine: its stages, and the layer types it knows.

How layers are found, and why each record's gradient is its own (nothing is left on the user's
module: no persistent hook, no attribute, no monkey-patching).
:func:`plan` walks the module: an ``nn.Sequential`` (whose forward is not overridden) is opened
and its children are run by the engine's own functional forward (:mod:`.functional`), one stage
after another.
Each child is looked up in a :class:`Registry` of layer types whose per-record structure is
known (:data:`KNOWN_LAYERS`; imitating Opacus's ``GRAD_SAMPLERS`` as an extension point, but
an immutable object passed to the oracle, ``TorchModel(..., known_layers=...)``, not a global
table): the class itself or the nearest registered base class whose ``forward`` it keeps, and
only if that entry's condition holds (e.g. ``nn.Flatten`` with ``start_dim ≥ 1``, an Embedding
without ``max_norm`` or ``scale_grad_by_freq``). Then the child is

* a ghost layer (:data:`GHOST_KINDS`: ``nn.Linear`` and transformers' ``Conv1D``; ``nn.Conv2d``/``nn.Conv1d`` with zero
  padding; ``nn.Embedding``; ``nn.LayerNorm``; ``nn.GroupNorm``; ``weight``/``bias`` not
  parametrized) with trainable parameters: computed here with its functional form (``F.linear``,
  ``F.conv2d``, …) on views of θ, after a check that its input has the rank at which the layer
  acts within each record (``functional._functional``: a Linear on a 1-D batch would act across the
  records); the outputs are kept and ``torch.autograd.grad`` w.r.t. those outputs gives every
  ``g`` in one backward (which skips the weight-gradient products: only ``∂ℓ/∂s`` is asked for);
* ``block``: any other module with trainable parameters (a container with its own forward, the
  whole model if it is not a Sequential, a custom layer, a padded convolution): run on each
  record alone under ``vmap`` (or, registered as acting per record and holding no trainable
  parameter outside its ghost layers, once on the whole batch: ``Stage.whole_batch``)
  (:mod:`.blocks`; each record as a batch of one, as the vmap engine
  does), its own parameters expanded to one copy per record so that the same backward
  returns their per-record gradients ``[B, *shape]``. The ghost layers inside it, at any depth
  (:func:`_inner`), keep their ghost rules: forward hooks registered on them for the one call
  and removed in a ``finally`` record each call's input and add to its output a
  zero "probe" tensor, an input of the vmapped function, whose gradient is the call's output
  gradient ``g``. Attention by ``F.scaled_dot_product_attention`` runs its math kernel there
  (batched by vmap; the fused CPU kernel has no vmap rule);
* ``plain``: no trainable parameters and known to act on each record on its own (activations,
  pooling, ``Flatten``/``Unflatten`` that keep dim 0, ``Identity``, dropout, softmax over a
  dim ≥ 1, upsampling, a ghost layer without trainable parameters; or a registered layer) and no
  hooks: called on the whole batch as is, except ``nn.MaxPool2d`` on a ≥ 16-channel NCHW input,
  run with PyTorch's own kernel in channels-last layout (the same values, argmax and gradients,
  see :func:`.functional.run_plain`);
* ``isolated``: no trainable parameters and not known (a custom layer, padding, anything with
  hooks): run on each record alone under ``vmap``, like a block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ... import _validate
from ..per_record import SqueezeLast


def hooked(module: nn.Module) -> bool:
    """Whether ``module`` has hooks registered (a hook might mix the records of a batch)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


class Calls:
    """The calls a block makes to its ghost layers on records of one shape, found once per shape
    (``blocks._discover``) and then checked at every call: ``by_shape[(shape, dtype)]`` is the stage to run
    and a tuple of ``(index into Stage.inner, output shape per record, output dtype)``. Owned by its stage,
    bounded to :data:`SHAPES` shapes."""

    SHAPES = 8

    def __init__(self) -> None:
        self.by_shape: dict[tuple, tuple[Stage, tuple[tuple[int, tuple[int, ...], torch.dtype], ...]]] = {}

    def remember(self, key: tuple, calls: tuple) -> tuple:
        if len(self.by_shape) >= self.SHAPES:
            self.by_shape.pop(next(iter(self.by_shape)))
        self.by_shape[key] = calls
        return calls


#: Stage kinds with a ghost rule: per-record norms and sums from a layer's input and output gradient.
GHOST_KINDS = ("linear", "linear_t", "conv", "embedding", "layernorm", "groupnorm", "rmsnorm")
#: The Linear rule's kinds: ``"linear_t"`` is a Linear whose weight is stored transposed, ``[in, out]``
#: (transformers' ``Conv1D``: ``y = x W + b``), so its records' gradients ``Σ_t a_t g_tᵀ`` are those of
#: the Linear rule transposed, with the same norms.
LINEAR_KINDS = ("linear", "linear_t")


@dataclass(frozen=True)
class Stage:
    """One step of the functional forward; ``names`` pairs each trainable parameter's name in
    ``module`` with its name in θ. ``kind``: one of :data:`GHOST_KINDS` (a ghost rule), "block"
    (other trainable parameters: run on each record alone under vmap, its own parameters'
    per-record gradients dense, the ghost layers inside it, ``inner``, tapped by scoped hooks),
    "plain" (no trainable parameters, known to act on each record on its own: called on the whole
    batch) or "isolated" (no trainable parameters, not known: called on each record alone under
    vmap). An inner stage's ``aliases`` are its parameters' names in the block's module."""

    kind: str
    module: nn.Module
    path: str
    names: tuple[tuple[str, str], ...]
    aliases: tuple[tuple[str, ...], ...] = ()   # per parameter: every local name that holds it
    inner: tuple[Stage, ...] = ()
    calls: Calls = field(default_factory=Calls, compare=False, repr=False)
    #: a block known to act on each record on its own (registered "plain"): once every trainable
    #: parameter it holds is in a tapped ghost layer, it runs on the whole batch (``blocks.run_block``)
    whole_batch: bool = False


def parameter_names(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each distinct parameter's first name → the names of every module attribute holding it.

    ``functional_call`` must be given every such name with ``tie_weights=False``: with the
    default tying, a module reachable by two paths is swapped twice and restored in the wrong
    order, which leaves the passed tensor inside the module (PyTorch 2.13)."""
    names: dict[str, list[str]] = {}
    first: dict[int, str] = {}
    owners: set[tuple[int, str]] = set()
    for name, param in module.named_parameters(remove_duplicate=False):
        prefix, _, attr = name.rpartition(".")
        owner = (id(module.get_submodule(prefix)), attr)
        if owner not in owners:
            owners.add(owner)
            names.setdefault(first.setdefault(id(param), name), []).append(name)
    return {name: tuple(aliases) for name, aliases in names.items()}


# ------------------------------------------------------------------------------ the registry


Condition = Callable[[nn.Module], bool]


def _always(module: nn.Module) -> bool:
    return True


def _zero_padding(conv: nn.Module) -> bool:
    """A Conv2d whose padding the im2col rule reproduces: zeros, explicit sizes or "valid"."""
    return conv.padding_mode == "zeros" and (not isinstance(conv.padding, str) or conv.padding == "valid")


def _from_dim_1(attribute: str) -> Condition:
    """Instances whose dimension ``attribute`` is ≥ 1: they never act along dim 0, the records
    (a negative or missing dimension can mean dim 0 for some input rank)."""

    def when(module: nn.Module) -> bool:
        dim = getattr(module, attribute)
        return isinstance(dim, int) and dim >= 1

    return when


@dataclass(frozen=True)
class Known:
    """A layer type whose per-record structure is known: its stage ``kind`` (one of
    :data:`GHOST_KINDS`, or "plain": acts on each record on its own) for the instances for which
    ``when`` holds."""

    layer: type[nn.Module] | str   # a class, or the qualified name of a class of an optional package
    kind: str
    when: Condition = _always


@dataclass(frozen=True)
class Registry:
    """The layer types the ghost engine knows (an immutable value: extend it with
    :meth:`with_per_record` and pass it to ``TorchModel(..., known_layers=...)``).

    A module's entry is that of its class or of the nearest registered base class, provided
    the module keeps that class's ``forward``. A module with trainable parameters and no ghost
    rule is a vmap ``block``; one without trainable parameters is called on the whole batch
    only if its entry says "plain", else on each record alone (``isolated``)."""

    entries: tuple[Known, ...]

    def kind(self, module: nn.Module) -> str | None:
        """The known ``kind`` of ``module``, or None."""
        by_type = {entry.layer: entry for entry in self.entries}  # later entries win
        for cls in type(module).__mro__:
            entry = by_type.get(cls) or by_type.get(f"{cls.__module__}.{cls.__qualname__}")
            if entry is not None:
                same = type(module).forward is getattr(cls, "forward", None)
                return entry.kind if same and entry.when(module) else None
        return None

    def with_per_record(self, layer: type[nn.Module], when: Condition = _always) -> Registry:
        """This registry with ``layer`` known to act on each record on its own, for the instances
        for which ``when(module)`` holds: without trainable parameters, it is then called on the
        whole batch; with trainable parameters all in ghost layers inside it, it runs once on the
        whole batch with those layers tapped (else per record, its own parameters' gradients dense).
        Register only a layer whose output for record i depends on record i alone
        (and on data-independent randomness): one that mixes records (a batch mean, BatchNorm,
        attention across dim 0) would let a record move the others' gradients, which clipping
        does not bound. Unregistered layers are run per record under vmap: correct, only slower."""
        return Registry((*self.entries, Known(layer, "plain", when)))


#: Parameter-free layers that act on each record on its own, whatever their input's rank.
_PER_RECORD = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Sigmoid,
    nn.Tanh, nn.Softplus, nn.Softsign, nn.Softshrink, nn.Hardshrink, nn.Tanhshrink, nn.Hardtanh, nn.Hardsigmoid,
    nn.Hardswish, nn.LogSigmoid, nn.Threshold,
    # pooling and upsampling act on the trailing spatial dims and refuse inputs without a leading one
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.LPPool1d, nn.LPPool2d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d, nn.Upsample,
)

def _plain_embedding(embedding: nn.Module) -> bool:
    """An Embedding without ``max_norm`` (which rewrites the table in place during the forward) nor
    ``scale_grad_by_freq`` (which scales a record's gradient by counts over the whole batch)."""
    return embedding.max_norm is None and not embedding.scale_grad_by_freq


#: transformers' ``Conv1D`` (GPT-2's layers), known by name so that dpopt never imports transformers.
CONV1D = "transformers.pytorch_utils.Conv1D"
#: transformers' RMSNorm layers whose forward is Llama's, ``y = w ⊙ rms_normalised(x)`` (known by name;
#: ``tests/test_hf_whole_batch.py`` checks that their forwards are one source).
RMSNORMS = tuple(f"transformers.models.{module}.modeling_{module}.{prefix}RMSNorm" for module, prefix in (
    ("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("phi3", "Phi3")))
#: dpopt's Hugging Face bridge (:class:`dpopt.oracles.hf.Adapted`), by name (it lives above this module).
ADAPTED = "dpopt.oracles.hf.Adapted"


def rms_normalised(x: Tensor, eps: float) -> Tensor:
    """Llama's RMS normalisation over the last dim, ``x / sqrt(mean(x²) + eps)`` computed in float32
    (whatever x's dtype, as transformers does) and cast back to x's dtype: the ``x̂`` of an RMSNorm
    layer ``y = w ⊙ x̂``, whose per-record weight gradient is ``Σ_t g_t ⊙ x̂_t``."""
    h = x.to(torch.float32)
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _declares_whole_batch(module: nn.Module) -> bool:
    """An :class:`~dpopt.oracles.hf.Adapted` model of an architecture whose records dpopt's tests hold
    independent on the whole batch (its ``whole_batch``)."""
    return getattr(module, "whole_batch", False) is True

#: The layers the ghost engine knows by default.
KNOWN_LAYERS = Registry((
    Known(nn.Linear, "linear"),
    Known(CONV1D, "linear_t"),
    Known(nn.Conv2d, "conv", _zero_padding),
    Known(nn.Conv1d, "conv", _zero_padding),
    Known(nn.Embedding, "embedding", _plain_embedding),
    Known(nn.LayerNorm, "layernorm"),
    Known(nn.GroupNorm, "groupnorm"),
    *(Known(name, "rmsnorm") for name in RMSNORMS),
    Known(ADAPTED, "plain", _declares_whole_batch),
    *(Known(layer, "plain") for layer in _PER_RECORD),
    Known(nn.Flatten, "plain", _from_dim_1("start_dim")),
    Known(SqueezeLast, "plain"),
    Known(nn.Unflatten, "plain", _from_dim_1("dim")),
    *(Known(layer, "plain", _from_dim_1("dim")) for layer in (nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU)),
))


# ------------------------------------------------------------------------------ the plan


def _opens(module: nn.Module) -> bool:
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def _trainable(m: nn.Module, theta_names: dict[int, str], parent: nn.Module | None = None
               ) -> tuple[tuple[tuple[str, str], ...], dict[str, tuple[str, ...]]]:
    """``((local name, θ name), ...)`` of ``m``'s trainable parameters and each one's aliases, the
    names of every attribute holding it, in ``parent`` (default ``m``)."""
    params = dict(m.named_parameters())
    local = {name: aliases for name, aliases in parameter_names(m).items() if id(params[name]) in theta_names}
    names = tuple((name, theta_names[id(params[name])]) for name in local)
    if parent is None:
        return names, local
    of_parent = dict(parent.named_parameters())
    in_parent = {theta_names[id(of_parent[name])]: aliases for name, aliases in parameter_names(parent).items()
                 if id(of_parent[name]) in theta_names}
    return names, {name: in_parent[theta] for name, theta in names}


def _ghost_rule(m: nn.Module, local: dict, known: Registry) -> str | None:
    """``m``'s ghost rule: its registered kind if that has one and its trainable parameters are the
    plain ``weight``/``bias`` (not parametrized)."""
    rule = known.kind(m)
    return rule if rule in GHOST_KINDS and set(local) <= {"weight", "bias"} else None


def _inner(block: nn.Module, path: str, theta_names: dict[int, str], known: Registry) -> tuple[Stage, ...]:
    """The ghost layers inside ``block`` (any depth) with trainable parameters, no hooks of the
    user, and no parameter shared with another of them (tied layers stay in the block's vmap)."""
    inner = []
    for sub_path, sub in block.named_modules():
        if sub is block or hooked(sub):
            continue
        names, local = _trainable(sub, theta_names, block)
        if names and (rule := _ghost_rule(sub, local, known)):
            inner.append(Stage(rule, sub, f"{path}.{sub_path}" if path else sub_path, names, tuple(local.values())))
    counts = Counter(theta for stage in inner for _, theta in stage.names)
    return tuple(stage for stage in inner if all(counts[theta] == 1 for _, theta in stage.names))


def plan(module: nn.Module, theta_names: dict[int, str], known: Registry = KNOWN_LAYERS) -> tuple[Stage, ...]:
    """The stages of ``module``'s forward; ``theta_names`` maps ``id(parameter)`` to its θ name."""
    stages: list[Stage] = []

    def walk(m: nn.Module, path: str) -> None:
        if _opens(m):
            for name, child in m._modules.items():
                assert child is not None, f"module {path or '<model>'!r} has no module {name!r}"  # (forward fails too)
                walk(child, f"{path}.{name}" if path else name)
            return
        names, local = _trainable(m, theta_names)
        path = path or "<model>"
        if not names:  # a known layer without trainable parameters acts on each record on its own too
            rule = known.kind(m)
            stages.append(Stage("isolated" if rule is None or (rule != "plain" and hooked(m)) else rule, m, path, ()))
        elif rule := _ghost_rule(m, local, known):
            stages.append(Stage(rule, m, path, names, tuple(local.values())))
        else:
            inner = _inner(m, "" if path == "<model>" else path, theta_names, known)
            tapped = {theta for stage in inner for _, theta in stage.names}
            own = tuple((name, theta) for name, theta in names if theta not in tapped)
            stages.append(Stage("block", m, path, own, tuple(local[name] for name, _ in own), inner,
                                whole_batch=known.kind(m) == "plain"))

    walk(module, "")
    counts = Counter(t for s in stages for inner in (s, *s.inner) for _, t in inner.names)
    shared = sorted(name for name, count in counts.items() if count > 1)
    if shared:
        raise _validate.DpoptError(
            f"engine='ghost' needs each parameter in one layer, but {', '.join(shared)} is used by several "
            "(tied weights or a module used twice): its per-record gradient is a sum over layers whose ghost "
            "norms do not add up; use engine='vmap'")
    return tuple(stages)


def describe(stages: tuple[Stage, ...]) -> list[tuple[str, str]]:
    """``(path, rule)`` of each stage not called on the whole batch as is: "ghost" (a layer with
    a ghost rule, also inside a block), "vmap" (a block, or a parameter-free module run per record)
    or "whole batch" (a block known to act per record, all of whose trainable parameters are in its
    ghost layers: run once on the batch, its ghost layers tapped)."""
    rules = []
    for s in stages:
        if s.kind in GHOST_KINDS:
            rules += [(s.path, "ghost")] if s.names else []
        elif s.kind != "plain":
            whole = s.kind == "block" and s.whole_batch and not s.names
            rules += [(s.path, "whole batch" if whole else "vmap"), *((inner.path, "ghost") for inner in s.inner)]
    return rules
