"""The seams of dpopt: read this module first.

A private optimiser is four things composed, and each is a protocol here:

* **where the data comes from**: a :class:`Sampler` draws the records of a step, states the
  neighbouring relation its guarantee is under, the public divisor of a noised sum
  (``expected_size``) and the amplification its draw buys (``wrap``: the only place sampling
  enters the accounting);
* **what is measured on it**: an :class:`Oracle` gives per-record vectors as a
  :class:`PerRecord` (norms and weighted sums, possibly lazy) and losses; it knows nothing of
  privacy;
* **how it is made private**: :mod:`dpopt.clipping` turns per-record vectors into a
  ``Bounded`` sum of known sensitivity, and a mechanism of :mod:`dpopt.mechanisms` adds noise
  drawn from a :class:`NoiseSource` and returns the released value *with* the ``DpEvent`` of that
  release;
* **what is done with the private value**: an :class:`Algorithm`'s update rule, post-processing
  that costs no privacy.

The loop (:mod:`dpopt.train`) ties them together and records every event in a ledger, which is
checked against the algorithm's independently written ``planned_event`` (double entry), the same
description that calibrated its noise (:class:`dpopt.plan.Plan`).

Optional capabilities are protocols too (:class:`Directed`, :class:`KeyedSampling`,
:class:`NoiseVariance`, :class:`Wrapper`, :class:`Averaged`, :class:`SelfDiagnosing`, :class:`Reporting`,
:class:`ClosedForm`, :class:`SharedNoise`, :class:`Digested`, :class:`ShareOfBatch`, :class:`NamedNoise`,
:class:`AlongDirections`, :class:`Delegating`, :class:`Regularised`, :class:`ModelDigested`): code asks
``isinstance(x, Capability)`` instead of probing attributes (once per run where the answer is
needed every step: the check costs tens of microseconds).

This module imports nothing of dpopt, so every other module may import it, and torch only for
type checking, so the torch-free accounting may too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, runtime_checkable

from dp_accounting import DpEvent, NeighboringRelation

if TYPE_CHECKING:
    import torch
    from torch import Tensor

S = TypeVar("S")  #: an algorithm's state: a NamedTuple of tensors and numbers
S_in = TypeVar("S_in", contravariant=True)  #: the same, in a protocol that only reads a state


@runtime_checkable
class Sampler(Protocol):
    """Which records a step sees: the relation its guarantee is under, the public divisor of a
    noised sum (never the realised, private batch size), the draw, and the amplification the draw
    buys."""

    relation: NeighboringRelation

    @property
    def expected_size(self) -> float: ...

    def sample(self, gen: torch.Generator) -> Tensor:
        """The indices of the records of this step, drawn from ``gen`` (the run's secret sampling
        generator)."""
        ...

    def wrap(self, event: DpEvent) -> DpEvent:
        """The event of a mechanism run on this step's records, amplified by the sampling."""
        ...


@dataclass(frozen=True)
class Batch:
    """The records step ``t`` sees and the sampler that chose them (for ``wrap`` and the public
    divisor ``sampler.expected_size``)."""

    t: int
    indices: Tensor
    sampler: Sampler


@runtime_checkable
class PerRecord(Protocol):
    """Per-record vectors of one batch, possibly in a lazy form (never materialised as ``[B, d]``)."""

    def norms(self) -> Tensor:
        """``[B]``: the L2 norm of each record's vector (an upper bound, never below it)."""
        ...

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """``Σ_i w_i · row_i`` as a new ``[d]`` tensor (the caller may modify it in place); rows
        with ``w_i = 0`` contribute exactly 0."""
        ...


class Rows(PerRecord, Protocol):
    """The per-record gradients an oracle returns: rows of the same records at two points
    subtract, ``rows(θ) − rows(θ′)`` being the rows ∇f_i(θ) − ∇f_i(θ′) (what DP-SRM and DIFF2
    clip), in the same lazy form."""

    def __sub__(self, other: Self) -> Self: ...


