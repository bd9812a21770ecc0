"""Accounting never needs unbounded memory: where the PLD grid would be too wide (tiny noise, huge
ε), RDP answers, a valid bound in closed form, within seconds and well under a 4 GB address space.

Finding: `dpopt run --epsilon 1e9 --steps 20` took 22 GB and was killed; `dpopt calibrate
--epsilon 1e5` and `dpopt account --noise-multiplier 0.001` failed with memory errors."""

from __future__ import annotations

import json
import subprocess
import sys

import dp_accounting as dpa
import pytest
from dp_accounting import NeighboringRelation

from dpopt.accounting import MAX_PLD_POINTS, accountant_for, epsilon_of

LIMIT = "ulimit -v 4000000; "  # KiB: a 4 GB address space


def limited(argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    command = " ".join([sys.executable, "-m", "dpopt.cli", *argv])
    return subprocess.run(["bash", "-c", LIMIT + command], capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.parametrize("argv", [
    ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1e9", "--steps", "20", "--json",
     "--out", "big"],
    ["calibrate", "--mechanism", "poisson-gaussian", "--epsilon", "1e5", "--sampling-rate", "0.004", "--steps",
     "5000", "--delta", "1e-5", "--json"],
    ["account", "--mechanism", "poisson-gaussian", "--noise-multiplier", "0.001", "--sampling-rate", "0.004",
     "--steps", "5000", "--delta", "1e-5", "--json"],
])
def test_extreme_settings_finish_in_a_4_gb_address_space(argv, tmp_path):
    done = limited(argv, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.get("accountant", "rdp") == "rdp" or "final" in result


def test_a_pld_too_wide_for_memory_is_answered_by_rdp():
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.004, dpa.GaussianDpEvent(0.001)), 5000)
    relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    assert accountant_for(event, relation, "pld") == "rdp"
    assert epsilon_of(event, 1e-5, relation) == epsilon_of(event, 1e-5, relation, "rdp")
    ordinary = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.004, dpa.GaussianDpEvent(0.8)), 5000)
    assert accountant_for(ordinary, relation, "pld") == "pld" and MAX_PLD_POINTS <= 5_000_000
