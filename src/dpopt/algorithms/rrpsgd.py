"""RRPSGD: random-round private SGD (Zhang, Zheng, Mou, Wang 2017).

DP-SGD run for T rounds whose output is the iterate of a uniformly random round R. Drawing R
up front is data-independent, so the output rule costs no privacy; the noise is calibrated,
and the ledger charged, for all T rounds (the most R can be).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import mechanisms
from ..sampling import BatchSampling, Poisson
from ._common import batch_sampling, noise_kind
from .dp_sgd import DPSGD

if TYPE_CHECKING:
    from .registry import Knobs


def rrpsgd(*, lr: float, clip: float, noise_multiplier: float, batch_size: int,
           sampling: BatchSampling = Poisson, noise: mechanisms.Noise = mechanisms.CONTINUOUS) -> DPSGD:
    """DP-SGD with ``output_rule="uniform"``."""
    return DPSGD(lr=lr, clip=clip, noise_multiplier=noise_multiplier, batch_size=batch_size,
                 sampling=sampling, output_rule="uniform", noise=noise)


def from_knobs(knobs: Knobs) -> DPSGD:
    """``rrpsgd`` by name: ``lr``, ``clip``, ``batch_size``, ``sampling``, ``noise``."""
    return rrpsgd(lr=knobs.lr, clip=knobs.clip, noise_multiplier=1.0, batch_size=knobs.batch_size,
                  sampling=batch_sampling(knobs), noise=noise_kind(knobs))
