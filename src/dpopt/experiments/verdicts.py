"""What a reproduction's report says about its comparisons, by one rule for every preset.

For each method named as "ours" in the preset's comparisons: in how many of its comparisons it is
below the baseline with p < 0.05 on every verdict metric (one-sided Welch tests; the preset's
``verdict_metrics``, some of its test metrics), and, for every
comparison where it is not, a **Miss** line with the p-values and the two means of the first test
metric; after them, once per missed baseline, the preset's explanation for it (declared in its
file, keyed by the baseline's name).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: The significance level of the verdicts.
LEVEL = 0.05


def comparison_lines(payload: dict[str, Any], verdict_metrics: Sequence[str],
                     explanations: dict[str, str]) -> list[str]:
    """The verdict lines of ``payload`` (its rows and t-tests)."""
    tests = payload["t_tests"]
    means = {(row.get("problem"), row["algorithm"], row["epsilon"]): row["metrics"] for row in payload["rows"]}
    lines = []
    for ours in dict.fromkeys(test["ours"] for test in tests):
        mine = [test for test in tests if test["ours"] == ours]
        misses = [test for test in mine if not all(test[f"p_{m}"] < LEVEL for m in verdict_metrics)]
        lines.append(f"* {ours} is below its baseline on {' and '.join(verdict_metrics)} with "
                     f"p < {LEVEL} in {len(mine) - len(misses)} of {len(mine)} comparisons.")
        for test in misses:
            where = f"{test['problem']}, " if "problem" in test else ""
            p_values = ", ".join(f"{test[f'p_{m}']:.3g} ({m})" for m in verdict_metrics)
            first = verdict_metrics[0]
            mean = {name: means[(test.get("problem"), name, test["epsilon"])][first]
                    for name in (ours, test["baseline"])}
            lines.append(
                f"* **Miss:** {where}ε = {test['epsilon']:g}, {ours} vs {test['baseline']}: p = {p_values} — not "
                f"significant at {LEVEL} on every metric ({first}: {_cell(mean[ours])} vs "
                f"{_cell(mean[test['baseline']])}).")
        missed = dict.fromkeys(test["baseline"] for test in misses)
        lines += [f"* Against {baseline}: {explanations[baseline]}" for baseline in missed if baseline in explanations]
    return lines


def _cell(summary: dict[str, float]) -> str:
    std = summary.get("std")
    return f"{summary['mean']:.5g}" + ("" if std is None or not math.isfinite(std) else f" ± {std:.2g}")
