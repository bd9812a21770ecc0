"""The "ghost" engine: per-record gradient norms and clipped sums without a ``[B, d]`` matrix.

For a layer ``s_t = W a_t + b`` applied at positions t = 1..T of one record (T = 1 for an MLP,
the sequence length for a Linear on ``[B, T, p]``, the number of output pixels for a
convolution seen on its unfolded patches), the record's gradient is ``∇_W ℓ_i = Σ_t g_t a_tᵀ``
and ``∇_b ℓ_i = Σ_t g_t`` with ``g_t = ∂ℓ_i/∂s_t``. Both are known from the layer's input
``a`` and output gradient ``g`` of one ordinary forward/backward, so (Li et al. 2022, "Large
language models can be strong differentially private learners", arXiv:2110.05679; Bu et al.
2022, "Scalable and efficient training of large convolutional neural networks with
differential privacy", arXiv:2205.10683, §4, the "mixed ghost norm"):

* ``‖∇_W ℓ_i‖² = ⟨a aᵀ, g gᵀ⟩`` (two T×T Gram matrices, formed in float64) when 2T² < p·q
  (and, below float64, when the rows would also outweigh the float64 copies of ``a`` and ``g``
  the Gram form makes: :func:`use_gram`), else ``‖Σ_t g_t a_tᵀ‖²`` with the ``[q, p]`` layer
  gradient of that record built directly (one batched matmul ``g_i [q, T] @ unfold(a_i)
  [T, p]``); for T = 1 it is ``‖a‖²‖g‖²`` (on the patch, per group, for a convolution). Conv2d
  is the Linear rule on ``unfold(a)`` (im2col, one ``gather``), per group.
* the clipped sum ``Σ_i w_i ∇ℓ_i`` is book-keeping (Bu et al. 2023, "Differentially private
  optimization on large model at small cost", arXiv:2210.00038): the weight-gradient products
  of a backward pass, ``Σ_i w_i g_iᵀ a_i`` per layer (``conv2d_weight`` for convolutions),
  from the stored ``a`` and ``g``; for a layer whose records' gradients were built for the
  norms (direct form) it is ``w @ rows`` of those rows ("BK-MixOpt" in Bu et al. 2023), so those
  layers cost one per-record product for norms and sum together. A Linear layer whose input
  comes back call after call (a full-batch method's data) keeps it transposed for that product
  (:attr:`_Layer.input_t`). It equals the reweighted backward of
  ``Σ_i w_i ℓ_i`` (the
  second pass of ghost clipping) without running it: no second backprop through the network,
  no retained graph, and records with ``w_i = 0`` are left out exactly (a record whose
  gradient is NaN cannot poison the sum), with the same forward as the norms (dropout masks
  agree).
* the difference of two such batches at θ and θ′ (DP-SRM) has, per layer,
  ``Σ_t g_t a_tᵀ − g′_t a′_tᵀ = Σ_t (g_t − g′_t) a_tᵀ + g′_t (a_t − a′_t)ᵀ``: the Linear rule on
  the 2T stacked positions ``[a; a − a′]`` and ``[g − g′; g′]`` (Gram form, chosen by 2·(2T)² <
  p·q, and for a convolution only if its rows at both points, 2·p·q, outweigh the patches the
  stacked form holds, 3·T·p, for a Linear layer at one position only if they outweigh its
  3·(p + q) inputs and output gradients: :func:`use_gram_difference`), whose weighted sum is the
  book-keeping product of the same two stacked pieces (:class:`_Stacked`); or the two records'
  layer gradients built and subtracted (direct form; rows built once per point and shared with
  the norms and the book-keeping sums at that point), whose weighted sum is ``w @ (rows −
  rows′)``. Either way norm and sum are of the same difference, and avoid the cancellation of
  ``‖A‖² + ‖A′‖² − 2⟨A, A′⟩``, which loses every digit when θ′ ≈ θ (every stacked term is
  already of the size of the difference). A layer that saw the same input at both points (a
  first layer, whose input is the data, when the oracle reuses the records' chunk) has
  a′ = a: its difference is the one layer ``(a, g − g′)``, which costs what one point does.

Rounding: a norm is never below the norm of what the sum adds for that record. Clipping
scales record i by ``C / ‖∇ℓ_i‖``; the sum then adds the record's *computed* contribution, so
``norms()`` returns, in float64, an upper bound of the norm of that computed contribution per
unit weight (:meth:`GhostRows.norms`), and no clipped record adds more than C, in float32 as
in float64. Per layer: squared norms are accumulated in float64 (:func:`_sq_rows`, from
partial norms of 32 entries; Gram matrices in float64, :func:`gram_sq_norms`) and enlarged by
the rounding bounds of those sums (Higham's γ_n = n·u/(1 − n·u), u the unit roundoff, which
hold whatever order BLAS or oneDNN sum in), then by the rounding of the layer's products in
the sum: ``(1 + u)²`` for one product per entry (``fl(fl(w·g)·a)``, or ``w·rows``), plus
``γ_{T+3}·Σ_t ‖a_t‖‖g_t‖`` where a record's entry is a sum over T positions (the Gram form:
the backward product or the rows are formed from ``a`` and ``g`` in the module's precision).
In float32 the bounds are a few 1e−6 above the norms (3e−6 on the MNIST CNN, 2e−6 for its
differences of two points); in float64, ≲ 1e−12. A record whose Gram terms cancel (its
gradient far smaller than ``Σ_t ‖a_t‖‖g_t‖``) gets a bound further above its norm (by
γ_{T+3}·Σ_t ‖a_t‖‖g_t‖, the rounding its sum may have): conservative, never below. Each layer
gives the squared bounds (``sq_bounds``), which are added over the layers, and a record's norm
is one square root at the end; the final enlargement in :attr:`GhostRows._norms` covers those
float64 products, sums and that root.

Other layers (the rows are the records' gradients, so norm and sum are those of the same rows):

* Embedding: record i's gradient is ``Σ_t e_{idx_t} g_tᵀ``: one row ``Σ_{t: idx_t = v} g_t`` per
  distinct index v of the record (at most T rows, no ``[B, V, D]`` rows), summed in float64 for
  the norms, and the sum scatters ``w_i g_t`` into the table's rows (:class:`_Embedding`); the
  padding index gets no gradient.
* LayerNorm / GroupNorm: ``y = x̂ ⊙ γ + β`` with x̂ normalised within the record, so the rows
  ``Σ g ⊙ x̂`` and ``Σ g`` (over positions, or spatial dims) are as small as γ: built directly,
  from x̂ recomputed from the input (:func:`_norm_rows`).
* Conv1d: a Conv2d of kernel (1, k) on ``[B, C, 1, L]`` (:func:`geometry`).

How layers are found, and why each record's gradient is its own (DESIGN rule 7: nothing is left
on the user's module: no persistent hook, no attribute, no monkey-patching).
:func:`plan` walks the module: an ``nn.Sequential`` (whose forward is not overridden) is opened
and its children are run by this module's own functional forward, one stage after another.
Each child is looked up in a :class:`Registry` of layer types whose per-record structure is
known (:data:`KNOWN_LAYERS`; imitating Opacus's ``GRAD_SAMPLERS`` as an extension point, but
an immutable object passed to the oracle, ``TorchModel(..., known_layers=...)``, not a global
table): the class itself or the nearest registered base class whose ``forward`` it keeps, and
only if that entry's condition holds (e.g. ``nn.Flatten`` with ``start_dim ≥ 1``, an Embedding
without ``max_norm`` or ``scale_grad_by_freq``). Then the child is

* a ghost layer (:data:`GHOST_KINDS`: ``nn.Linear``; ``nn.Conv2d``/``nn.Conv1d`` with zero
  padding; ``nn.Embedding``; ``nn.LayerNorm``; ``nn.GroupNorm``; ``weight``/``bias`` not
  parametrized) with trainable parameters: computed here with its functional form (``F.linear``,
  ``F.conv2d``, …) on views of θ, after a check that its input has the rank at which the layer
  acts within each record (:func:`_functional`: a Linear on a 1-D batch would act across the
  records); the outputs are kept and ``torch.autograd.grad`` w.r.t. those outputs gives every
  ``g`` in one backward (which skips the weight-gradient products: only ``∂ℓ/∂s`` is asked for);
* ``block``: any other module with trainable parameters (a container with its own forward, the
  whole model if it is not a Sequential, a custom layer, a padded convolution): run on each
  record alone under ``vmap`` (:mod:`~dpopt.oracles.ghost_blocks`; each record as a batch of one, as the vmap
  engine does), its own parameters expanded to one copy per record so that the same backward
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
  see :func:`_plain`);
* ``isolated``: no trainable parameters and not known (a custom layer, padding, anything with
  hooks): run on each record alone under ``vmap``, like a block.

Per-record independence: ghost norms are the norms of the records' gradients only if record i's
output depends on record i alone; otherwise one record moves every other record's gradient and
clipping no longer bounds its influence (e.g. ``x - x.mean(0)``, BatchNorm in training mode,
attention across dim 0). It is enforced, not assumed: what runs on the whole batch is only (a) a
registered layer type whose forward is the registered class's and whose condition holds, with
the rank check above for ghost layers, and (b) the opened ``nn.Sequential``'s own forward
(children in order, one tensor passed along); every other piece of code, in particular every
custom ``forward`` with whatever it calls (``torch`` functions, parameter-free modules, user
hooks), runs under ``vmap``, whose semantics is the function applied to each record on its
own. Inside a block the hooks only read inputs and add zeros, and the ghost layers there run
under the same vmap. What the hooks cannot see is found when a block is first run on records
of a new shape (``ghost_blocks._discover``, on one record, with every tapped output cut from
its layer's parameters): a layer whose parameters reach the output outside its calls (e.g.
``nn.MultiheadAttention``'s ``out_proj``) joins the block's own parameters (vmap; ``rules()``
shows the plan before that), and a different sequence of calls later (data-dependent
branching) is refused by name. A layer called several times in
one forward is one layer whose record gradient is the sum over its calls (:func:`_calls`).
Assumed: the registry's entries are true (registering a mixing layer with ``with_per_record``
breaks the guarantee; the tests include that mutant), and torch's kernels and vmap rules are
correct.

A ``block`` or ``isolated`` module that ``vmap`` cannot run (``.item()``, Python control flow
on tensor values, in-place writes to captured tensors, torch's fused recurrent kernels) raises
a :class:`~dpopt._validate.DpoptError` naming its path, at the first call.

Layout (CPU): a Conv2d stage's input is passed channels-last in float32/bfloat16
(:func:`_channels_last`), so oneDNN returns channels-last outputs and the activations and
max-pools after it stay in that layout (PyTorch's NCHW max-pool kernel is several times slower
on CPU: the MNIST CNN's first pool took 16 ms of a 38 ms plain step, one thread); the norms and
sums read channels-last ``a`` and ``g`` in place. Values agree with the NCHW computation up to
float rounding (oneDNN may sum in another order).

Limits: module hooks registered by the user are not run for ghost stages nor for opened
Sequentials (a plain module with hooks is run per record; a ghost layer with hooks inside a
block is part of the block's vmap). A parameter used by two stages (tied weights) is refused
(use ``engine="vmap"``); inside a block, layers sharing a parameter stay in its vmap. A block's
convolution or GroupNorm must receive each record as one sample. BatchNorm and torch's
recurrent layers are refused by the oracle. Squared norms are formed without rescaling, so a
record whose gradient norm exceeds ~1e19 (float32) overflows to ∞ and is dropped by clipping
like a NaN record, where the dense engine would clip it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _validate
from ..clipping import weights_in
from .ghost_blocks import Calls, _hooked, _per_record, run_block
from .per_record import SqueezeLast


class Layout(Protocol):
    """Where each trainable parameter lives in the flat θ (see ``torch_model.Layout``)."""

    dim: int

    def place(self, name: str) -> slice: ...


#: Stage kinds with a ghost rule: per-record norms and sums from a layer's input and output gradient.
GHOST_KINDS = ("linear", "conv", "embedding", "layernorm", "groupnorm")


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

    layer: type[nn.Module]
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
            if cls in by_type:
                entry = by_type[cls]
                return entry.kind if type(module).forward is cls.forward and entry.when(module) else None
        return None

    def with_per_record(self, layer: type[nn.Module], when: Condition = _always) -> Registry:
        """This registry with ``layer`` known to act on each record on its own, for the instances
        for which ``when(module)`` holds: without trainable parameters, it is then called on the
        whole batch. Register only a layer whose output for record i depends on record i alone
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


