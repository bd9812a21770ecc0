"""The algebra of dp_accounting events: run-length form, canonical composition, and the one
translation of dpopt's noise convention into what each accountant reads.

Pure functions on ``DpEvent`` values, no ε: the run-length list ``[(atom, count), ...]`` that
the ledger stores, the canonical ``Composed([SelfComposed(atom, k), ...])`` that planned and
recorded events are compared in, and :func:`in_accountant_terms`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import dp_accounting as dpa
from dp_accounting import NeighboringRelation, dp_event

RELATION_NAMES = {
    NeighboringRelation.ADD_OR_REMOVE_ONE: "add/remove-one",
    NeighboringRelation.REPLACE_ONE: "replace-one",
    NeighboringRelation.REPLACE_SPECIAL: "replace-special",
}


def run_length(events: Sequence[dpa.DpEvent]) -> list[tuple[dpa.DpEvent, int]]:
    """Flatten compositions into ``[(atomic event, count), ...]``, merging equal neighbours.

    ``NoOpDpEvent`` costs nothing and is left out, so how events are grouped (nesting, splitting
    a ``SelfComposedDpEvent``, no-ops in between) never changes the runs' total."""
    runs: list[tuple[dpa.DpEvent, int]] = []

    def push(event: dpa.DpEvent, count: int) -> None:
        if count == 0 or isinstance(event, dpa.NoOpDpEvent):
            return
        if isinstance(event, dpa.ComposedDpEvent):  # k times [a, b] is k times a and k times b
            for sub in event.events:
                push(sub, count)
        elif isinstance(event, dpa.SelfComposedDpEvent):
            push(event.event, count * event.count)
        elif runs and runs[-1][0] == event:
            runs[-1] = (event, runs[-1][1] + count)
        else:
            runs.append((event, count))

    for event in events:
        push(event, 1)
    return runs


def merged(runs: Sequence[tuple[dpa.DpEvent, int]]) -> list[tuple[dpa.DpEvent, int]]:
    """Equal atoms merged wherever they stand, in order of first appearance (composition
    commutes, so ε depends only on this multiset)."""
    counts: dict[str, tuple[dpa.DpEvent, int]] = {}
    for atom, count in runs:
        key = repr(atom)
        counts[key] = (atom, counts[key][1] + count) if key in counts else (atom, count)
    return list(counts.values())


def count_steps(event: dpa.DpEvent) -> int:
    """How many atomic events ``event`` composes (no-ops left out)."""
    return sum(count for _, count in run_length([event]))


def compose(runs: Sequence[tuple[dpa.DpEvent, int]]) -> dpa.DpEvent:
    """The canonical event of a run-length list: ``Composed([SelfComposed(e, k), ...])``."""
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(event, count) for event, count in runs])


def canonical(event: dpa.DpEvent) -> dpa.DpEvent:
    """The canonical form of any event, so that equal compositions compare equal."""
    return compose(run_length([event]))


def tree_depth(step_counts: Sequence[int]) -> int:
    """⌈log₂(L + 1)⌉ for the longest of the trees: how many nodes of its tree one increment
    enters (a record sits in one increment of one tree)."""
    return math.ceil(math.log2(max(step_counts) + 1))


def combined_multiplier(multipliers: Sequence[float]) -> float:
    """(Σ_i z_i⁻²)^(−1/2): the multiplier of the one Gaussian mechanism that Gaussian releases of
    multipliers z_i computed on the same input are together (0 if any z_i is 0: that release is
    exact). Each release i moves by at most its sensitivity Δ_i between neighbours and has
    independent noise of std z_i·Δ_i, so the joint release, each part divided by its noise std,
    is a Gaussian mechanism of unit noise whose shift has norm² ≤ Σ_i z_i⁻²: exact, not a bound
    (the Gaussian part of Andrew et al. 2021's Theorem 1, arXiv 1905.03871)."""
    if any(z == 0 for z in multipliers):
        return 0.0
    return 1.0 / math.sqrt(math.fsum(1.0 / (z * z) for z in multipliers))


