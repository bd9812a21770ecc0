"""Algorithms by name, with the hyper-parameters a user sets; noise multipliers are left at 1 for
:func:`dpopt.accounting.calibrate` to scale to a target (ε, δ)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import _validate
from ..mechanisms import CONTINUOUS, DISCRETE, Noise, NoiseSource, SystemNoise
from ..names import ALGORITHMS as NAMES
from ..names import NOISES, NON_PRIVATE
from ..sampling import Clients, by_name
from .aclip import AClip
from .diff2 import DIFF2, LocalSteps
from .dp_agd import DPAGD
from .dp_sgd import DPSGD, dp_gd, rrpsgd
from .dp_srm import DPSRM
from .o2nc import O2NC, O2NCMulti
from .storm import Storm

__all__ = ["NAMES", "NON_PRIVATE", "NOISES", "build", "noise_of", "steps_for_epochs"]


def noise_of(name: str) -> tuple[Noise, NoiseSource | None]:
    """The kind of noise and the noise source (None: the run's seeded one) named ``name``."""
    _validate.one_of("noise", name, NOISES)
    return (DISCRETE if name == "discrete" else CONTINUOUS), (SystemNoise() if name == "secure" else None)


def build(name: str, *, n: int, batch_size: int = 256, lr: float = 0.5, clip: float = 1.0,
          clip_diff: float = 0.01, gamma: float = 0.01, sampling: str = "poisson", obj_clip: float = 1.0,
          radius: float = math.inf, noise: str = "torch", alpha: float = 0.1, directions: int = 8,
          window: int = 10, o2nc_radius: float = 0.01, clients: int = 10, restart: int = 20, local_steps: int = 2,
          backend: Any = None, output_rule: str = "uniform", noise_ratios: Sequence[float] | None = None) -> Any:
    """Algorithm ``name`` for n records. ``batch_size`` is the expected batch (DP-SRM's and STORM's
    first batch is twice it, capped at n); ``clip`` is C (DP-SGD, DP-SRM's C1, DP-AGD) or λ
    (AClip); ``clip_diff`` and ``gamma`` are DP-SRM's C2 and γ (γ is STORM's momentum);
    ``radius`` is AClip's constraint ball; ``obj_clip`` DP-AGD's clip of per-record losses; ``noise``
    the noise of every release by name (:data:`NOISES`: the kind of noise is set here; the source
    of "secure" is the run's, :func:`noise_of`; STORM has none, O2NC and DIFF2 continuous only). O2NC ("o2nc-zeroth", "o2nc-first": single pass with the tree;
    "o2nc-multi": every record every step): period Σ = B1 = ``batch_size``, B2 = 1, clips C1 =
    ``clip`` and C2 = ``clip_diff``, smoothing ``alpha``, m = ``directions``, M = ``window``, D =
    ``o2nc_radius`` (theorem settings: :mod:`dpopt.algorithms.o2nc_params`). DIFF2 (``diff2-gd``,
    ``diff2-bvr``): ``clip`` and ``clip_diff`` are C1 and C2 (C3 = C2 for the local steps),
    ``restart`` is T, ``clients`` is P (an i.i.d. equal split, seed 0), ``local_steps`` and
    ``batch_size`` are BVR's K and b, ``backend`` a distributed backend, ``output_rule`` the iterate
    released ("uniform" or "last") and ``noise_ratios`` z1 : z2 [: z3] (default equal; e.g.
    :func:`dpopt.algorithms.diff2.paper_ratios`)."""
    _validate.one_of("algorithm", name, NAMES)
    if name == "storm" or name.startswith(("o2nc", "diff2")):
        _validate.one_of("noise", noise, ("torch", "secure"))
    noise, _ = noise_of(noise)
    kind = by_name(sampling)
    if name in ("dp-sgd", "rrpsgd", "dp-srm", "storm", "aclip", "o2nc-zeroth", "o2nc-first", "o2nc-multi"):
        _validate.positive_int("batch_size", batch_size, maximum=n, maximum_name="n (training records)")
    first = min(n, 2 * batch_size)
    if name == "dp-sgd":
        return DPSGD(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch_size, sampling=kind, noise=noise)
    if name == "rrpsgd":
        return rrpsgd(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch_size, sampling=kind, noise=noise)
    if name == "dp-gd":
        return dp_gd(lr=lr, clip=clip, noise_multiplier=1.0, noise=noise)
    if name == "dp-srm":
        return DPSRM(lr=lr, clip=clip, clip_diff=clip_diff, gamma=gamma, noise_multiplier0=1.0, noise_multiplier=1.0,
                     batch_size0=first, batch_size=batch_size, sampling=kind, noise=noise)
    if name == "storm":
        return Storm(lr=lr, momentum=gamma, batch_size0=first, batch_size=batch_size, sampling=kind)
    if name == "aclip":
        return AClip(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch_size, radius=radius, noise=noise)
    if name.startswith("o2nc"):
        common = dict(lr=lr, radius=o2nc_radius, window=window, alpha=alpha, period=batch_size, clip0=clip,
                      clip=clip_diff, noise_multiplier=1.0, directions=directions)
        if name == "o2nc-multi":
            return O2NCMulti(**common)
        return O2NC(**common, estimator="first" if name == "o2nc-first" else "zeroth", batch_size0=batch_size,
                    batch_size=1)
    if name in ("diff2-gd", "diff2-bvr"):
        split = Clients(n, clients)
        extra = {} if backend is None else {"backend": backend}
        if name == "diff2-bvr":
            extra |= {"local": LocalSteps(local_steps, min(batch_size, split.size), clip_diff), "noise_multiplier3": 1.0}
        return DIFF2(lr=lr, clip=clip, clip_diff=clip_diff, restart=restart, noise_multiplier1=1.0,
                     noise_multiplier2=1.0, clients=split, output_rule=output_rule,
                     noise_ratios=None if noise_ratios is None else tuple(noise_ratios), **extra)
    return DPAGD(clip=clip, obj_clip=obj_clip, noise_multiplier=1.0, noise=noise)


def steps_for_epochs(algorithm: Any, n: int, epochs: float) -> int:
    """Steps whose expected records visited come closest to ``epochs``·n (at least one)."""
    _validate.positive("epochs", epochs)
    per_step = algorithm.sampler(1, n).expected_size
    return max(1, round(epochs * n / per_step))
