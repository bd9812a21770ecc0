"""dpopt against the code the round started from: no check may get more than 5 % slower.

Every other benchmark compares dpopt with other code (Opacus, plain PyTorch) or with itself, so a
slowdown of dpopt shows there only as a moved ratio. This one measures the dpopt side of those
checks (:data:`versus.CASES`) in this checkout and in a git worktree of ``BASE`` (the commit the
round started from; ``$DPOPT_BENCH_BASE`` names another), alternated round by round in two
worker processes (:func:`versus.compare`), and reports the median of the per-round ratios
new / old. Target: ≤ 1.05 for every case.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import versus
from _timing import data_dir

#: The last commit of the previous round (its CI run: 1,292 passed).
BASE = "2e2dfd3"
LIMIT = 1.05


def run(quick: bool = False) -> dict[str, Any]:
    """Measure, and return ``{"title", "markdown", "checks"}`` (see ``benchmarks/run.py``)."""
    base = os.environ.get("DPOPT_BENCH_BASE", BASE)
    os.environ["DPOPT_DATA"] = str(data_dir())  # the workers' data, wherever the old worktree lies
    rounds = 8 if quick else 16
    rows, checks = [], []
    with tempfile.TemporaryDirectory(prefix="dpopt-versus-") as folder:
        old = Path(folder) / "old"
        subprocess.run(["git", "-C", str(versus.REPO), "worktree", "add", "--detach", str(old), base],
                       check=True, capture_output=True)
        try:
            for case in versus.CASES:
                r = versus.compare(old, case, rounds)
                rows.append(f"| {case} | {r['old']:.4g} | {r['new']:.4g} | {r['median_ratio']:.3f} | "
                            f"{r['min_ratio']:.3f} |")
                checks.append({"name": f"new / old, {case}", "value": r["median_ratio"], "target": f"≤ {LIMIT}",
                               "passed": r["median_ratio"] <= LIMIT})
        finally:
            subprocess.run(["git", "-C", str(versus.REPO), "worktree", "remove", "--force", str(old)],
                           capture_output=True)
    markdown = "\n".join([
        f"This checkout against `{base}` (a git worktree), {rounds} rounds per case, the two versions "
        "alternated round by round in two worker processes (both see the same load). A ratio above 1 is "
        "a slowdown; the check reads the median of the per-round ratios.",
        "",
        "| operation | old median s | new median s | new / old (median of rounds) | new / old (fastest rounds) |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
    return {"title": f"dpopt against {base}, the code the round started from", "markdown": markdown,
            "checks": checks}
