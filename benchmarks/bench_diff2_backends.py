"""DIFF2-GD time per round: ``Local()`` against ``TorchDistributed()`` with 2 processes.

California Housing (16,512 training records, the paper's MLP, 101 parameters), P = 10 clients,
T = 20, ε = 3. Each contender is ``dpopt run`` in a fresh process (``--backend local`` and
``--backend torch --nproc 2``: rank 0 the server, rank 1 all ten clients); the time per round
is the run's own training wall time (sampling, steps, ledger; not process start-up, data
loading, calibration or the logged measurements) divided by the rounds. Contenders alternate,
the median of the repeats is kept. Target (issue 5): torch / local ≤ 1.3.

1,000 rounds: the first round of the torch backend carries one-off costs (gloo's first
messages, ~0.1 s), which over 200 rounds added ~0.5 ms to a round of ~9 ms (the ratio then
read 1.3–1.7 where 1,000 rounds give 1.1).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _timing import REPO, data_dir

TITLE = "DIFF2-GD per round: Local() vs TorchDistributed() (2 processes), California Housing, P = 10"
TARGET = 1.3
BACKENDS = {"local": ["--backend", "local"], "torch (2 processes)": ["--backend", "torch", "--nproc", "2"]}


def _seconds_per_round(backend: list[str], rounds: int, out: str) -> float:
    command = [sys.executable, "-m", "dpopt.cli", "run", "--algorithm", "diff2-gd", "--dataset", "california_housing",
               "--model", "mlp", "--epsilon", "3", "--steps", str(rounds), "--restart", "20", "--clip-diff", "3",
               "--lr", "0.125", "--checkpoint-every", str(rounds), "--data-dir", str(data_dir()), "--out", out,
               "--json", "--diagnostics", *backend]  # the wall time is a (non-private) diagnostic
    subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO,
                            env={"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    written = json.loads((Path(out) / "history.json").read_text())  # the diagnostics are in the file only
    return written["diagnostics"]["final"]["wall_time_s"] / rounds


def run(quick: bool = False) -> dict[str, Any]:
    rounds, repeats = (40, 1) if quick else (1000, 3)
    times: dict[str, list[float]] = {name: [] for name in BACKENDS}
    with tempfile.TemporaryDirectory(prefix="bench-diff2-") as tmp:
        for repeat in range(repeats):
            for name, flags in BACKENDS.items():
                times[name].append(_seconds_per_round(flags, rounds, f"{tmp}/{repeat}-{name.split()[0]}"))
    local, torch_time = (statistics.median(times[name]) for name in BACKENDS)
    ratio = torch_time / local
    markdown = "\n".join([
        f"{rounds} rounds, median of {repeats} alternating repeat(s); training wall time per round.", "",
        "| backend | ms / round |", "|---|---|",
        *(f"| {name} | {1e3 * statistics.median(values):.2f} |" for name, values in times.items()), "",
        f"Ratio torch / local: **{ratio:.2f}** (target ≤ {TARGET}).",
    ])
    return {"title": TITLE, "markdown": markdown,
            "checks": [{"name": "torch / local time per round", "value": round(ratio, 3), "target": f"<= {TARGET}",
                        "passed": ratio <= TARGET}]}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