def one_release(event: dpa.DpEvent) -> dpa.DpEvent:
    """``event``, or the one Gaussian of :func:`combined_multiplier` if it is a composition of
    Gaussian releases (the inside of one sampled step: several Gaussians on the same batch)."""
    if (isinstance(event, dpa.ComposedDpEvent) and len(event.events) > 1
            and all(isinstance(sub, dpa.GaussianDpEvent) for sub in event.events)):
        return dpa.GaussianDpEvent(combined_multiplier([sub.noise_multiplier for sub in event.events]))
    return event


def in_accountant_terms(event: dpa.DpEvent, relation: NeighboringRelation, kind: str) -> dpa.DpEvent:
    """The one translation of dpopt's events into what accountant ``kind`` reads.

    dpopt's convention, for every release and every neighbouring relation: a noise multiplier z
    is (noise standard deviation) / (L2 distance between the released statistic on neighbouring
    data sets) — 2C for a sum of C-clipped records under replace-one, C under add/remove-one.

    * RDP (dp_accounting) reads ``GaussianDpEvent(z)`` as noise z against a shift of 1 under
      every relation: dpopt's meaning, unchanged.
    * PLD (dp_accounting) reads ``GaussianDpEvent(z)`` under replace-one as noise z between
      outputs at ±1, a distance of 2: the event becomes ``GaussianDpEvent(2z)``, also inside
      sampling events.
    * A binary tree ``SingleEpochTreeAggregationDpEvent(z, [L₁, …])`` (trees on disjoint records)
      is exactly one Gaussian mechanism of multiplier z/√h, h = :func:`tree_depth`: a record
      moves the h nodes above its increment, each by at most the distance, with independent
      noise on each, so the joint shift has norm ≤ √h·distance. It is translated to that
      Gaussian (whose RDP, α·h/(2z²), is dp_accounting's tree RDP) before the rule above.
    * Several Gaussians inside one sampling event (``PoissonSampled(q, Composed([Gaussian(z₁),
      Gaussian(z₂), …]))``: releases computed on the same sampled batch, e.g. adaptive
      clipping's gradient sum and count) are the one Gaussian of multiplier
      (Σ z_i⁻²)^(−1/2) (:func:`combined_multiplier`, exact), which the accountants can amplify.
      This is the only place they are combined: the ledger and the plan both record the parts.
    * ``NoOpDpEvent`` is dropped; compositions are translated part by part; other events
      (zCDP, non-private) mean the same to every accountant.
    """
    double = kind == "pld" and relation == NeighboringRelation.REPLACE_ONE

    def walk(e: dpa.DpEvent) -> dpa.DpEvent:
        if isinstance(e, dpa.SingleEpochTreeAggregationDpEvent):
            z = e.noise_multiplier
            return walk(dpa.GaussianDpEvent(z / math.sqrt(tree_depth(e.step_counts)) if z > 0 else 0.0))
        if isinstance(e, dpa.GaussianDpEvent):
            return dpa.GaussianDpEvent(2 * e.noise_multiplier) if double else e
        if isinstance(e, dpa.ComposedDpEvent):
            return dpa.ComposedDpEvent([walk(sub) for sub in e.events if not isinstance(sub, dpa.NoOpDpEvent)])
        if isinstance(e, dpa.SelfComposedDpEvent):
            return dpa.SelfComposedDpEvent(walk(e.event), e.count)
        if isinstance(e, dpa.PoissonSampledDpEvent):
            return dpa.PoissonSampledDpEvent(e.sampling_probability, walk(one_release(e.event)))
        if isinstance(e, dpa.SampledWithoutReplacementDpEvent):
            return dpa.SampledWithoutReplacementDpEvent(e.source_dataset_size, e.sample_size,
                                                        walk(one_release(e.event)))
        if isinstance(e, dp_event.RepeatAndSelectDpEvent):
            return dp_event.RepeatAndSelectDpEvent(walk(e.event), e.mean, e.shape)
        return e

    return walk(event)
