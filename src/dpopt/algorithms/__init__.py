"""Algorithms: one file per paper algorithm, each a frozen dataclass of hyper-parameters.

Protocol (duck-typed): ``relation()``, ``sampler(t, n)``, ``init(theta0, steps, gen)``,
``step(state, batch, oracle, source) -> (state, DpEvent)`` (``source``: the run's
:class:`~dpopt.mechanisms.NoiseSource`; the event is what the step's mechanisms returned),
``output(state)``,
``planned_event(n, steps)``, and the class attributes ``NOISE_FIELDS`` / ``noise_ratios``
that :func:`dpopt.accounting.calibrate` scales.
"""

from .aclip import AClip, RestartedAClip, Stage
from .diff2 import DIFF2, LocalSteps
from .dp_agd import DPAGD
from .dp_sgd import DPSGD, dp_gd
from .dp_srm import DPSRM
from .o2nc import O2NC
from .rrpsgd import rrpsgd
from .storm import Storm

__all__ = ["AClip", "DIFF2", "LocalSteps", "DPAGD", "DPSGD", "DPSRM", "O2NC", "RestartedAClip", "Stage", "Storm", "dp_gd",
           "rrpsgd"]
