"""The statistics the reports of the reproductions and the bench share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def one_sided_p(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """Welch's t-test p-value for mean(ours) < mean(theirs), from each sample's mean and standard
    deviation (:func:`_moments`)."""
    if np.allclose(ours, ours[0]) and np.allclose(theirs, theirs[0]):
        return 0.0 if ours[0] < theirs[0] else 1.0
    (mean, std), (other_mean, other_std) = _moments(ours), _moments(theirs)
    return float(stats.ttest_ind_from_stats(mean, std, len(ours), other_mean, other_std, len(theirs), equal_var=False,
                                            alternative="less").pvalue)


def _moments(sample: Sequence[float]) -> tuple[float, float]:
    """(mean, standard deviation with ddof 1) of ``sample``; the deviation of equal values is exactly
    0. (Every seed can end at the same error, e.g. the majority class's: scipy's ``ttest_ind``
    finds such a sample "nearly identical" and warns of precision loss, though the test is exact.)"""
    values = np.asarray(sample, dtype=float)
    return float(values.mean()), 0.0 if len(values) == 1 or (values == values[0]).all() else float(values.std(ddof=1))
