"""Every algorithm by name: the one registry the command line, ``Private``, ``fit``, ``tune``,
``audit`` and ``bench`` build from.

An :class:`Entry` names the function that builds the algorithm from a :class:`Knobs` value
(``"module:function"``, imported on first use, so that this module and ``dpopt --help`` import
neither torch nor dp_accounting) and says what the algorithm is: private or not, federated or
not. Each builder reads the knobs it needs and ignores the rest; noise multipliers are left at 1
for :meth:`dpopt.plan.Plan.calibrated` to scale.

Adding an algorithm: write its file under ``dpopt/algorithms/`` with a ``from_knobs(knobs)``
function, and add one :class:`Entry` line to :data:`ENTRIES` (``tests/contracts/test_algorithms.py``
then asks for its contract row). The command line, ``Private``, ``fit``, ``tune`` and ``audit`` then
offer it by name; ``tests/test_adding_an_algorithm.py`` does exactly this for a toy algorithm
(:func:`register` adds an entry defined outside this file) and runs it through ``dpopt run``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _validate
from ..names import NOISES

if TYPE_CHECKING:
    from ..base import Algorithm

#: How batches are drawn, by name (:data:`dpopt.sampling.BATCH_SAMPLINGS`).
SAMPLINGS = ("poisson", "fixed")
#: Update rules by name: the algorithm's own ("sgd"), or DP-AdamBC on its private gradient
#: (``"module:function"`` taking the built algorithm and the knobs).
OPTIMIZERS = {"sgd": None, "adambc": "dpopt.algorithms.adam:from_knobs"}


@dataclass(frozen=True)
class Knobs:
    """Every hyper-parameter an algorithm can be built with by name, for ``n`` training records.

    ``batch_size`` is the expected batch (DP-SRM's and STORM's first batch is twice it, capped at
    n; O2NC's period Σ = B1; DIFF2-BVR's local batch b); ``clip`` is C (DP-SGD, DP-SRM's C1,
    DIFF2's C1, DP-AGD, O2NC's C1) or λ (AClip); ``clip_diff`` is DP-SRM's and DIFF2's C2 (DIFF2-BVR's
    C3 too) and O2NC's C2; ``gamma`` DP-SRM's γ and STORM's momentum; ``noise_ratio`` DP-SRM's
    σ0/σ, fixed while calibrating; ``sampling`` "poisson" or "fixed"; ``obj_clip`` DP-AGD's clip of
    per-record losses; ``radius`` AClip's constraint ball; ``noise`` the kind of noise by name
    (:data:`NOISES`); O2NC: smoothing ``alpha``, m = ``directions``, M = ``window``, D =
    ``o2nc_radius``; DIFF2: P = ``clients`` (an i.i.d. equal split, seed 0), T = ``restart``, K =
    ``local_steps``, ``backend`` (a distributed backend, None: in this process), ``output_rule``
    and ``noise_ratios`` z1 : z2 [: z3]. ``bands``: banded matrix factorisation's b (None: 1, or 4
    for ``dp-bandmf``); adaptive clipping: ``clip_quantile`` γ (None: off), ``clip_lr`` and
    ``count_noise`` σ_b (None: batch/20); ``optimizer``: the update rule by name
    (:data:`OPTIMIZERS`; "adambc" takes ``lr`` as Adam's step size and ``adam_gamma`` as the floor γ
    of its corrected second moment, a hyper-parameter at DP noise levels). DPSUR (``dp-sur``): its test's
    Poisson rate ``val_rate`` q_v (None: batch_size/n), ``obj_clip`` its clip C_v of a per-record loss
    change, ``noise_ratio`` its σ_v/σ and ``threshold`` β (accept iff the noised change < β). An
    algorithm that cannot take ``bands`` > 1 or a ``clip_quantile`` refuses it with the reason
    (:meth:`Entry.build`)."""

    n: int
    batch_size: int = 256
    lr: float = 0.5
    clip: float = 1.0
    clip_diff: float = 0.01
    gamma: float = 0.01
    noise_ratio: float = 1.0
    sampling: str = "poisson"
    obj_clip: float = 1.0
    radius: float = math.inf
    noise: str = "torch"
    alpha: float = 0.1
    directions: int = 8
    window: int = 10
    o2nc_radius: float = 0.01
    clients: int = 10
    restart: int = 20
    local_steps: int = 2
    backend: Any = dataclasses.field(default=None, compare=False)
    output_rule: str = "uniform"
    noise_ratios: tuple[float, ...] | None = None
    bands: int | None = None
    clip_quantile: float | None = None
    clip_lr: float = 0.2
    count_noise: float | None = None
    optimizer: str = "sgd"
    adam_gamma: float = 1e-8
    val_rate: float | None = None
    threshold: float = 0.0

    @classmethod
    def of(cls, n: int, **given: Any) -> Knobs:
        """The knobs for ``n`` records with the hyper-parameters ``given`` by name (the others at their
        defaults); an unknown name is refused with the list of known ones."""
        known = {field.name for field in dataclasses.fields(cls)} - {"n"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise _validate.DpoptError(f"options {unknown} are not hyper-parameters of any algorithm; known: "
                                       f"{', '.join(sorted(known))}")
        return cls(n=n, **given)

    @property
    def first_batch(self) -> int:
        """The first batch of the momentum methods (DP-SRM, STORM): twice the batch, capped at n."""
        return min(self.n, 2 * self.batch_size)

    def replace(self, **changes: Any) -> Knobs:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Entry:
    """An algorithm by name: ``builder`` (``"module:function"``, the function taking
    :class:`Knobs`), a one-line ``summary``, whether it is ``private`` (a non-private reference
    has nothing to calibrate and cannot meet an ε), whether it is ``federated`` (clients and a
    server: ``--backend torch`` runs it across processes), which ``noises`` it takes, and why it
    takes no ``bands`` > 1 (correlated noise) or no ``clip_quantile`` (adaptive clipping): None
    where its builder reads them."""

    name: str
    builder: str
    summary: str
    private: bool = True
    federated: bool = False
    noises: tuple[str, ...] = NOISES
    no_bands: str | None = "it releases no noised gradient sum at one noise multiplier and sensitivity per step"
    no_clip_quantile: str | None = "adaptive clipping is DP-SGD's (per-record clipping of one gradient sum)"

    def build(self, knobs: Knobs) -> Algorithm[Any]:
        """The algorithm for ``knobs`` (its noise multipliers at 1), with the update rule
        ``knobs.optimizer``."""
        _validate.one_of("noise", knobs.noise, self.noises)
        _validate.one_of("optimizer", knobs.optimizer, OPTIMIZERS)
        if knobs.bands not in (None, 1) and self.no_bands is not None:
            raise _validate.DpoptError(f"bands={knobs.bands!r} (correlated noise) is refused for algorithm="
                                       f"{self.name!r}: {self.no_bands}")
        if knobs.clip_quantile is not None and self.no_clip_quantile is not None:
            raise _validate.DpoptError(f"clip_quantile={knobs.clip_quantile!r} (adaptive clipping) is refused for "
                                       f"algorithm={self.name!r}: {self.no_clip_quantile}")
        algorithm = _named(self.builder)(knobs)
        rule = OPTIMIZERS[knobs.optimizer]
        return algorithm if rule is None else _named(rule)(algorithm, knobs)


def _named(builder: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names (its module imported now)."""
    module, function = builder.split(":")
    return getattr(importlib.import_module(module), function)


