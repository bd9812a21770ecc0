"""Private hyper-parameter tuning: the best of a random number of private runs, all of it in the
guarantee (Papernot & Steinke 2022). See :func:`dpopt.tuning.private.tune`."""

from .select import Outcome, Selection, repeat_and_select
from .space import Choice, LogUniform, Space
from .trials import Poisson, Trials, TruncatedNegativeBinomial
from .private import Tuned, tuning_plan, tune

__all__ = ["Choice", "LogUniform", "Outcome", "Poisson", "Selection", "Space", "Trials", "TruncatedNegativeBinomial",
           "Tuned", "tuning_plan", "repeat_and_select", "tune"]
