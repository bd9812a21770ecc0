"""Any ``torch.nn.Module`` as an oracle, on one flat parameter vector θ (docs/design.md rule 5).

``TorchModel(module, loss_fn, X, y)`` measures the per-record loss ``loss_fn(module(x), y)``
(``reduction="none"``: one value per record) of the records ``(X[i], y[i])``. Wherever a
per-record quantity feeds a bound (per-record gradients and losses, under both engines), the loss
of record i is ``loss_fn`` on a batch of that record alone, ``loss_fn(out_i[None], y_i[None])``,
evaluated for all records at once under ``torch.func.vmap``: a loss that reads other records of
its batch (one centred on the batch mean, an in-batch contrastive loss) sees none there, so it
cannot carry one record into another's clipped gradient. θ is one flat tensor; the module's
trainable parameters (``requires_grad=True``, in ``named_parameters()`` order) are views into it,
passed with ``torch.func.functional_call`` (frozen parameters and buffers stay the module's own).
The module itself is never modified; :meth:`TorchModel.load` copies a θ into it explicitly.

Engines for per-record gradients (``engine=``):

* ``"vmap"``: ``vmap(grad(ℓ))`` over the records, in chunks of ``microbatch_size``:
  :class:`~dpopt.clipping.Dense` rows ``[B, d]``. Works for any module whose records do not
  interact (tied weights too); memory O(B·d) for the rows of the whole batch.
* ``"ghost"``: ghost norms and book-keeping sums from one forward/backward per chunk, never a ``[B, d]`` matrix: it
  keeps each layer's input and output gradient for the batch (the memory of one non-private step on it; a first Linear
  layer that takes the records themselves keeps their indices and reads them in place:
  :mod:`dpopt.oracles.ghost.in_place`). See :mod:`dpopt.oracles.ghost` for the rules and their limits. Ghost rules for
  Linear (also on ``[B, T, p]``), zero-padded Conv1d/Conv2d, Embedding, LayerNorm and GroupNorm, found at any depth,
  also inside modules with their own forward. Only layers whose per-record structure is known (``known_layers``, a
  :class:`~dpopt.oracles.ghost.Registry`: those, activations, pooling, Flatten, dropout, ...) and ``nn.Sequential``'s
  own forward are run on the whole batch; every other module, and every custom forward, is run on each record alone
  under ``vmap`` (its ghost layers tapped by hooks removed after the call), so code that mixes the records of a batch
  cannot leak one record into another's gradient. Its norms are upper bounds of what its sums add per record (never
  below, by ~1e−6 in float32). Gradient differences at two points (DP-SRM) are exact, without cancellation.

Both give the same norms and clipped sums (tests hold them to 1e−9 relative in float64, 1e−4 in
float32, of each other and of a per-record autograd loop). DP-SRM's differences cost one
forward/backward per point and nothing more: ``per_record(θ, B) - per_record(θ′, B)``.

Computations without per-record gradients (``loss``, ``gradient_sum``, ``error``) run on the whole
chunk, the loss too: with the ghost engine by its forward where its plan runs every stage on the
whole batch (convolutions and max-pools in channels-last layout), else by the module's own
forward. Records need not be kept apart there (the module's own forward may mix them): what
releases such a sum bounds it as an aggregate (AClip's ``clipping.clip_aggregate``: sensitivity 2λ
whatever the batch does).

Every per-record result comes back in θ's dtype (norms of float32 gradients in float64, as
``clipping.Dense`` measures them) and on θ's device (``dpopt.run`` passes a float64 θ; a float32
module then computes in float32); the work is done in the module's dtype on its device, data
chunks being moved there (X may stay on the CPU while the module is on a GPU). ``microbatch_size``
bounds the records processed at once (the vmap rows, the ghost engine's per-layer products, the
full-data loss and gradient); results do not depend on it.

The modules refused (BatchNorm, torch's recurrent layers, running statistics) and the buffers no
forward may change, with the reasons: :mod:`dpopt.oracles.guards`. torch's errors in code run on
each record alone under vmap come back as ``DpoptError``s that name the module or the loss and
keep torch's message. Stochastic layers (dropout) draw from torch's global
generator, not the run's (docs/design.md rule 4 covers the privacy noise, not the model's own
randomness); in both engines one forward feeds both the norms and the sums, so each record's
clipped contribution is exactly bounded even so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from collections.abc import Callable, Iterator
from typing import cast

import torch
from torch import Tensor, nn
from torch.func import grad, grad_and_value, vmap

from .. import _validate
from ..clipping import Dense
from . import ghost, records
from .guards import reject_batch_norm, reject_recurrent, reject_running_stats, unchanged_buffers
from .layout import Layout, call, callable_fingerprint

ENGINES = ("vmap", "ghost")
#: Why the module and the loss run on each record alone (the messages of TorchModel._torch_errors).
_MODULE_APART = "no record can reach another's gradient or loss"
_LOSS_APART = ("a record's loss cannot read other records (a loss that couples the records of a batch would let one "
               "record move the others' clipped gradients)")
RECENT = 2  #: per-record results kept for reuse (the two points of a gradient difference)


def _keeps_buffers(method: Callable) -> Callable:
    """``method`` of :class:`TorchModel` under :func:`unchanged_buffers` and ``records.chunks_of``."""

    @functools.wraps(method)
    def guarded(self: TorchModel, *args: object, **kwargs: object) -> object:
        with unchanged_buffers(self._modules), records.chunks_of(self.records):
            return method(self, *args, **kwargs)

    return guarded


class TorchModel:
    """Per-record gradients of ``loss_fn(module(x), y)`` over the records of ``(X, y)``.

    ``module``: an ``nn.Module`` without BatchNorm, torch's recurrent layers or running statistics, whose forward
    changes no buffer and whose records do not interact, except inside modules that ``engine`` runs per record (all
    of them for "vmap"; for "ghost", every module not in ``known_layers``); ``loss_fn(output, target) -> [B]``, run
    on each record alone (under vmap) wherever a per-record quantity is computed; ``X [n, ...]``, ``y [n, ...]``
    tensors, or ``X`` a map-style Dataset of ``(x, y)`` pairs and ``y`` None, read lazily by index
    (:mod:`dpopt.oracles.records`; floating-point X is cast to the module's dtype chunk by chunk; they are not to be
    modified after: the oracle reuses the records and the per-record results of its recent calls); ``engine``:
    "ghost" (default) or "vmap"; ``known_layers``: the layer types the ghost engine may run on the whole batch
    (:data:`~dpopt.oracles.ghost.KNOWN_LAYERS`, extended with ``.with_per_record(MyLayer)``); ``microbatch_size``:
    records per chunk of every per-record or full-data computation (memory, not results). The default, 512, keeps a
    Poisson batch of expected size 256 (256 ± 16) in one chunk: each extra chunk is one more forward/backward with
    its fixed cost (~10 % of a step of the MNIST CNN).
    """

    def __init__(self, module: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], X: Tensor | records.Records,
                 y: Tensor | None = None, *,
                 engine: str = "ghost", microbatch_size: int = 512,
                 known_layers: ghost.Registry = ghost.KNOWN_LAYERS) -> None:
        if not isinstance(module, nn.Module):
            raise _validate.DpoptError(f"module={type(module).__name__} must be a torch.nn.Module")
        reject_batch_norm(module)
        reject_recurrent(module)
        reject_running_stats(module)
        self.engine = _validate.one_of("engine", engine, ENGINES)
        if not isinstance(known_layers, ghost.Registry):
            raise _validate.DpoptError(f"known_layers={type(known_layers).__name__} must be a "
                                       "dpopt.oracles.ghost.Registry (e.g. ghost.KNOWN_LAYERS.with_per_record(...))")
        self.microbatch_size = _validate.positive_int("microbatch_size", microbatch_size)
        self.records = records.of(X, y)
        if isinstance(self.records, records.Tensors):
            self.X, self.y = self.records.X, self.records.y
        params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        if not params:
            raise _validate.DpoptError("module has no trainable parameters (requires_grad=True)")
        kinds = {(p.dtype, p.device) for p in params.values()}
        if len(kinds) > 1 or not next(iter(kinds))[0].is_floating_point:
            raise _validate.DpoptError(f"module parameters must share one floating dtype and device, got {kinds}")
        self.module, self.loss_fn = module, loss_fn
        self._modules = tuple(module.named_modules(remove_duplicate=False))  # whose buffers no forward may change
        self.dtype, self.device = next(iter(kinds))
        self.layout = Layout.of(module)
        self.n, self.dim = len(self.records), self.layout.dim
        self.stages = (ghost.plan(module, {id(p): name for name, p in params.items()}, known_layers)
                       if engine == "ghost" else ())
        self._gathered: tuple[Tensor | None, list[tuple[Tensor, Tensor]]] = (None, [])
        self._input_grams = ghost.InputGrams(self.records)  # kept by record (a layer that takes the data itself)
        self._recent: list[tuple[Tensor, Tensor, Dense | ghost.GhostRows, Tensor]] = []
        self._seen: list[tuple[Tensor, Tensor]] | None = None  # (point, per-record losses) in losses_seen()
        self._evaluated: list[Tensor] = []  # the per-record losses of the chunks of the running _per_record

    # ------------------------------------------------------------------------------ helpers

    @functools.cached_property
    def data_digest(self) -> str:
        """sha256 of the training data (X and y), computed once: checkpoints of other data differ."""
        return self.records.digest()

    @functools.cached_property
    def model_digest(self) -> str:
        """sha256 of what the gradients are taken of besides θ and the data: the module's structure
        (its repr, parameter and buffer names, shapes and dtypes) and the loss function (its code
        where it has some, else its repr). A checkpoint resumed with another module or loss of the
        same size would replay the run's noise at other gradients: its settings differ."""
        parts = [type(self.module).__qualname__, repr(self.module), self.engine]
        parts += [f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in
                  (*self.module.named_parameters(), *self.module.named_buffers())]
        parts.append(callable_fingerprint(self.loss_fn))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def flat_params(self) -> Tensor:
        """θ0: the module's current trainable parameters, flattened (a copy)."""
        params = dict(self.module.named_parameters())
        return torch.cat([params[name].detach().reshape(-1) for name in self.layout.names])

    def load(self, theta: Tensor) -> nn.Module:
        """Copy θ into the module's parameters (for inference with the plain module); returns it."""
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            views = self.layout.views(self._theta(theta))
            for name in self.layout.names:
                params[name].copy_(views[name])
        return self.module

    def rules(self) -> list[tuple[str, str]]:
        """For engine="ghost": ``(layer path, "ghost" | "vmap")`` of each layer with trainable
        parameters and of each parameter-free module run per record (not known to act on each
        record on its own)."""
        return ghost.describe(self.stages)

    def _theta(self, theta: Tensor) -> Tensor:
        theta = torch.as_tensor(theta)
        if theta.shape != (self.dim,):
            raise _validate.DpoptError(f"theta.shape={tuple(theta.shape)} must be ({self.dim},)")
        return theta.to(self.device, self.dtype)

    def _chunks(self, indices: Tensor | None) -> list[tuple[Tensor, Tensor]]:
        """``(x, y)`` chunks of at most ``microbatch_size`` records, on the module's device.

        All records (``None``) are sliced, not gathered. The chunks of the last explicit
        ``indices`` are kept and reused when the same indices come again: a full-batch
        algorithm (DIFF2, DP-GD) asks for the same records twice a round, and gathering a large
        data set (BlogFeedback: 48k × 280 float64) costs as much as the forward pass."""
        if indices is None:
            return [self._on_device(x, y) for x, y in self.records.chunks(self.microbatch_size)]
        indices = torch.as_tensor(indices).cpu()
        last_indices, last_chunks = self._gathered
        if last_indices is not None and torch.equal(last_indices, indices):
            return last_chunks
        chunks = [self._on_device(*self.records.gather(part)) for part in self._parts(indices)]
        self._gathered = (indices.clone(), chunks)
        return chunks

    def _parts(self, indices: Tensor) -> tuple[Tensor, ...]:
        """The records of each chunk :meth:`_chunks` gathers for ``indices``, in order."""
        return torch.as_tensor(indices).cpu().split(self.microbatch_size) if len(indices) else ()

    def _on_device(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        x = x.to(self.device, self.dtype) if x.is_floating_point() else x.to(self.device)
        y = y.to(self.device, self.dtype) if y.is_floating_point() else y.to(self.device)
        return x, y

    def _losses(self, out: Tensor, y: Tensor) -> Tensor:
        losses = self.loss_fn(out, y)
        if losses.shape != (len(y),):
            raise _validate.DpoptError(f"loss_fn returned shape {tuple(losses.shape)} for {len(y)} records: it must "
                                       "return one loss per record (reduction='none')")
        return losses

    def _each_loss(self, out: Tensor, y: Tensor) -> Tensor:
        """``[B]``: ℓ_i of each record of a chunk from the outputs ``out``, each record alone
        (:meth:`_loss_alone` under vmap: one batched call of the loss, not a loop)."""
        with self._torch_errors(self._loss_name, _LOSS_APART):
            return vmap(self._loss_alone, randomness="different")(out, y)

    def _loss_alone(self, out_i: Tensor, y_i: Tensor) -> Tensor:
        """ℓ_i = ``loss_fn`` on a batch of the one record i. A loss that reads the other records
        of its batch (one centred on the batch mean, an in-batch contrastive loss) sees none
        here, so it cannot carry one record into another's gradient or loss."""
        with self._torch_errors(self._loss_name, _LOSS_APART):
            return self._losses(out_i.unsqueeze(0), y_i.unsqueeze(0)).sum()

    def _record_loss(self, params: dict[str, Tensor], x_i: Tensor, y_i: Tensor) -> Tensor:
        """ℓ(θ; x_i, y_i) of one record alone (run under vmap): the module on a batch of one
        (``params``: :meth:`Layout.views` of θ), then :meth:`_loss_alone`."""
        with self._torch_errors(self._module_name, _MODULE_APART):
            out = call(self.module, params, x_i.unsqueeze(0))
        return self._loss_alone(out.squeeze(0), y_i)

    def _one_loss(self, theta: Tensor, x_i: Tensor, y_i: Tensor) -> Tensor:
        """:meth:`_record_loss` at a flat θ."""
        return self._record_loss(self.layout.views(theta), x_i, y_i)

    @contextlib.contextmanager
    def _torch_errors(self, what: str, why: str) -> Iterator[None]:
        """torch's errors of ``what`` (a name, e.g. ``loss_fn='contrastive'``), run on each record
        alone under ``torch.func.vmap`` so that ``why``, as :class:`DpoptError` keeping torch's message."""
        try:
            yield
        except RuntimeError as error:
            raise _validate.DpoptError(
                f"{what} is run on each record alone under torch.func.vmap so that {why}, and it failed there: "
                f"{str(error).rstrip('. ')}. Write it with vmap-compatible operations (no .item() or Python branching "
                "on tensor values, no in-place writes to buffers or other tensors it does not own)") from error

    def _records_alone(self) -> contextlib.AbstractContextManager[None]:
        """:meth:`_torch_errors` of the module and the loss run together on each record alone."""
        return self._torch_errors(f"{self._module_name} with {self._loss_name}", _MODULE_APART)

    @property
    def _module_name(self) -> str:
        return f"module={type(self.module).__name__!r}"

    @property
    def _loss_name(self) -> str:
        """A function's qualified name, else its type's (an ``nn.Module`` loss)."""
        return f"loss_fn={getattr(self.loss_fn, '__qualname__', type(self.loss_fn).__name__)!r}"

    @functools.cached_property
    def _plan_runs_whole_batch(self) -> bool:
        """Whether the ghost engine's plan runs every stage on the whole batch (no stage run per
        record: an ``nn.Sequential`` of known layers, such as the MNIST CNN)."""
        return bool(self.stages) and all(stage.kind not in ("block", "isolated") for stage in self.stages)

    def _batch_outputs(self, theta: Tensor, x: Tensor) -> Tensor:
        """The module's outputs on a chunk whose records need not be kept apart (:meth:`loss`,
        :meth:`gradient_sum`, :meth:`error`): the ghost engine's forward where its plan runs every
        stage on the whole batch, the same function with convolutions and max-pools in
        channels-last layout, PyTorch's faster CPU kernels (:func:`~dpopt.oracles.ghost.forward`;
        an AClip step of the MNIST CNN, batch 256: 15 ms against 23 ms); else the module's own
        forward (a stage the engine runs per record under vmap would only be slower here)."""
        views = self.layout.views(theta)
        if not self._plan_runs_whole_batch:
            return call(self.module, views, x)
        return ghost.forward(self.stages, views, x, taps=False)[0]

    # ------------------------------------------------------------------------ the oracle

    def per_record(self, theta: Tensor, indices: Tensor) -> Dense | ghost.GhostRows:
        """Per-record gradients ∇ℓ_i(θ) of the records ``indices``, as a PerRecord
        (``norms()``, ``weighted_sum(w)``, and ``a - b`` for two points on the same records).

        The results of the last :data:`RECENT` calls are kept (they are immutable) and returned
        again for an equal θ and equal indices: a full-batch method that uses gradient
        differences (DIFF2) needs ∇ℓ_i(x_{r−1}) in round r and again in round r + 1. A call on
        the records of the previous call reuses what was computed from their data
        (:func:`~dpopt.oracles.ghost.reuse_inputs`: input row norms, and a transposed copy of
        a Linear layer's input for the book-keeping product)."""
        point = self._theta(theta)
        indices = torch.as_tensor(indices)
        for old_point, old_indices, rows, losses in self._recent:
            if torch.equal(old_indices, indices) and torch.equal(old_point, point):
                break
        else:
            self._evaluated = []
            rows = self._per_record(point, indices, theta)
            losses = torch.cat(self._evaluated or [point.new_zeros(0)])
            if self._recent and isinstance(rows, ghost.GhostRows) and torch.equal(self._recent[0][1], indices):
                ghost.reuse_inputs(rows, cast(ghost.GhostRows, self._recent[0][2]))  # (one engine: rows alike)
            self._recent = [(point.clone(), indices.clone(), rows, losses), *self._recent[: RECENT - 1]]
        if self._seen is not None:
            self._seen.append((point.clone(), losses))
        return rows

    @_keeps_buffers
    def _per_record(self, point: Tensor, indices: Tensor, theta: Tensor) -> Dense | ghost.GhostRows:
        """The rows; the per-record losses their forward evaluated go to ``_evaluated``, chunk by chunk."""
        if self.engine == "vmap":
            rows = [self._dense_rows(point, x, y) for x, y in self._chunks(indices)]
            return Dense((torch.cat(rows) if rows else point.new_zeros(0, self.dim)).to(theta.device, theta.dtype))
        inplace, parts = ghost.reads_in_place(self.stages, self.records, self.dtype, self.device), self._parts(indices)
        chunks = ghost.unread(self.records, parts, self._on_device) if inplace else self._chunks(indices)
        layers = []
        with torch.enable_grad():  # the layers' output gradients come from autograd, even under no_grad
            views = self.layout.views(point.detach().requires_grad_(True))
            for (x, y), part in zip(chunks, parts, strict=True):
                out, taps = (ghost.forward_in_place(self.stages, views, self.records, x, self._input_grams) if inplace
                             else ghost.forward(self.stages, views, x))
                losses = self._each_loss(out, y)
                self._evaluated.append(losses.detach())
                layers.append(self._input_grams.attach(ghost.capture(taps, losses.sum()), x, part))
        return ghost.GhostRows(tuple(layers), tuple(len(y) for _, y in chunks), self.layout, point.new_empty(0),
                               theta.dtype, theta.device)

    def _dense_rows(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        with self._records_alone():
            grads, losses = vmap(grad_and_value(self._record_loss), in_dims=(None, 0, 0), randomness="different")(
                self.layout.views(theta), x, y)
        self._evaluated.append(losses.detach())
        # an aliased parameter's gradient is the sum over its names (each name is one use of it)
        return torch.cat([sum(grads[alias] for alias in aliases).reshape(len(x), -1)
                          for aliases in self.layout.aliases], dim=1)

    @contextlib.contextmanager
    def losses_seen(self) -> Iterator[Callable[[Tensor], float]]:
        """Keep, within the block, the per-record losses ℓ_i(θ) that gradients are taken of anyway (no
        forward added: :meth:`per_record`, either engine; :meth:`gradient_sum`) with their points θ;
        yields ``mean_at(θ)``: the mean of the first losses kept at θ (NaN if none)."""
        seen: list[tuple[Tensor, Tensor]] = []
        self._seen = seen
        try:
            yield lambda theta: next((float(losses.mean()) for point, losses in seen
                                      if torch.equal(point, self._theta(theta))), math.nan)
        finally:
            self._seen = None

    @_keeps_buffers
    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        """F(θ) = mean_i ℓ_i(θ) over ``indices`` (default all records); differentiable in θ."""
        point = self._theta(theta)
        chunks = self._chunks(indices)
        total = sum((self._losses(self._batch_outputs(point, x), y).sum() for x, y in chunks), point.new_zeros(()))
        count = sum(len(y) for _, y in chunks)
        return (total / count if count else total * float("nan")).to(theta.device, theta.dtype)

    @_keeps_buffers
    def gradient_sum(self, theta: Tensor, indices: Tensor | None) -> Tensor:
        """Σ_{i ∈ indices} ∇ℓ_i(θ) (all records for None): one ordinary backward per chunk, no
        per-record gradients (the forward of :meth:`_batch_outputs`)."""
        leaf = self._theta(theta).detach().requires_grad_(True)
        total, losses = torch.zeros_like(leaf), [leaf.new_zeros(0)]
        with torch.enable_grad():
            for x, y in self._chunks(indices):
                losses.append(self._losses(self._batch_outputs(leaf, x), y))
                (g,) = torch.autograd.grad(losses[-1].sum(), leaf, allow_unused=True)
                if g is not None:
                    total += g
        if self._seen is not None:
            self._seen.append((leaf.detach().clone(), torch.cat(losses).detach()))
        return total.to(theta.device, theta.dtype)

    def gradient(self, theta: Tensor) -> Tensor:
        """∇F(θ) over all records (one backward per chunk)."""
        return self.gradient_sum(theta, None) / self.n

    @_keeps_buffers
    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: ℓ_i(θ_k) of the records ``indices`` at the K points ``thetas [K, d]``, each
        record's loss computed as its gradient is (records kept apart: DP-AGD bounds each record's
        clipped loss, so no record may move another's)."""
        with torch.no_grad():
            columns = [torch.cat([self._record_losses(self._theta(t), x, y) for x, y in self._chunks(indices)]
                                 or [torch.zeros(0, dtype=self.dtype, device=self.device)]) for t in thetas]
        return torch.stack(columns, dim=1).to(thetas.device, thetas.dtype)

    def _record_losses(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """ℓ_i(θ) of each record of a chunk: the ghost engine's forward (modules not known to act
        on each record on their own run per record), or each record alone under vmap."""
        if self.engine == "vmap":
            with self._records_alone():
                return vmap(self._one_loss, in_dims=(None, 0, 0), randomness="different")(theta, x, y)
        out, _ = ghost.forward(self.stages, self.layout.views(theta), x, taps=False)
        return self._each_loss(out, y)

    @_keeps_buffers
    def losses_at(self, points: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: ℓ_i(θ_ik) of record i at its own K points ``points [B, K, d]``."""
        at_points = vmap(self._one_loss, in_dims=(0, None, None))
        with torch.no_grad(), self._records_alone():
            parts = [vmap(at_points)(chunk.to(self.device, self.dtype), x, y)
                     for chunk, (x, y) in zip(points.split(self.microbatch_size), self._chunks(indices))]
        return torch.cat(parts).to(points.device, points.dtype)

    @_keeps_buffers
    def gradients_at(self, points: Tensor, indices: Tensor) -> Tensor:
        """``[B, K, d]``: ∇ℓ_i(θ_ik) of record i at its own K points ``points [B, K, d]``."""
        at_points = vmap(grad(self._one_loss), in_dims=(0, None, None))
        with self._records_alone():
            parts = [vmap(at_points)(chunk.to(self.device, self.dtype), x, y)
                     for chunk, (x, y) in zip(points.split(self.microbatch_size), self._chunks(indices))]
        return torch.cat(parts).to(points.device, points.dtype)

    def regulariser(self, theta: Tensor) -> Tensor:
        """r(θ) = 0: a module's loss has no separate data-independent term."""
        return torch.zeros((), dtype=theta.dtype, device=theta.device)

    @_keeps_buffers
    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float:
        """Classification error on ``(X, y)``: argmax of the outputs vs integer labels, or, for one
        output per record, ``output > 0`` vs ``y > 0`` (labels {0, 1} or {−1, +1})."""
        point, wrong = self._theta(theta), 0
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        with torch.no_grad():
            for part in torch.arange(len(X)).split(self.microbatch_size):
                x = X[part].to(self.device, self.dtype) if X.is_floating_point() else X[part].to(self.device)
                out = self._batch_outputs(point, x)
                labels = y[part].to(self.device)
                if out.ndim == 1 or out.shape[-1] == 1:
                    wrong += int(((out.reshape(-1) > 0) != (labels.reshape(-1) > 0)).sum())
                else:
                    wrong += int((out.argmax(dim=-1) != labels).sum())
        return wrong / len(X)