_CONTINUOUS = ("torch", "secure")
#: DP-SRM's two kinds of release (its refusal of correlated noise).
_TWO_RELEASES = ("its first step releases at (σ0, C1) and the others at (σ, γC1 + (1−γ)C2): correlated noise "
                 "needs one noise multiplier and one sensitivity at every step")
ENTRIES = (
    Entry("dp-sgd", "dpopt.algorithms.dp_sgd:dp_sgd_from_knobs", "DP-SGD: Poisson batches, per-record clipping",
          no_bands=None, no_clip_quantile=None),
    Entry("dp-bandmf", "dpopt.algorithms.dp_sgd:bandmf_from_knobs",
          "DP-SGD with banded correlated noise over cyclic Poisson batches", no_bands=None, no_clip_quantile=None,
          noises=_CONTINUOUS),
    Entry("dp-gd", "dpopt.algorithms.dp_sgd:dp_gd_from_knobs", "DP-GD: DP-SGD on the full data every step",
          no_bands="it uses every record at every step: there are no groups to cycle through",
          no_clip_quantile="adaptive clipping is accounted on sampled batches, and DP-GD's are the full data"),
    Entry("dp-srm", "dpopt.algorithms.dp_srm:from_knobs", "DP-SRM: private recursive momentum", no_bands=_TWO_RELEASES),
    Entry("rrpsgd", "dpopt.algorithms.dp_sgd:rrpsgd_from_knobs", "RRPSGD: DP-SGD output at a random round",
          no_bands=None, no_clip_quantile=None),
    Entry("dp-agd", "dpopt.algorithms.dp_agd:from_knobs", "DP-AGD: adaptive budget, noisy step-size choice"),
    Entry("aclip", "dpopt.algorithms.aclip:from_knobs", "AClipped-dpSGD: clip the batch mean once", no_bands=None),
    Entry("storm", "dpopt.algorithms.storm:from_knobs", "STORM: non-private recursive momentum (reference)",
          private=False, noises=_CONTINUOUS),
    Entry("o2nc-zeroth", "dpopt.algorithms.o2nc:zeroth_from_knobs", "DP-O2NC, single pass, zeroth-order oracle",
          noises=_CONTINUOUS),
    Entry("o2nc-first", "dpopt.algorithms.o2nc:first_from_knobs", "DP-O2NC, single pass, first-order oracle",
          noises=_CONTINUOUS),
    Entry("o2nc-multi", "dpopt.algorithms.o2nc:multi_from_knobs", "DP-O2NC, every record every step",
          noises=_CONTINUOUS),
    Entry("diff2-gd", "dpopt.algorithms.diff2:gd_from_knobs", "DIFF2-GD: private gradient differences, P clients",
          federated=True, noises=_CONTINUOUS),
    Entry("diff2-bvr", "dpopt.algorithms.diff2:bvr_from_knobs", "DIFF2-BVR-L-SGD: DIFF2 with local steps",
          federated=True, noises=_CONTINUOUS),
    Entry("dp-sur", "dpopt.algorithms.selective:from_knobs",
          "DPSUR: a DP-SGD step kept only if a noised validation test says it lowered the loss", noises=_CONTINUOUS,
          no_bands="each step also releases a noised test on an independent batch, which correlated noise does not "
                   "account for"),
)
#: Every algorithm by name: :data:`ENTRIES`, and those :func:`register` added.
REGISTRY: dict[str, Entry] = {entry.name: entry for entry in ENTRIES}
#: The name of every algorithm of :data:`ENTRIES`, in their order.
NAMES = tuple(entry.name for entry in ENTRIES)
#: The private algorithms of :data:`ENTRIES` (a target ε can be met).
PRIVATE = tuple(entry.name for entry in ENTRIES if entry.private)
#: The federated algorithms of :data:`ENTRIES` (``--backend torch`` runs them across processes).
FEDERATED = tuple(entry.name for entry in ENTRIES if entry.federated)


def entry(name: str) -> Entry:
    """The registry's entry for ``name`` (a one-line error listing the names otherwise)."""
    return REGISTRY[_validate.one_of("algorithm", name, tuple(REGISTRY))]


def register(new: Entry) -> Entry:
    """Add ``new`` to :data:`REGISTRY` under a name not yet taken: an algorithm defined outside
    :data:`ENTRIES` (a test's, a user's) is then built, run and audited by name like the others."""
    if new.name in REGISTRY:
        raise _validate.DpoptError(f"algorithm={new.name!r} is registered already")
    REGISTRY[new.name] = new
    return new


def build(name: str, *, n: int, **given: Any) -> Algorithm[Any]:
    """Algorithm ``name`` for ``n`` records with the hyper-parameters ``given`` by name
    (:meth:`Knobs.of`), its noise multipliers at 1 for calibration."""
    return entry(name).build(Knobs.of(n, **given))
