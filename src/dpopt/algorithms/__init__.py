"""Algorithms: one file per paper algorithm, each a frozen dataclass of hyper-parameters.

Each is an :class:`~dpopt.algorithms._common.Algorithm` (an explicit protocol: ``relation()``,
``sampler(t, n)``, ``init``, ``step(state, batch, oracle, source) -> (state, DpEvent)`` with the
event its mechanisms returned, ``output``, ``planned_event(n, steps)``, ``NOISE_FIELDS`` and
``noise_ratios``).
"""

from .aclip import AClip, RestartedAClip, Stage
from .diff2 import DIFF2, LocalSteps
from .dp_agd import DPAGD
from .dp_sgd import DPSGD, dp_gd
from .dp_srm import DPSRM
from .o2nc import O2NC, O2NCMulti
from .rrpsgd import rrpsgd
from .storm import Storm

__all__ = ["AClip", "DIFF2", "LocalSteps", "DPAGD", "DPSGD", "DPSRM", "O2NC", "O2NCMulti", "RestartedAClip", "Stage", "Storm", "dp_gd",
           "rrpsgd"]
