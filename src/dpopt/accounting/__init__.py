"""The privacy ledger and noise calibration, both over ``dp_accounting``.

One description of the mechanisms serves twice (double entry): an algorithm's
``planned_event(n, steps)`` calibrates its noise before training, and the :class:`Ledger`
records every event a step actually returns. A contract test asserts the two agree.

Accountants: PLD (tightest, the default) or RDP. A ledger asked for PLD falls back to RDP for
events PLD cannot compose (sampling without replacement, zCDP, trees) and says so in
:attr:`Ledger.accountant`.

The modules, each importing only those before it:

* :mod:`~dpopt.accounting.events`: the event algebra (run-length form, canonical composition)
  and the translation of dpopt's noise convention into each accountant's reading;
* :mod:`~dpopt.accounting.fast`: every place ε is computed other than by dp_accounting's
  accountants (closed-form Gaussian composition, cached and vectorised Gaussian PLDs), each
  with the reason it is safe;
* :mod:`~dpopt.accounting.epsilon`: the choice of accountant and ε(δ) of an event;
* :mod:`~dpopt.accounting.ledger`: the :class:`Ledger` and the run-time check of the double
  entry (:func:`guarantee`);
* :mod:`~dpopt.accounting.calibration`: the noise scale that meets a target (ε, δ).
"""

from .calibration import calibrate, noise_of, scaled, solve_noise, with_noise
from .epsilon import _EPSILON_CACHE as _EPSILON_CACHE  # cleared by tests and benchmarks
from .epsilon import (
    COARSE_DISCRETIZATION,
    FINEST_DISCRETIZATION,
    MAX_PLD_POINTS,
    accountant_for,
    accountant_note,
    epsilon_of,
    ledger_grid,
    pld_discretization,
)
from .events import (RELATION_NAMES, canonical, combined_multiplier, compose, count_steps, in_accountant_terms, merged,
                     run_length, tree_depth)
from .fast import _sampled_gaussian_step as _sampled_gaussian_step  # cleared by a benchmark
from .ledger import Ledger, PlanMismatch, guarantee, is_filter
from .ledger import _zcdp_rho as _zcdp_rho  # read by a mutant test

__all__ = ["COARSE_DISCRETIZATION", "FINEST_DISCRETIZATION", "MAX_PLD_POINTS", "RELATION_NAMES", "Ledger",
           "PlanMismatch", "accountant_for", "accountant_note", "calibrate", "canonical", "combined_multiplier",
           "compose", "count_steps", "epsilon_of", "guarantee", "in_accountant_terms", "is_filter", "ledger_grid",
           "merged", "noise_of", "pld_discretization", "run_length", "scaled", "solve_noise", "tree_depth",
           "with_noise"]