#: The layers the ghost engine knows by default.
KNOWN_LAYERS = Registry((
    Known(nn.Linear, "linear"),
    Known(nn.Conv2d, "conv", _zero_padding),
    Known(nn.Conv1d, "conv", _zero_padding),
    Known(nn.Embedding, "embedding", _plain_embedding),
    Known(nn.LayerNorm, "layernorm"),
    Known(nn.GroupNorm, "groupnorm"),
    *(Known(layer, "plain") for layer in _PER_RECORD),
    Known(nn.Flatten, "plain", _from_dim_1("start_dim")),
    Known(SqueezeLast, "plain"),
    Known(nn.Unflatten, "plain", _from_dim_1("dim")),
    *(Known(layer, "plain", _from_dim_1("dim")) for layer in (nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU)),
))


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
        if sub is block or _hooked(sub):
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
                walk(child, f"{path}.{name}" if path else name)
            return
        names, local = _trainable(m, theta_names)
        path = path or "<model>"
        if not names:  # a known layer without trainable parameters acts on each record on its own too
            rule = known.kind(m)
            stages.append(Stage("isolated" if rule is None or (rule != "plain" and _hooked(m)) else rule, m, path, ()))
        elif rule := _ghost_rule(m, local, known):
            stages.append(Stage(rule, m, path, names, tuple(local.values())))
        else:
            inner = _inner(m, "" if path == "<model>" else path, theta_names, known)
            tapped = {theta for stage in inner for _, theta in stage.names}
            own = tuple((name, theta) for name, theta in names if theta not in tapped)
            stages.append(Stage("block", m, path, own, tuple(local[name] for name, _ in own), inner))

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
    a ghost rule, also inside a block) or "vmap" (a block, or a parameter-free module run per record)."""
    rules = []
    for s in stages:
        if s.kind in GHOST_KINDS:
            rules += [(s.path, "ghost")] if s.names else []
        elif s.kind != "plain":
            rules += [(s.path, "vmap"), *((inner.path, "ghost") for inner in s.inner)]
    return rules


#: Max-pooling of NCHW inputs with at least this many channels runs in channels-last layout.
CHANNELS_LAST_POOL = 16


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``F.max_pool2d`` of a contiguous NCHW ``x`` computed in channels-last layout; the output
    and the input gradient come back contiguous NCHW (so the layers' output gradients ``g`` stay
    NCHW for the norms and the convolutions' backward)."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel, stride, padding, dilation, ceil_mode: bool) -> Tensor:  # noqa: ANN001
        out, indices = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last), kernel, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(indices)
        ctx.args, ctx.shape = (kernel, stride, padding, dilation, ceil_mode), x.shape
        return out.contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):  # noqa: ANN205
        (indices,) = ctx.saved_tensors
        # the kernel reads only the input's shape and layout (it zero-fills and scatters)
        like = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device, memory_format=torch.channels_last)
        grad_input = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(memory_format=torch.channels_last), like, *ctx.args, indices)
        return grad_input.contiguous(), None, None, None, None, None


#: dtypes whose CPU convolutions (oneDNN) run faster in channels-last layout.
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16)


def _channels_last(x: Tensor) -> Tensor:
    """A convolution's input in channels-last layout (CPU, oneDNN dtypes; else ``x``).

    oneDNN then returns the output channels-last too, so the activations and max-pools that
    follow run in that layout (PyTorch's NCHW max-pool kernel is several times slower on CPU)
    and the backward returns channels-last output gradients ``g``: viewed as ``[B, T, q]``
    positions without a copy by :meth:`_Layer.matrices` and :meth:`_Layer.per_record`.
    With one channel the layouts share their memory: only the strides say channels-last.
    """
    if x.ndim != 4 or x.device.type != "cpu" or x.dtype not in CHANNELS_LAST_DTYPES:
        return x
    if x.shape[1] == 1 and x.is_contiguous():
        B, _, H, W = x.shape
        return x.reshape(B, H, W, 1).permute(0, 3, 1, 2)
    return x.contiguous(memory_format=torch.channels_last)


def _hwc(x: Tensor) -> bool:
    """Whether ``x [B, C, H, W]`` is stored channels-last (and C > 1, where the layouts differ)."""
    return x.shape[1] > 1 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _plain(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)`` for a stage without trainable parameters.

    A plain ``nn.MaxPool2d`` (forward not overridden, no hooks, no indices returned) on a
    contiguous ``[B, C, H, W]`` CPU input with C ≥ :data:`CHANNELS_LAST_POOL` runs PyTorch's own
    max-pool kernel in its channels-last variant: several times faster on CPU than the NCHW one
    (16 ms against 3.6 ms for the MNIST CNN's first pool, batch 256, one thread), with the same
    values and the same argmax (the first maximum of each window, NaN wins), so the forward and
    every gradient are unchanged.
    """
    if (type(m) is nn.MaxPool2d and x.ndim == 4 and x.shape[1] >= CHANNELS_LAST_POOL and x.is_contiguous()
            and x.device.type == "cpu" and not m.return_indices and not _hooked(m)):
        stride = m.stride if m.stride is not None else m.kernel_size
        return _ChannelsLastMaxPool.apply(x, _pair(m.kernel_size), _pair(stride), _pair(m.padding),
                                          _pair(m.dilation), m.ceil_mode)
    return m(x)


def forward(stages: tuple[Stage, ...], views: dict[str, Tensor], x: Tensor, taps: bool = True
            ) -> tuple[Tensor, list[tuple]]:
    """Run the stages on ``x`` with parameters ``views`` (θ name → tensor). Returns the output
    and, per stage with parameters, ``(stage, input, tap)``: the tap is the stage's output (a
    ghost layer) or what :func:`_block` returns, to differentiate against (``taps=False``: only
    the output). A "plain" module that has hooks now is run per record (a hook might mix records)."""
    out_taps = []
    for stage in stages:
        m = stage.module
        if stage.kind == "plain" and not _hooked(m):
            x = _plain(m, x)
            continue
        if stage.kind in ("plain", "isolated"):
            x, _ = _per_record(stage, {}, x)
            continue
        if stage.kind == "block":
            out, tap = run_block(stage, views, x, taps)
            out_taps.append((stage, x, tap))
            x = out
            continue
        if not stage.names and _hooked(m):  # hooks added since the plan: they might mix records
            x, _ = _per_record(stage, {}, x)
            continue
        params = {local: views[name] for local, name in stage.names}
        if stage.kind == "conv" and isinstance(m, nn.Conv2d):
            x = _channels_last(x)
        out = _functional(stage, params, x)
        if stage.names:
            out_taps.append((stage, x, out))
        x = out
    return x, out_taps


def _functional(stage: Stage, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """A ghost layer's output with its trainable parameters ``params`` (its own frozen ones else),
    computed here, without the module's call (and so without hooks)."""
    m = stage.module
    least, most = {"linear": (2, None), "conv": (len(getattr(m, "kernel_size", ())) + 2,) * 2,
                   "layernorm": (len(getattr(m, "normalized_shape", ())) + 1, None)}.get(stage.kind, (1, None))
    if x.ndim < least or (most is not None and x.ndim > most):
        raise _validate.DpoptError(
            f"engine='ghost' runs layer {stage.path!r} ({type(m).__name__}) on the whole batch, records along dim 0, "
            f"so its input must have {least}{'' if most == least else ' or more'} dims; it has shape "
            f"{tuple(x.shape)}, with which the layer would act across records")
    weight, bias = params.get("weight", m.weight), params.get("bias", getattr(m, "bias", None))
    if stage.kind == "linear":
        return _linear(x, weight, bias)
    if stage.kind == "conv":
        conv = F.conv2d if isinstance(m, nn.Conv2d) else F.conv1d
        padding = geometry(m).padding[-len(m.kernel_size):]
        return conv(x, weight, bias, m.stride, padding, m.dilation, m.groups)
    if stage.kind == "embedding":
        return F.embedding(x, weight, m.padding_idx)
    if stage.kind == "layernorm":
        return F.layer_norm(x, m.normalized_shape, weight, bias, m.eps)
    return F.group_norm(x, m.num_groups, weight, bias, m.eps)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``; for a 2-D input with more records than the weight has
    entries, with the weight copied to a contiguous ``[p, q]`` first: MKL's kernel for
    ``x @ Wᵀ`` on the transposed weight is slow when x is tall and q small (BlogFeedback's first
    layer, 48k × 280 → 10 in float64, one thread: 24 ms against 19–21 ms), and the copy is
    negligible there. Smaller batches keep ``F.linear`` (the copy costs more than it saves)."""
    if x.ndim != 2 or x.shape[0] < weight.numel():
        return F.linear(x, weight, bias)
    w_t = weight.T.contiguous()
    return x @ w_t if bias is None else torch.addmm(bias, x, w_t)


def capture(taps: list[tuple], total_loss: Tensor) -> tuple[_Layer | _Block | _Embedding, ...]:
    """One backward of ``total_loss`` (= Σ_i ℓ_i) to every tap: the per-layer records."""
    targets = [t for stage, _, tap in taps
               for t in ((*tap[1].values(), *tap[4]) if stage.kind == "block" else (tap,))]
    grads = iter(torch.autograd.grad(total_loss, targets, allow_unused=True) if targets else ())
    layers: list[_Layer | _Block | _Embedding] = []
    for stage, x, tap in taps:
        if stage.kind != "block":
            layers.append(_layer(stage, x.detach(), _given(next(grads), tap)))
            continue
        stage, expanded, calls, inputs, probes = tap  # the stage run (see ghost_blocks.run_block)
        if expanded:
            names = dict(stage.names)
            layers.append(_Block(stage, {names[local]: _given(next(grads), t) for local, t in expanded.items()}))
        uses: dict[int, list[tuple[Tensor, Tensor]]] = {}
        for (k, _, _), a, probe in zip(calls, inputs, probes):
            uses.setdefault(k, []).append(_one_sample(stage.inner[k], a.detach(), _given(next(grads), probe)))
        layers += [_calls(stage.inner[k], pairs) for k, pairs in uses.items()]
    return tuple(layers)


def _calls(stage: Stage, pairs: list[tuple[Tensor, Tensor]]) -> _Layer | _Block | _Embedding:
    """One layer from its calls ``(a, g)`` in one forward: a record's gradient is the sum over the
    calls. For a Linear or an Embedding the calls are more positions of one layer (stacked); for
    the others the records' rows of each call are built and added up."""
    if len(pairs) == 1:
        return _layer(stage, *pairs[0])
    B = len(pairs[0][1])
    if stage.kind == "linear":
        return _Layer(stage, *(torch.cat([t.reshape(B, -1, t.shape[-1]) for t in part], 1) for part in zip(*pairs)))
    layers = [_layer(stage, a, g) for a, g in pairs]
    if stage.kind == "embedding":
        return _Embedding(stage, torch.cat([e.idx for e in layers], 1), torch.cat([e.g for e in layers], 1))
    rows = [layer.grads if isinstance(layer, _Block) else layer.row_dict() for layer in layers]
    return _Block(stage, {name: sum(r[name] for r in rows) for name in rows[0]})


def _layer(stage: Stage, a: Tensor, g: Tensor) -> _Layer | _Block | _Embedding:
    """The records of a ghost layer from its input ``a`` and output gradient ``g`` (``[B, *per
    record]``; a call inside a block sees each record as a batch of one)."""
    m, B = stage.module, len(g)
    if stage.kind == "linear":
        return _Layer(stage, a, g)
    if stage.kind == "embedding":
        idx, g = a.reshape(B, -1), g.reshape(B, -1, g.shape[-1])
        if m.padding_idx is not None:  # the table's padding row gets no gradient
            g = g.masked_fill((idx == m.padding_idx).unsqueeze(2), 0)
        return _Embedding(stage, idx, g)
    if stage.kind == "conv":
        return _Layer(stage, a, g) if isinstance(m, nn.Conv2d) else _Layer(stage, a.unsqueeze(2), g.unsqueeze(2))
    return _Block(stage, _norm_rows(stage, a, g))


def _one_sample(stage: Stage, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """A call's input and output gradient from a block, ``[B, *per record]``, as :func:`_layer`
    takes them: a convolution's or GroupNorm's batched input (each record a batch of one) without
    that dimension of one."""
    m = stage.module
    if stage.kind == "groupnorm" or (stage.kind == "conv" and a.ndim == len(m.kernel_size) + 3):
        if a.shape[1] != 1:
            raise _validate.DpoptError(f"engine='ghost' takes each record to layer {stage.path!r} as one sample; "
                                       f"it was given {a.shape[1]} per record: use engine='vmap'")
        return a.squeeze(1), g.squeeze(1)
    return a, g


def _norm_rows(stage: Stage, a: Tensor, g: Tensor) -> dict[str, Tensor]:
    """Per-record gradients of a LayerNorm or GroupNorm's affine parameters: ``y = x̂ ⊙ γ + β``
    (x̂ normalised per record: over the last dims, or per group of channels), so ``∇γ = Σ g ⊙ x̂``
    and ``∇β = Σ g`` over the positions (LayerNorm) or the spatial dims (GroupNorm). x̂ is
    recomputed from the input: ``[B, size of γ]`` rows, a block."""
    m, B, names = stage.module, len(g), dict(stage.names)
    if stage.kind == "layernorm":
        shape = tuple(m.normalized_shape)
        A, G = a.reshape(B, -1, *shape), g.reshape(B, -1, *shape)
        xhat, over = F.layer_norm(A, shape, eps=m.eps), 1
    else:
        A, G = a.reshape(B, m.num_channels, -1), g.reshape(B, m.num_channels, -1)
        xhat, over = F.group_norm(A, m.num_groups, eps=m.eps), 2
    rows = {}
    if "weight" in names:
        rows[names["weight"]] = (G * xhat).sum(over).reshape(B, -1)
    if "bias" in names:
        rows[names["bias"]] = G.sum(over).reshape(B, -1)
    return rows


def _given(grad: Tensor | None, like: Tensor) -> Tensor:
    """A gradient from ``autograd.grad(allow_unused=True)``: None (no path to the loss) is zero."""
    return torch.zeros(like.shape, dtype=like.dtype, device=like.device) if grad is None else grad.detach()


#: Unit roundoff of float64, the precision every norm is accumulated in.
U64 = torch.finfo(torch.float64).eps / 2

#: Entries per partial norm of rows in a precision below float64 (:func:`_sq_rows`).
PARTIAL = 32


def _unit(dtype: torch.dtype) -> float:
    """The unit roundoff u of ``dtype`` (half its machine epsilon)."""
    return torch.finfo(dtype).eps / 2


def _gamma(n: int, u: float) -> float:
    """Higham's γ_n = n·u / (1 − n·u): a sum or dot product of n terms computed in precision u, in
    any order, is off by at most γ_{n} times the sum of the terms' magnitudes ("Accuracy and
    Stability of Numerical Algorithms", §3.1). ``value·(1 + 2γ_n)`` bounds a true value from
    above when the computed one is at least ``(1 − γ_n)`` times it (γ_n ≤ 1/2)."""
    return n * u / (1 - n * u)


def _sq_rows(rows: Tensor) -> Tensor:
    """An upper bound, in float64, of ``‖row‖²`` for each row of ``[R, n]``: :func:`_sq_of_runs` of
    :func:`_run_norms`.

    float64 rows: one fused reduction (2.5× faster on CPU than ``square().sum(1)``, which
    writes the squares out first), enlarged by its rounding bound. Lower precisions: norms of
    runs of :data:`PARTIAL` entries, in float32 at least (relative error γ_{PARTIAL+3}), squared
    and added in float64 (a float32 square is exact there), enlarged by both bounds (4e−6 in
    float32): one float32 reduction over the whole row could be n·2⁻²⁴ off (3.6e−4 of a
    10⁷-entry norm, measured), a float64 one over float32 data is 6× slower."""
    return _sq_of_runs(_run_norms(rows), rows.shape[1], rows.dtype)


def _run_norms(rows: Tensor) -> Tensor:
    """Norms ``[R, runs]`` of the runs of :data:`PARTIAL` entries of each row of ``rows [R, n]`` (and
    of the shorter last run), in float32 at least; in float64, of the whole row (one run)."""
    R, n = rows.shape
    if rows.dtype == torch.float64:
        return torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    acc = torch.promote_types(rows.dtype, torch.float32)
    body = n - n % PARTIAL
    runs = [torch.linalg.vector_norm(rows[:, :body].reshape(R, body // PARTIAL, PARTIAL), dim=2, dtype=acc)
            ] if body else []
    if body < n or not body:
        runs.append(torch.linalg.vector_norm(rows[:, body:], dim=1, keepdim=True, dtype=acc))
    return runs[0] if len(runs) == 1 else torch.cat(runs, dim=1)


def _sq_of_runs(runs: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    """The bound of :func:`_sq_rows` from the run norms of rows of n entries of ``dtype``: their
    squares added by one float64 norm, squared (squares of float32 numbers are exact in float64;
    at most n/32 + 2 roundings, within γ_{n+4}), enlarged by that and by the runs' own rounding.
    One run (a float64 row's norm, or a short row) is squared alone: the same value, one operation
    fewer (DIFF2's rounds make several such calls on their full batch)."""
    sq = (runs[:, 0].double().square() if runs.shape[1] == 1
          else torch.linalg.vector_norm(runs, dim=1, dtype=torch.float64).square())
    if dtype == torch.float64:
        return sq * (1 + 2 * _gamma(n + 4, U64))
    acc = torch.promote_types(dtype, torch.float32)
    return sq * (1 + 2 * _gamma(min(n, PARTIAL) + 3, _unit(acc)) + 2 * _gamma(n + 4, U64))


def use_gram(T: int, p: int, q: int, itemsize: int = 8) -> bool:
    """Bu et al.'s layer-wise choice: Gram matrices (B·T² memory) iff 2T² < p·q (the size of the
    layer's per-record gradient, built by the direct form). In a precision below float64
    (``itemsize`` < 8 bytes) the Gram matrices are formed from float64 copies of the positions'
    inputs and output gradients (:func:`gram_sq_norms`), T·(p + q) float64 numbers per record:
    then the Gram form is chosen only if the rows, p·q numbers of ``itemsize`` bytes, would also
    take more memory than those copies. Where they do not, the direct form is faster too: its
    rows cost T·p·q products against the float64 Gram's 2·T²·(p + q) ≥ T·p·q, and its sum is
    ``w @ rows`` instead of a backward product (the MNIST CNN's second convolution, T = 25,
    p = 256, q = 32, float32, batch 256: 10 ms of one thread per step for rows, norms and sum,
    against 19 ms for the float64 Gram form and 13 ms for a float32 one)."""
    return 2 * T * T < p * q and (itemsize >= 8 or 8 * T * (p + q) < p * q * itemsize)


def use_gram_difference(T: int, p: int, q: int, conv: bool, itemsize: int = 8) -> bool:
    """The choice for the difference of two points (DP-SRM), 2T stacked positions: the Gram form
    iff :func:`use_gram` says so for 2T positions and, for a convolution, the records' layer
    gradients at both points (2·p·q per record) would take more memory than the im2col patches
    the stacked Gram form holds (both points' and their difference, 3·T·p), i.e. iff 2q > 3T.
    Otherwise the direct form: it needs no more memory, and its rows also give the norms at
    each point and the three book-keeping sums of a DP-SRM step without a backward product (the
    MNIST CNN's second convolution, T = 25, q = 32: its share of a DP-SRM step about halves).

    A Linear layer at one position (T = 1) is held to the same comparison: its rows at both
    points (2·p·q) against the stacked form's inputs and output gradients (both points' and
    their difference, 3·(p + q)), so the direct form iff 2pq ≤ 3(p + q), e.g. a layer with one
    output. Its rows are outer products, one broadcast product per point; the stacked form costs
    six batched dot products and two backward products (DIFF2's MLP, second layer 10 → 1, full
    batch of 16,512: 0.3 ms of a round against 1 ms)."""
    if T == 1 and not conv:
        return use_gram(2, p, q, itemsize) and 2 * p * q > 3 * (p + q)
    return use_gram(2 * T, p, q, itemsize) and not (conv and 2 * q <= 3 * T)


def gram_sq_norms(pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Upper bounds, in float64, of ``‖Σ_k Σ_t G^k_t A^k_tᵀ‖²`` per row from Gram matrices, for
    pairs ``A^k [R, T, p]``, ``G^k [R, T, q]``: ``Σ_{k,l} ⟨A^k A^lᵀ, G^k G^lᵀ⟩``, and of
    ``(Σ_k Σ_t ‖A^k_t‖‖G^k_t‖)²``, which bounds the magnitude of every term.

    The Gram matrices are formed in float64 (a float32 entry ``⟨a_s, a_t⟩`` could be off by
    p·2⁻²⁴·‖a_s‖‖a_t‖, i.e. the norm of a conv layer with T positions by ~T·p·2⁻²⁴: 4e−4 for the
    MNIST CNN's second layer), and the result is enlarged by its rounding bound
    γ_{p+q+(KT)²}·bound: exact up to ~1e−12 unless the terms cancel, never too small."""
    pairs = [(A.double(), G.double()) for A, G in pairs]  # exact casts
    sq = bound = pairs[0][0].new_zeros(pairs[0][0].shape[0])
    for k, (A, G) in enumerate(pairs):
        for A2, G2 in pairs[k:]:
            AA, GG = _gram(A, A2), _gram(G, G2)
            term = (AA * GG).sum((1, 2))
            if A2 is A:  # ‖A_t‖², ‖G_t‖² are the diagonals of the Gram matrices (no second pass over A)
                sq = sq + term
                bound = bound + (AA.diagonal(dim1=1, dim2=2) * GG.diagonal(dim1=1, dim2=2)).sqrt().sum(1)
            else:
                sq = sq + 2 * term
    (_, T, p), q, K = pairs[0][0].shape, pairs[0][1].shape[2], len(pairs)
    bound = bound.square() * (1 + 2 * _gamma(p + q + K * T + 8, U64))
    return sq + _gamma(p + q + (K * T) ** 2 + 8, U64) * bound, bound


def _gram(X: Tensor, Y: Tensor) -> Tensor:
    """``X Yᵀ`` per row, ``[R, T, T]``; a product of scalars when T = 1 and the rows have one
    entry (a one-output layer's g: a batched 1×1 matmul costs 4× more on CPU)."""
    return X * Y if X.shape[1:] == (1, 1) else X @ Y.mT


@lru_cache(maxsize=32)
def _patch_index(shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int], hwc: bool, device: torch.device) -> Tensor:
    """Positions of the ``[L, C·kh·kw]`` patches in one flattened (padded) ``[C, H, W]`` input,
    stored ``C, H, W`` or (``hwc``) ``H, W, C``."""
    (C, H, W), (kh, kw), (sh, sw), (dh, dw) = shape, kernel, stride, dilation
    Ho, Wo = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    row, col, channel = (W * C, C, 1) if hwc else (W, 1, H * W)  # strides of h, w, c
    arange = lambda n, step: torch.arange(n, dtype=torch.int64) * step  # noqa: E731
    index = (arange(Ho, sh * row).view(-1, 1, 1, 1, 1) + arange(Wo, sw * col).view(1, -1, 1, 1, 1)
             + arange(C, channel).view(1, 1, -1, 1, 1) + arange(kh, dh * row).view(1, 1, 1, -1, 1)
             + arange(kw, dw * col).view(1, 1, 1, 1, -1))
    return index.reshape(-1).to(device)


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution as a Conv2d: a Conv1d of kernel k is one of kernel (1, k) on inputs ``[B, C, 1, L]``."""

    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    weight_shape: tuple[int, int, int, int]


def geometry(conv: nn.Module) -> ConvGeometry:
    """The Conv2d geometry of a zero-padded ``nn.Conv2d`` or ``nn.Conv1d``."""
    padding = (0,) * len(conv.kernel_size) if conv.padding == "valid" else tuple(conv.padding)
    if isinstance(conv, nn.Conv2d):
        return ConvGeometry(tuple(conv.kernel_size), tuple(conv.stride), padding, tuple(conv.dilation), conv.groups,
                            tuple(conv.weight.shape))
    return ConvGeometry((1, conv.kernel_size[0]), (1, conv.stride[0]), (0, padding[0]), (1, conv.dilation[0]),
                        conv.groups, (*conv.weight.shape[:2], 1, conv.weight.shape[2]))


def unfold(x: Tensor, conv: ConvGeometry) -> Tensor:
    """im2col: ``[B, L, C·kh·kw]`` patches of ``x [B, C, H, W]`` (``F.unfold``'s order, transposed;
    x in NCHW or channels-last layout), gathered with one ``gather`` of precomputed positions
    (2–5× faster on CPU than ``F.unfold`` or a strided copy; ``gather`` runs on every thread,
    ``index_select`` along dim 1 on one: 1.0 ms against 1.5 ms for the MNIST CNN's first layer,
    batch 260, two threads)."""
    return _patches(_padded(x, conv), conv)


def _padded(x: Tensor, conv: ConvGeometry) -> Tensor:
    """``x`` with the convolution's zero padding."""
    (ph, pw) = conv.padding
    return F.pad(x, (pw, pw, ph, ph)) if ph or pw else x


def _patches(x: Tensor, conv: ConvGeometry) -> Tensor:
    """:func:`unfold` of an input ``x`` already padded."""
    B, C, H, W = x.shape
    hwc = _hwc(x)  # channels-last: gather from its own memory order, no copy to NCHW first
    index = _patch_index((C, H, W), conv.kernel_size, conv.stride, conv.dilation, hwc, x.device)
    flat = x.permute(0, 2, 3, 1).reshape(B, H * W * C) if hwc else x.reshape(B, C * H * W)
    p = C * conv.kernel_size[0] * conv.kernel_size[1]
    return flat.gather(1, index.expand(B, -1)).view(B, index.numel() // p, p)


#: Bytes of im2col patches, or of rows, built at once in the direct form (:attr:`_Layer._direct`).
CHUNK_BYTES = 2**22


@dataclass(frozen=True)
class _Layer:
    """A Linear or Conv2d stage of one chunk: its input ``a`` and output gradient ``g``."""

    stage: Stage
    a: Tensor
    g: Tensor

    def _trainable(self, local: str) -> str | None:
        return dict(self.stage.names).get(local)

    def shape(self) -> tuple[int, int, int, int]:
        """``(groups, T, p, q)`` of the Linear rule (per group for a convolution)."""
        if self.stage.kind == "linear":
            return 1, self.a[0].numel() // self.a.shape[-1], self.a.shape[-1], self.g.shape[-1]
        m = geometry(self.stage.module)
        q, per_group, kh, kw = m.weight_shape
        return m.groups, self.g.shape[2] * self.g.shape[3], per_group * kh * kw, q // m.groups

    def matrices(self) -> tuple[Tensor, Tensor]:
        """``A [B·groups, T, p]`` and ``G [B·groups, T, q]`` of the Linear rule."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if self.stage.kind == "linear":
            return self.a.reshape(B, T, p), self.g.reshape(B, T, q)
        A = unfold(self.a, geometry(self.stage.module)).view(B, T, groups, p).transpose(1, 2).reshape(B * groups, T, p)
        return A, self._positions(self.g)

    def _positions(self, g: Tensor) -> Tensor:
        """A convolution's output gradient ``g [B, groups·q, Ho, Wo]`` as ``G [B·groups, T, q]``
        (a view when g is channels-last and there is one group)."""
        B, (groups, T, _, q) = g.shape[0], self.shape()
        if _hwc(g):
            return g.permute(0, 2, 3, 1).reshape(B, T, groups, q).transpose(1, 2).reshape(B * groups, T, q)
        return g.reshape(B, groups, q, T).transpose(2, 3).reshape(B * groups, T, q)

    @cached_property
    def _direct(self) -> tuple[Tensor, Tensor | None]:
        """The records' weight gradients ``[B, q·p]`` (direct form) and, where they were taken while
        the rows were built, their run norms (:func:`_run_norms`): built once, the direct form's
        norms, the difference of two points and the book-keeping sum all use them.

        Per (record, conv group) ``G [q, T] @ A [T, p]`` (A the im2col patches for a convolution),
        for :data:`CHUNK_BYTES` of patches or rows at a time, whose run norms are taken while they
        are in cache (not in a second pass over the whole ``[B, q·p]``). For a convolution the
        patches are T·p numbers per record (12,544 for the MNIST CNN's first layer, 12× its input):
        gathered for the whole batch they would be a new allocation of several MB each step, whose
        first writes (page faults) cost more than the gather; a chunk's worth is reused from the heap.
        A Linear layer at one position has rows ``g aᵀ``, outer products (each entry one rounded
        product, as in the matrix product): one broadcast product for the whole batch (a batched
        product of 1-deep matrices is 14× slower on CPU), and no run norms: its norms are
        ``‖a‖‖g‖`` (:meth:`_weight_sq_bounds`), and a difference takes the norms of its own rows."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        if self.stage.kind == "linear" and T == 1:
            return (self.g.reshape(B, q, 1) * self.a.reshape(B, 1, p)).view(B, q * p), None
        rows, runs = self.a.new_empty(B, groups * q * p), []
        conv = geometry(self.stage.module) if self.stage.kind == "conv" else None
        a = self.a.reshape(B, T, p) if conv is None else _padded(self.a, conv)
        g = self.g.reshape(B, T, q) if conv is None else self.g
        step = max(1, CHUNK_BYTES // (groups * p * max(T, q) * self.a.element_size()))
        for start in range(0, B, step):
            block = rows[start:start + step]
            n = len(block)
            if conv is None:
                A, G = a[start:start + n], g[start:start + n].mT
            else:
                A, G = _patches(a[start:start + n], conv), g[start:start + n]
                if groups > 1:
                    A = A.view(n, T, groups, p).transpose(1, 2).reshape(n * groups, T, p)
                G = self._positions(G).mT if _hwc(G) else G.reshape(n * groups, q, T)  # [n·groups, q, T], a view
            torch.bmm(G, A, out=block.view(n * groups, q, p))
            runs.append(_run_norms(block))
        return rows, torch.cat(runs)

    @property
    def rows(self) -> Tensor:
        """The records' weight gradients ``[B, q·p]`` (direct form), built once (:attr:`_direct`)."""
        return self._direct[0]

    def row_dict(self) -> dict[str, Tensor]:
        """θ name → the records' gradient rows of each trainable parameter (direct form)."""
        rows = {}
        if weight := self._trainable("weight"):
            rows[weight] = self.rows
        if bias := self._trainable("bias"):
            rows[bias] = self.bias_g
        return rows

    @cached_property
    def bias_g(self) -> Tensor:
        """The bias gradient rows ``[B, q]``."""
        return self.bias_rows(self.g)

    def bias_rows(self, g: Tensor) -> Tensor:
        """``Σ_t g_t`` per record: the bias gradient rows ``[B, q]``."""
        return g.reshape(g.shape[0], -1, g.shape[-1]).sum(1) if self.stage.kind == "linear" else g.sum((2, 3))

    @cached_property
    def input_sq_norms(self) -> Tensor:
        """``‖a_i‖²`` of each record's input (a Linear layer at one position)."""
        return _sq_rows(self.a.reshape(self.a.shape[0], -1))

    @cached_property
    def input_t(self) -> Tensor:
        """A Linear layer's input as a contiguous ``[p, B·T]``: the layout in which MKL computes
        the book-keeping product fastest, ``aᵀ (w·g)`` (BlogFeedback's first layer, 48k × 280 →
        10 in float64, one thread: 11 ms against 17–19 ms for ``(w·g)ᵀ a``). The copy costs a
        pass over ``a``, so it is made only for an input that comes back (:func:`reuse_inputs`)."""
        return self.a.reshape(-1, self.a.shape[-1]).T.contiguous()

    #: What is computed from the input alone, shared by the layers that saw the same input.
    INPUT_CACHE = ("input_sq_norms", "input_t")

    def direct_difference(self) -> bool:
        """Whether the difference with another point takes the direct form (rows at both points)."""
        groups, T, p, q = self.shape()
        return bool(self._trainable("weight")) and not use_gram_difference(T, p, q, self.stage.kind == "conv",
                                                                           self.a.element_size())

    def _weight_sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' weight-gradient contributions
        to :meth:`add_weighted` per unit weight, whichever way the sum is formed: ``w·rows`` (one
        rounding per entry, rows exact or, for T > 1, off by γ_T·Σ_t ‖a_t‖‖g_t‖) or the backward
        product ``fl(Σ_t fl(w·g_t) a_tᵀ)`` (off by γ_{T+1}·Σ_t ‖a_t‖‖g_t‖ per unit weight)."""
        B, (groups, T, p, q) = self.a.shape[0], self.shape()
        one = (1 + _unit(self.a.dtype)) ** 4  # fl(fl(w·g)·a), or fl(w·rows) with rows = fl(g·a) at T = 1, squared
        if self.stage.kind == "linear" and T == 1:  # ‖g aᵀ‖² = ‖a‖²‖g‖², whether or not the rows were built
            return one * self.input_sq_norms * _sq_rows(self.g.reshape(B, -1))
        if "_direct" in self.__dict__ or not (T == 1 or use_gram(T, p, q, self.a.element_size())):  # direct form
            return one * _sq_of_runs(self._direct[1], groups * p * q, self.a.dtype)
        if T == 1:  # a convolution at one position: ‖g aᵀ‖² = ‖a‖²‖g‖² per group, on the patch
            A, G = self.matrices()
            sq = _sq_rows(A.reshape(B * groups, p)) * _sq_rows(G.reshape(B * groups, q))
            return one * sq.view(B, groups).sum(1)
        return _gram_bounds([self.matrices()], B, groups, T, self.a.dtype).square()

    def _bias_sq_bounds(self) -> Tensor:
        """Upper bounds of the squared norms of the bias contributions ``fl(w·Σ_t g_t)`` per unit weight."""
        return (1 + _unit(self.g.dtype)) ** 4 * _sq_rows(self.bias_g)

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' contributions to
        :meth:`add_weighted` per unit weight."""
        sq = self.a.new_zeros(self.a.shape[0], dtype=torch.float64)
        if self._trainable("weight"):
            sq = sq + self._weight_sq_bounds()
        if self._trainable("bias"):
            sq = sq + self._bias_sq_bounds()
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        """``total += Σ_i w_i ∇ℓ_i`` over the records ``kept`` (None: all). Where the records'
        weight gradients were built (the direct form) the sum is ``w @ rows``, else the
        weight-gradient product of a backward pass on ``(a, w·g)``."""
        v = w if kept is None else w[kept]
        if weight := self._trainable("weight"):
            if "_direct" in self.__dict__:  # the rows, built by the norms
                grad = v @ (self.rows if kept is None else self.rows[kept])
            else:
                a, g = (self.a, self.g) if kept is None else (self.a[kept], self.g[kept])
                gw = g * v.view(-1, *[1] * (g.ndim - 1))
                if self.stage.kind == "linear" and kept is None and "input_t" in self.__dict__:
                    grad = (self.input_t @ gw.reshape(-1, gw.shape[-1])).T
                elif self.stage.kind == "linear":
                    grad = gw.reshape(-1, gw.shape[-1]).T @ a.reshape(-1, a.shape[-1])
                else:
                    m = geometry(self.stage.module)
                    grad = torch.nn.grad.conv2d_weight(a, m.weight_shape, gw, m.stride, m.padding, m.dilation,
                                                       m.groups)
            total[layout.place(weight)] += grad.reshape(-1)
        if bias := self._trainable("bias"):
            total[layout.place(bias)] += v @ (self.bias_g if kept is None else self.bias_g[kept])


def _gram_bounds(pairs: list[tuple[Tensor, Tensor]], B: int, groups: int, T: int, dtype: torch.dtype) -> Tensor:
    """Upper bounds of the norms of the records' contributions of a layer in the Gram form, whose
    weight gradient ``Σ_k Σ_t G^k_t A^k_tᵀ`` is summed by backward products in ``dtype`` (one per
    pair, added up): the float64 Gram norm times ``(1 + u)²``, plus the products' rounding,
    γ_{T+3}·Σ_k Σ_t ‖A^k_t‖‖G^k_t‖ (per conv group; ``pairs`` hold ``[B·groups, T, ·]``)."""
    sq, bound = (part.view(B, groups).sum(1) for part in gram_sq_norms(pairs))
    u = _unit(dtype)
    return (1 + u) ** 2 * sq.sqrt() + _gamma(T + 3, u) * bound.sqrt()


@dataclass(frozen=True)
class _Block:
    """A stage whose records' gradients are held densely, ``grads`` (θ name → ``[B, *shape]``): a
    stage without a ghost rule, or a layer's difference of rows at two points."""

    stage: Stage
    grads: dict[str, Tensor]

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of ``fl(w·row)`` per unit weight."""
        return sum(_sq_rows(g.flatten(1)) * (1 + _unit(g.dtype)) ** 4 for g in self.grads.values())

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        for name, g in self.grads.items():
            g, v = (g, w) if kept is None else (g[kept], w[kept])
            total[layout.place(name)] += v @ g.flatten(1)


@dataclass(frozen=True)
class _Embedding:
    """An Embedding layer of one chunk: the records' indices ``idx [B, T]`` and output gradients
    ``g [B, T, D]`` (zero at the padding index). Record i's gradient is ``Σ_t e_{idx_t} g_tᵀ``, whose
    nonzero rows are ``Σ_{t: idx_t = v} g_t`` for the distinct indices v of the record (their norms
    in float64: :meth:`sq_bounds`), and the sum scatters ``w_i g_t`` into row idx_t of the table."""

    stage: Stage
    idx: Tensor
    g: Tensor

    def sq_bounds(self) -> Tensor:
        """Upper bounds (float64) of the squared norms of the records' contributions per unit weight.

        Record i's gradient has one row per distinct index v among its positions, ``S_v = Σ_{t:
        idx_t = v} g_t``: these rows are summed in float64 (B·T·D work, where the Gram form costs
        B·T²·D), each within γ_T·Σ_{t: idx_t = v} ‖g_t‖ of S_v (at most T terms), so the record's
        norm is within γ_T·Σ_t ‖g_t‖ of that of the computed rows, whose squared norms are bounded
        by :func:`_sq_rows` and added per record (at most T terms: ``1 + 2γ_T``). That bound times
        ``(1 + u)²`` (``fl(w·g_t)``), plus the rounding of each table row's sum over the record's
        positions, γ_{T+3}·Σ_t ‖g_t‖; squared."""
        if "weight" not in dict(self.stage.names):
            return self.g.new_zeros(len(self.g), dtype=torch.float64)
        (B, T, D), u, V = self.g.shape, _unit(self.g.dtype), self.stage.module.num_embeddings
        G = self.g.double().reshape(B * T, D)
        records = torch.arange(B, device=self.idx.device).repeat_interleave(T)
        keys, segment = torch.unique(records * V + self.idx.reshape(-1), return_inverse=True)
        rows = G.new_zeros(len(keys), D).index_put_((segment,), G, accumulate=True)
        sq = G.new_zeros(B).index_add_(0, keys // V, _sq_rows(rows)) * (1 + 2 * _gamma(T, U64))
        size = torch.linalg.vector_norm(G, dim=1).view(B, T).sum(1) * (1 + 2 * _gamma(D + T + 4, U64))
        return ((1 + u) ** 2 * (sq.sqrt() + _gamma(T, U64) * size) + _gamma(T + 3, u) * size).square()

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        if (name := dict(self.stage.names).get("weight")) is None:
            return
        idx, g, v = (self.idx, self.g, w) if kept is None else (self.idx[kept], self.g[kept], w[kept])
        table = total[layout.place(name)].view(-1, g.shape[-1])
        table.index_add_(0, idx.reshape(-1), (g * v.view(-1, 1, 1)).reshape(-1, g.shape[-1]))


@dataclass(frozen=True)
class _Stacked:
    """A Linear or Conv2d layer's difference at two points with different inputs, in the Gram
    form: ``parts = ((a, g − g′), (a − a′, g′))``, the second without the bias (whose difference
    is ``Σ_t g_t − g′_t``). Its norm is the Gram norm of both parts and its sum their backward
    products, so both are of the same rounded differences."""

    parts: tuple[_Layer, _Layer]

    def sq_bounds(self) -> Tensor:
        first = self.parts[0]
        B, (groups, T, _, _) = first.a.shape[0], first.shape()
        sq = _gram_bounds([part.matrices() for part in self.parts], B, groups, T, first.a.dtype).square()
        if first._trainable("bias"):
            sq = sq + first._bias_sq_bounds()
        return sq

    def add_weighted(self, w: Tensor, kept: Tensor | None, total: Tensor, layout: Layout) -> None:
        for part in self.parts:
            part.add_weighted(w, kept, total, layout)


def _difference(left: _Layer | _Block | _Embedding, right: _Layer | _Block | _Embedding
                ) -> _Layer | _Block | _Embedding | _Stacked:
    """The layer of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``, whose norms and sums are of the same difference.

    Where both points saw the same input (a first layer, whose input is the data) it is one
    layer, exactly: ``Σ_t g_t a_tᵀ − g′_t a_tᵀ = Σ_t (g_t − g′_t) a_tᵀ`` (norms and sums then
    cost what one point's do, with no cancellation). Otherwise, a block's difference of its
    per-record gradients; in the direct form, the difference of the rows built at each point
    (kept there for that point's norms and sums); else the stacked Gram form (:class:`_Stacked`)."""
    if isinstance(left, _Block):
        return _Block(left.stage, {name: g - right.grads[name] for name, g in left.grads.items()})
    if isinstance(left, _Embedding):  # indices are integers: never a function of θ
        if not torch.equal(left.idx, right.idx):
            raise ValueError(f"layer {left.stage.path!r} was given other indices at the two points")
        return _Embedding(left.stage, left.idx, left.g - right.g)
    if _same_memory(left.a, right.a):
        _share_input(left, right)
        difference = _Layer(left.stage, left.a, left.g - right.g)
        left.input_sq_norms  # noqa: B018 - computed at most once per batch, kept on ``left`` for the next point
        _share_input(difference, left)
        return difference
    if not (weight := left._trainable("weight")):
        return _Layer(left.stage, left.a, left.g - right.g)  # the bias alone: Σ_t g_t − g′_t
    if left.direct_difference():
        grads = {weight: left.rows - right.rows}
        if bias := left._trainable("bias"):
            grads[bias] = left.bias_rows(left.g - right.g)
        return _Block(left.stage, grads)
    weight_only = replace(left.stage, names=(("weight", weight),))
    return _Stacked((_Layer(left.stage, left.a, left.g - right.g), _Layer(weight_only, left.a - right.a, right.g)))


def _share_input(layer: _Layer | _Block, earlier: _Layer | _Block) -> None:
    """Give ``layer`` what ``earlier`` computed from its input (``_Layer.INPUT_CACHE``), if both
    saw the same input tensor (the data: computed once per batch, not once per point)."""
    if isinstance(layer, _Layer) and isinstance(earlier, _Layer) and _same_memory(layer.a, earlier.a):
        for name in _Layer.INPUT_CACHE:
            if name in earlier.__dict__:
                layer.__dict__[name] = earlier.__dict__[name]


def reuse_inputs(rows: GhostRows, earlier: GhostRows) -> None:
    """``rows`` are the records of ``earlier`` at another point: give their layers what
    ``earlier`` computed from the same input tensors. A Linear layer's input that has come back
    (a full-batch method's data, every round) is also transposed once for the book-keeping
    product (:attr:`_Layer.input_t`), and the copy is handed on with it."""
    for layers, earlier_layers in zip(rows.chunks, earlier.chunks):
        for layer, earlier_layer in zip(layers, earlier_layers):
            if (isinstance(layer, _Layer) and isinstance(earlier_layer, _Layer) and layer.stage.kind == "linear"
                    and _same_memory(layer.a, earlier_layer.a)):
                earlier_layer.input_t  # noqa: B018 - built on the first return of this input
            _share_input(layer, earlier_layer)


def _same_memory(x: Tensor, y: Tensor) -> bool:
    """Whether two live tensors are views of the same elements (hence equal)."""
    return (x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
            and x.dtype == y.dtype and x.device == y.device)


def _weighted_sum(chunks: tuple[tuple, ...], sizes: tuple[int, ...], weights: Tensor, layout: Layout,
                  like: Tensor) -> Tensor:
    total = like.new_zeros(layout.dim)
    for layers, w in zip(chunks, weights_in(weights, like.dtype).to(like.device).split(sizes)):
        kept = w != 0  # records with w_i = 0 are left out, not multiplied by 0 (their rows may be NaN)
        if kept.any():
            for layer in layers:
                layer.add_weighted(w, None if kept.all() else kept, total, layout)
    return total


@dataclass(frozen=True)
class GhostRows:
    """Per-record gradients of one batch, kept as per-layer ``(a, g)`` of each chunk of records.

    ``norms()`` are ghost norms, in float64: upper bounds of the norms of what ``weighted_sum``
    adds for each record per unit weight (see the module's "Rounding"), so that clipping with
    them never lets a record add more than C. ``weighted_sum(w)`` is the book-keeping sum
    Σ_i w_i ∇ℓ_i, in ``dtype`` (θ's). Both come back on ``device`` (θ's). ``self - other`` (same
    records, another θ) is the GhostRows of ``∇ℓ_i(θ) − ∇ℓ_i(θ′)``, layer by layer
    (:func:`_difference`), with exact norms (stacked ghost norms, no cancellation) and sums; it
    is not subtracted again.
    """

    chunks: tuple[tuple, ...]
    sizes: tuple[int, ...]
    layout: Layout
    like: Tensor      # an empty tensor of the computing dtype and device
    dtype: torch.dtype
    device: torch.device

    @cached_property
    def _norms(self) -> Tensor:
        sq = [sum((layer.sq_bounds() for layer in layers), self.like.new_zeros(size, dtype=torch.float64))
              for layers, size in zip(self.chunks, self.sizes)]
        if not sq:
            return self.like.new_zeros(0, dtype=torch.float64)
        # the float64 products and sums of the squared bounds, the square root and the clip weight
        # C / norm round too (a few roundings per layer, then one per layer summed); so does a sum
        # returned in a coarser dtype than it was computed in
        coarser = torch.finfo(self.dtype).eps > torch.finfo(self.like.dtype).eps
        enlarge = (1 + 2 * _gamma(2 * max(map(len, self.chunks)) + 8, U64)) * (1 + coarser * _unit(self.dtype))
        return torch.cat(sq).sqrt() * enlarge

    def norms(self) -> Tensor:
        return self._norms.to(self.device)

    def weighted_sum(self, weights: Tensor) -> Tensor:
        return _weighted_sum(self.chunks, self.sizes, weights, self.layout, self.like).to(self.device, self.dtype)

    def __sub__(self, other: GhostRows) -> GhostRows:
        if not isinstance(other, GhostRows):
            return NotImplemented
        if self.sizes != other.sizes or [len(c) for c in self.chunks] != [len(c) for c in other.chunks]:
            raise ValueError("ghost rows can only be subtracted on the same records, chunked the same way")
        difference = tuple(tuple(_difference(a, b) for a, b in zip(mine, theirs))
                           for mine, theirs in zip(self.chunks, other.chunks))
        return GhostRows(difference, self.sizes, self.layout, self.like, self.dtype, self.device)
