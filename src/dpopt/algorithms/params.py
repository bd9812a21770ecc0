"""Each algorithm's hyper-parameters: one frozen dataclass per algorithm, which its registry
:class:`~dpopt.algorithms.registry.Entry` carries and its builder takes.

Every field but ``n`` (the number of training records, not a hyper-parameter) is declared with
:func:`knob`, whose ``metadata`` the command line reads: the flag's help, the type of a value given
there (where the default is None), its choices, the check of its allowed range (refused when the
command line is read, naming the flag), whether a private tuning may vary it, and which commands
(``run``, ``tune``, ``audit``) offer it as a flag. The flags, their validation and the tuning's grid
names are generated from these fields (:meth:`dpopt.algorithms.registry.Registry.flags`); a name two
algorithms share is declared once, in a small base both inherit, so that it has one flag.

This module imports neither torch nor dp_accounting (``dpopt --help`` reads it); an algorithm whose
own file is as light may declare its parameters there instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _validate
from ..names import NOISES

#: How batches are drawn, by name (:data:`dpopt.sampling.BATCH_SAMPLINGS`).
SAMPLINGS = ("poisson", "fixed")
#: Update rules by name: the algorithm's own ("sgd"), or DP-AdamBC on its private gradient
#: (``"module:function"`` taking the built algorithm and its parameters).
OPTIMIZERS = {"sgd": None, "adambc": "dpopt.algorithms.adam:from_params"}
#: The commands whose flags set hyper-parameters.
COMMANDS = ("run", "tune", "audit")

T = TypeVar("T")


def knob(default: T, text: str, *, kind: type | None = None, choices: tuple[str, ...] | None = None,
         check: Callable[..., object] | None = None, tunable: bool = False,
         commands: tuple[str, ...] = COMMANDS, compare: bool = True) -> T:
    """A hyper-parameter field: its ``default`` and its flag's help ``text``; ``kind``, the type of a value given on
    the command line (default: the default's type); ``choices``, the names it may take; ``check``,
    its range (``check(flag, value)`` raises :class:`~dpopt._validate.DpoptError` naming the flag);
    ``tunable``: a private tuning may vary it across trials (its trials' noise is then raised until
    the reference's Rényi curve dominates each one's, :mod:`dpopt.tuning.dominance`); ``commands``:
    where it is a flag (none: Python only)."""
    return dataclasses.field(default=default, compare=compare, metadata={
        "help": text, "kind": kind, "choices": choices, "check": check, "tunable": tunable, "commands": commands})


_RUN_TUNE = ("run", "tune")


@dataclass(frozen=True)
class Params:
    """What every algorithm is built with, for ``n`` training records: batches, step, clip, noise
    and update rule (DP-GD's, which reads ``lr``, ``clip`` and ``noise``)."""

    n: int
    batch_size: int = knob(256, "expected batch size b (DP-SRM's and STORM's first batch: 2b; O2NC's period; "
                                "DIFF2-BVR's local batch)")
    sampling: str = knob("poisson", "how batches are drawn", choices=SAMPLINGS)
    lr: float = knob(0.5, "step size η", tunable=True)
    clip: float = knob(1.0, "clip norm C (DP-SRM's and DIFF2's C1; AClip's λ)", tunable=True)
    noise: str = knob("torch", "noise source: the run's seeded generator (torch), the OS CSPRNG (secure), or the "
                      "exact discrete Gaussian (discrete; full-batch dp-gd only)", choices=NOISES,
                      commands=("run", "audit"))
    optimizer: str = knob("sgd", "the update rule: the algorithm's own (sgd), or DP-AdamBC on its private gradient "
                          "(adambc: --lr is Adam's step size)", choices=tuple(OPTIMIZERS), tunable=True)
    adam_gamma: float = knob(1e-8, "DP-AdamBC's floor γ > 0 of its bias-corrected second moment",
                             check=_validate.positive, tunable=True)

    @property
    def first_batch(self) -> int:
        """The first batch of the momentum methods (DP-SRM, STORM): twice the batch, capped at n."""
        return min(self.n, 2 * self.batch_size)


# ------------------------------------------------------------------ names several algorithms share
@dataclass(frozen=True)
class _SecondClip:
    clip_diff: float = knob(0.01, "DP-SRM's and DIFF2's C2", tunable=True, commands=_RUN_TUNE)


@dataclass(frozen=True)
class _Momentum:
    gamma: float = knob(0.01, "DP-SRM/STORM momentum γ", tunable=True, commands=_RUN_TUNE)


@dataclass(frozen=True)
class _NoiseRatio:
    noise_ratio: float = knob(1.0, "DP-SRM's σ0/σ, DPSUR's σ_v/σ, fixed while calibrating", commands=("run",))


@dataclass(frozen=True)
class _ObjClip:
    obj_clip: float = knob(1.0, "DP-AGD's clip of per-record losses, DPSUR's clip C_v of per-record loss changes",
                           tunable=True, commands=("run",))


@dataclass(frozen=True)
class _Banded:
    bands: int | None = knob(None, "banded matrix factorisation's b >= 1: correlated noise over cyclic Poisson "
                             "batches (dp-sgd, rrpsgd, aclip, dp-bandmf; default 1, dp-bandmf 4)", kind=int,
                             check=_validate.positive_int, tunable=True)


# ------------------------------------------------------------------ one class per algorithm
@dataclass(frozen=True)
class DPSGDParams(_Banded, Params):
    """DP-SGD's (``dp-sgd``, ``dp-bandmf``, ``rrpsgd``): ``bands`` (None: 1, or 4 for ``dp-bandmf``)
    and adaptive clipping: target quantile ``clip_quantile`` γ (None: off), ``clip_lr`` and
    ``count_noise`` σ_b (None: batch/20)."""

    clip_quantile: float | None = knob(None, "adaptive clipping's target quantile γ in (0, 1): the clip follows a "
                                       "private quantile of the gradient norms, --clip the first step's (DP-SGD; "
                                       "default off)", kind=float, check=_validate.open_unit, tunable=True)
    clip_lr: float = knob(0.2, "adaptive clipping's step η > 0: C <- C·exp(−η(b̂ − γ))", check=_validate.positive,
                          tunable=True)
    count_noise: float | None = knob(None, "adaptive clipping's count noise σ_b > 0 (default: batch size / 20)",
                                     kind=float, check=_validate.positive)


@dataclass(frozen=True)
class DPSRMParams(_SecondClip, _Momentum, _NoiseRatio, Params):
    """DP-SRM's: C1 = ``clip``, C2 = ``clip_diff``, momentum ``gamma`` γ and ``noise_ratio`` σ0/σ
    (fixed while calibrating); its first batch is :attr:`Params.first_batch`."""


@dataclass(frozen=True)
class DPAGDParams(_ObjClip, Params):
    """DP-AGD's: ``clip`` and ``obj_clip``, the clip of per-record losses."""


@dataclass(frozen=True)
class AClipParams(_Banded, Params):
    """AClipped-dpSGD's: λ = ``clip``, the constraint ball's ``radius``, ``bands`` (None: 1)."""

    radius: float = knob(math.inf, "AClip's constraint ball", commands=())


@dataclass(frozen=True)
class StormParams(_Momentum, Params):
    """STORM's (non-private): momentum ``gamma``; its first batch is :attr:`Params.first_batch`."""


@dataclass(frozen=True)
class O2NCParams(_SecondClip, Params):
    """DP-O2NC's: period Σ = ``batch_size``, C1 = ``clip``, C2 = ``clip_diff``, smoothing ``alpha``,
    m = ``directions``, M = ``window``, D = ``o2nc_radius``."""

    alpha: float = knob(0.1, "O2NC's smoothing radius α", commands=())
    directions: int = knob(8, "O2NC's m: random directions per estimate", commands=())
    window: int = knob(10, "O2NC's M: steps per window", commands=())
    o2nc_radius: float = knob(0.01, "O2NC's D: the radius of a window's steps", commands=())


@dataclass(frozen=True)
class DIFF2Params(_SecondClip, Params):
    """DIFF2's: C1 = ``clip``, C2 = ``clip_diff`` (DIFF2-BVR's C3 too), P = ``clients`` (an i.i.d.
    equal split, seed 0), T = ``restart``, K = ``local_steps``, ``backend`` (a distributed backend,
    None: in this process), ``output_rule`` and ``noise_ratios`` z1 : z2 [: z3]; DIFF2-BVR's local
    batch b = ``batch_size``."""

    clients: int = knob(10, "DIFF2's P (an i.i.d. equal split)", commands=("run",))
    restart: int = knob(20, "DIFF2's restart interval T", commands=("run",))
    local_steps: int = knob(2, "DIFF2-BVR-L-SGD's K", commands=("run",))
    backend: Any = knob(None, "where clients and server run (None: in this process)", commands=(), compare=False)
    output_rule: str = knob("uniform", "DIFF2's output rule", commands=())
    noise_ratios: tuple[float, ...] | None = knob(None, "DIFF2's noise ratios z1 : z2 [: z3]", commands=())


@dataclass(frozen=True)
class DPSURParams(_NoiseRatio, _ObjClip, Params):
    """DPSUR's: its test's Poisson rate ``val_rate`` q_v (None: batch_size/n), ``obj_clip`` its clip
    C_v of a per-record loss change, ``noise_ratio`` its σ_v/σ and ``threshold`` β (accept iff the
    noised change < β)."""

    val_rate: float | None = knob(None, "DPSUR's Poisson rate q_v in (0, 1] of its validation test (default: batch "
                                  "size / n)", kind=float, check=_validate.unit_interval, commands=("run",))
    threshold: float = knob(0.0, "DPSUR's β: a candidate step is kept iff its noised mean loss change is below β",
                            commands=("run",))