@runtime_checkable
class Oracle(Protocol):
    """What an algorithm may ask about the training data: per-record gradients and losses at θ.
    Per-record results must depend on record i alone (that is what makes clipping bound a
    record's influence)."""

    n: int
    dim: int

    def per_record(self, theta: Tensor, indices: Tensor) -> Rows:
        """∇f_i(θ) for the records ``indices``."""
        ...

    def loss(self, theta: Tensor, indices: Tensor | None = None) -> Tensor:
        """F(θ) on ``indices`` (all records for None), regulariser included."""
        ...

    def per_record_loss(self, thetas: Tensor, indices: Tensor) -> Tensor:
        """``[B, K]``: f_i at each of the K points ``thetas [K, d]``."""
        ...

    def regulariser(self, theta: Tensor) -> Tensor: ...

    def gradient(self, theta: Tensor) -> Tensor:
        """∇F(θ) on all records."""
        ...

    def gradient_sum(self, theta: Tensor, indices: Tensor | None) -> Tensor:
        """Σ_{i ∈ indices} ∇f_i(θ) (all records for None)."""
        ...


class Scored(Oracle, Protocol):
    """An oracle that also measures θ's error on records outside it (a misclassification rate, or
    the model's regression error)."""

    def error(self, theta: Tensor, X: Tensor, y: Tensor) -> float: ...


@runtime_checkable
class NoiseSource(Protocol):
    """Where the randomness of a run comes from: the noise of every release and the other random
    draws the guarantee relies on (random points, directions, output picks). The guarantee needs
    it secret: whoever can predict the noise can subtract it."""

    generator: torch.Generator  #: the other draws of the run (saved in checkpoints)

    def gaussian(self, like: Tensor, std: float) -> Tensor:
        """N(0, std² I) shaped like ``like``, in its dtype and on its device."""
        ...

    def gumbel(self, like: Tensor, scale: float) -> Tensor:
        """i.i.d. Gumbel(0, scale) shaped like ``like``."""
        ...


@runtime_checkable
class Algorithm(Protocol[S]):
    """A private optimiser: a frozen dataclass of hyper-parameters, validated in ``__post_init__``.

    ``step`` returns the new state and the event of everything it released, built only from what
    its mechanisms returned (wrapped by the batch's sampler); ``planned_event(n, steps)`` is the
    independent description of the whole run that calibrates the noise and that the ledger is
    checked against. ``NOISE_FIELDS`` name the noise multipliers calibration scales, in the
    ratios ``noise_ratios``.
    """

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass: calibration replaces its noise fields
    NOISE_FIELDS: tuple[str, ...]
    noise_ratios: tuple[float, ...]

    def relation(self) -> NeighboringRelation: ...

    def sampler(self, t: int, n: int) -> Sampler: ...

    def init(self, theta0: Tensor, steps: int, gen: torch.Generator) -> S: ...

    def step(self, state: S, batch: Batch, oracle: Oracle, source: NoiseSource) -> tuple[S, DpEvent]: ...

    def output(self, state: S) -> Tensor: ...

    def planned_event(self, n: int, steps: int) -> DpEvent: ...


@runtime_checkable
class Directed(Protocol[S]):
    """An algorithm whose update is θ_{t+1} = θ_t − η_t·g̃_t, with g̃_t its private gradient
    estimate (its noised release after its own post-processing): ``direction(state)`` is the g̃_t
    of the step that produced ``state``; ``moved(state, theta)`` is that state with θ_{t+1}
    replaced by ``theta`` (what another update rule made of g̃_t: post-processing)."""

    def direction(self, state: S) -> Tensor: ...

    def moved(self, state: S, theta: Tensor) -> S: ...


@runtime_checkable
class KeyedSampling(Protocol[S_in]):
    """An algorithm whose batches depend on a secret drawn into its state at ``init`` (cyclic
    Poisson sampling's group key): ``batch_sampler(state, t, n)`` is the sampler step t draws
    from. Its ``sampler(t, n)`` still says everything planning needs (relation, public divisor,
    amplification) but refuses to draw, so a caller that forgets the state cannot silently
    sample from another distribution. :func:`dpopt.train.step` takes the answer of
    ``isinstance(algorithm, KeyedSampling)``, asked once per run."""

    def batch_sampler(self, state: S_in, t: int, n: int) -> Sampler: ...


@runtime_checkable
class NoiseVariance(Protocol[S_in]):
    """A :class:`Directed` algorithm whose private gradient g̃_t carries isotropic Gaussian noise
    of a public variance: ``release_variance(state)`` is Φ_t, the variance per coordinate of the
    noise in ``direction(state)`` (a function of the hyper-parameters, the step and released
    values only: what a bias correction may subtract as post-processing)."""

    def release_variance(self, state: S_in) -> float: ...


