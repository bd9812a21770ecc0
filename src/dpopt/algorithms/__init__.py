"""Algorithms: one file per paper algorithm, each a frozen dataclass of hyper-parameters.

Protocol (duck-typed): ``relation()``, ``sampler(t, n)``, ``init(theta0, steps, gen)``,
``step(state, batch, oracle, gen) -> (state, DpEvent)``, ``output(state)``,
``planned_event(n, steps)``, and the class attributes ``NOISE_FIELDS`` / ``noise_ratios``
that :func:`dpopt.accounting.calibrate` scales.
"""

from .aclip import AClip, RestartedAClip, Stage
from .diff2 import DIFF2, DIFF2BVR
from .dp_agd import DPAGD
from .dp_sgd import DPSGD, dp_gd
from .dp_srm import DPSRM
from .o2nc import O2NC
from .rrpsgd import rrpsgd
from .storm import Storm

__all__ = ["AClip", "DIFF2", "DIFF2BVR", "DPAGD", "DPSGD", "DPSRM", "O2NC", "RestartedAClip", "Stage", "Storm", "dp_gd",
           "rrpsgd"]
