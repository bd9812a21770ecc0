"""Candidates of a private tuning whose privacy event is not the reference's (e.g. other bands of
banded matrix factorisation): their noise is raised until the reference's Rényi curve dominates
theirs.

Why this suffices (Papernot & Steinke 2022, Theorems 2 and 6): the best of K runs is RDP with
ε'(λ) computed from a curve ε(λ) that every trial satisfies, (λ, ε(λ))-RDP at each order λ,
whichever candidate the trial drew. dp_accounting's ``RepeatAndSelectDpEvent`` evaluates that
bound from the trial's curve at its RDP accountant's orders (:data:`ORDERS`) only, so a
candidate whose curve is at most the reference's at every one of those orders is covered by the
tuning's calibration, which was made for the reference. The Rényi divergence of a
Poisson-subsampled Gaussian falls as its noise multiplier grows, order by order, so the smallest
dominated scale is found by bisection.

The reference's curve is taken as the tuning's accountant computes it. The candidate's is bounded
from above by its exact values at integer orders (:func:`upper_curve`): a Rényi divergence does not
decrease with the order, so ε(λ) ≤ ε(⌈λ⌉). dp_accounting's fractional orders are a numerical series
that, at high sampling rates (e.g. 4B/n), returns values far from the truth (0.13 at order 1.1 for
a noise multiplier of 1000), which can be neither trusted as a bound nor compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting as dpa
import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from numpy.typing import NDArray

from .. import _validate

#: The orders at which the tuning's accountant evaluates a trial's curve.
ORDERS: tuple[float, ...] = tuple(rdp_privacy_accountant.RdpAccountant().orders)
#: The relative precision of the dominating scale (the scale returned is dominated; at most this
#: much above the smallest one).
TOLERANCE = 1e-3
#: The largest scale of the reference's noise tried before a candidate is refused.
LIMIT = 2.0 ** 16


def curve(event: dpa.DpEvent, relation: NeighboringRelation) -> NDArray[np.float64]:
    """ε(λ) of ``event`` under ``relation`` at every order of :data:`ORDERS` (+∞ where it has none)."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS), neighboring_relation=relation)
    accountant.compose(event)
    return np.asarray(accountant.rdp, dtype=np.float64)


#: The integer order ⌈λ⌉ of each order λ of :data:`ORDERS` (an order of its own).
CEILINGS: tuple[int, ...] = tuple(math.ceil(order) for order in ORDERS)


def upper_curve(event: dpa.DpEvent, relation: NeighboringRelation) -> NDArray[np.float64]:
    """An upper bound on ε(λ) of ``event`` at every order λ of :data:`ORDERS`: its exact value at ⌈λ⌉."""
    integers = sorted(set(CEILINGS))
    accountant = rdp_privacy_accountant.RdpAccountant(orders=[float(k) for k in integers],
                                                      neighboring_relation=relation)
    accountant.compose(event)
    at = dict(zip(integers, np.asarray(accountant.rdp, dtype=np.float64)))
    return np.array([at[k] for k in CEILINGS])


def dominated(event: dpa.DpEvent, reference: NDArray[np.float64], relation: NeighboringRelation) -> bool:
    """Whether ``event``'s curve (bounded from above by :func:`upper_curve`) is at most ``reference``
    at every order."""
    return bool(np.all(upper_curve(event, relation) <= reference))


def dominating_scale(event_of: Callable[[float], dpa.DpEvent], reference: NDArray[np.float64],
                     relation: NeighboringRelation) -> float:
    """The smallest scale s ≥ 1 (within a relative :data:`TOLERANCE`, from above) of the noise with
    ``event_of(s)``'s curve at most ``reference`` at every order; refused past :data:`LIMIT`."""
    low, high = 1.0, 1.0
    while not dominated(event_of(high), reference, relation):
        low, high = high, 2 * high
        if high > LIMIT:
            raise _validate.DpoptError(f"no noise up to {LIMIT:g} times the tuning's makes this candidate's Rényi "
                                       "curve fall below the reference candidate's at every order")
    while high > low * (1 + TOLERANCE):
        middle = math.sqrt(low * high)
        if dominated(event_of(middle), reference, relation):
            high = middle
        else:
            low = middle
    return high