@runtime_checkable
class Wrapper(Protocol[S]):
    """An algorithm that runs another's releases and only post-processes them (an update rule of
    its own): ``inner`` is that algorithm (of state ``S``), whose noise multipliers
    (``NOISE_FIELDS``) and planned event are the wrapper's; ``around(inner)`` is the same wrapper
    around another (e.g. the inner with calibrated noise)."""

    @property
    def inner(self) -> Algorithm[S]: ...

    def around(self, inner: Algorithm[S]) -> Self: ...


@runtime_checkable
class Averaged(Protocol[S_in]):
    """An algorithm whose output is an average of its iterates: ``running_output(state)`` is that
    output so far (what a log point measures instead of the current iterate)."""

    def running_output(self, state: S_in) -> Tensor: ...


@runtime_checkable
class SelfDiagnosing(Protocol[S_in]):
    """An algorithm that counts something about its own run (e.g. how often a clip bit): NOT
    PRIVATE diagnostics, written only when asked for."""

    def diagnostics(self, state: S_in) -> Mapping[str, float]: ...


@runtime_checkable
class Reporting(Protocol[S_in]):
    """An algorithm that counts something about its own run from its noised releases alone (e.g. how
    many candidate steps a noised test accepted): private outputs, written with the run's final
    metrics (their names are listed in :data:`dpopt.outputs.RELEASED_COUNTS`)."""

    def released_counts(self, state: S_in) -> Mapping[str, float]: ...


@runtime_checkable
class ClosedForm(Protocol):
    """An oracle whose gradients are closed-form (no autograd): steps run in inference mode."""

    closed_form: bool


@runtime_checkable
class Pointwise(Oracle, Protocol):
    """An oracle that also evaluates each record at points of its own (zeroth-order and smoothed
    gradient estimates, O2NC): ``losses_at(points [B, K, d], indices)`` is ``[B, K]``, f_i at
    record i's K points; ``gradients_at`` the same for ∇f_i, ``[B, K, d]``."""

    def losses_at(self, points: Tensor, indices: Tensor) -> Tensor: ...

    def gradients_at(self, points: Tensor, indices: Tensor) -> Tensor: ...


@runtime_checkable
class SharedNoise(Protocol):
    """A data-parallel oracle: every process adds the same noise draw (one shared seed), so a
    noise source that draws independently per process would add noise more than once."""

    shares_noise: bool


@runtime_checkable
class ShareOfBatch(Protocol):
    """Per-record vectors of one process's share of a batch (data-parallel): ``batch_total(local)``
    is a per-share total (e.g. a count over this share's records) summed over every process."""

    def batch_total(self, local: Tensor) -> Tensor: ...


@runtime_checkable
class Digested(Protocol):
    """An oracle that can tell its training data from other data (checkpoints record it)."""

    @property
    def data_digest(self) -> str: ...


@runtime_checkable
class ModelDigested(Protocol):
    """An oracle that can tell its model (a module's structure and loss) from another's
    (checkpoints record it; a closed-form oracle's model is its type)."""

    @property
    def model_digest(self) -> str: ...


@runtime_checkable
class Regularised(Protocol):
    """An oracle with a public regularisation weight ``reg`` (checkpoints record it)."""

    reg: float


@runtime_checkable
class Delegating(Protocol):
    """An oracle that wraps ``oracle`` and runs the same problem (a data-parallel rank's share,
    counted calls): what a resume compares is the wrapped oracle's."""

    oracle: Oracle


@runtime_checkable
class AlongDirections(Protocol):
    """An oracle with a fast path for the two-point estimator: ``losses_along(x, directions [B, m, d],
    alpha, indices)`` is ``[B, 2m]``, f_i(x + α y_ij) for j < m then f_i(x − α y_ij), what
    :meth:`Pointwise.losses_at` gives at those points."""

    def losses_along(self, x: Tensor, directions: Tensor, alpha: float, indices: Tensor) -> Tensor: ...


@runtime_checkable
class NamedNoise(Protocol):
    """An algorithm whose releases draw from the noise it names as ``noise`` (a continuous or the
    exact discrete Gaussian, :mod:`dpopt.mechanisms`)."""

    noise: object
