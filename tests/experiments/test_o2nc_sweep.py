"""The o2nc-nonsmooth-sweep preset: the cross of runs it makes, the bound it draws, the slopes it
fits, what its report concludes, and ``--quick`` end to end (each run's ε from its ledger)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from dpopt.experiments import o2nc_sweep as sweep
from dpopt.experiments.reproduce import _jobs, reproduce

OURS = sweep.base.OURS


def test_the_sweep_runs_every_n_at_the_first_epsilon_and_every_epsilon_at_the_first_n():
    jobs = {(key, method.name, eps) for key, method, eps in _jobs(sweep.PRESET, sweep.PRESET.problems(False))}
    first, *rest = sweep.PRESET.PROBLEMS
    assert first == "synthetic-d32-n4000" and rest[-1] == "synthetic-d32-n256000"
    expected = ({(key, name, 1.0) for key in sweep.PRESET.PROBLEMS for name in sweep.METHODS}
                | {(first, name, eps) for eps in (2.0, 4.0, 8.0) for name in sweep.METHODS})
    assert jobs == expected and len(jobs) == 14  # not the 32 runs of the full grid of n × ε

    # the mutant: the main experiment's builders, unrestricted, run every n at every ε
    def unrestricted(key, eps):
        return [name for name in sweep.METHODS if sweep.base.BUILDERS[name]({"estimator": "zeroth", "epochs": 5,
                                                                              "batch_size": 64}, eps, key)]
    assert sum(len(unrestricted(key, eps)) for key in sweep.PRESET.PROBLEMS for eps in sweep.PRESET.EPSILONS) == 32


def test_the_bound_is_the_theorems_sample_complexity_solved_for_beta():
    n, d, alpha = 4000, 32, 0.05
    for eps in (1.0, 8.0):
        beta = sweep.bound(n, d, eps, alpha)
        needed = (1 / (alpha * beta**3), d / (eps * alpha * beta**2), d**0.75 / (eps**0.5 * alpha * beta**2.5))
        assert max(needed) == pytest.approx(n)  # the largest term is met with equality, the others hold
    assert sweep.bound(n, d, 1.0, alpha) == pytest.approx(math.sqrt(32 / 200))  # the privacy term leads here
    assert sweep.bound(256_000, d, 1.0, alpha) == pytest.approx(32**0.3 * 12_800**-0.4)  # the mixed term there


def test_fit_recovers_a_power_law_and_the_standard_error_of_its_slope():
    x = np.array([4e3, 1.6e4, 6.4e4, 2.56e5] * 2)
    assert sweep.fit(x, 3 * x**-0.5)[0] == pytest.approx(-0.5)
    noisy = 3 * x**-0.5 * np.exp(np.random.default_rng(0).normal(0, 0.1, len(x)))
    reference = stats.linregress(np.log(x), np.log(noisy))
    assert sweep.fit(x, noisy) == pytest.approx((reference.slope, reference.stderr))
    assert math.isnan(sweep.fit(x[:2], noisy[:2])[1])


def _payload(ours: list[float], sgd: list[float]) -> dict:
    """A finished sweep in n (n = 4,000 … 256,000 at ε = 1): two seeds a point, ours and DP-SGD's
    means as given (seeds at mean ± 0.01·mean), θ0 at 0.1 everywhere."""
    keys = list(sweep.PRESET.PROBLEMS)
    rows, curves = [], {}
    for key, o, s in zip(keys, ours, sgd):
        for name, mean in ((OURS, o), ("DP-SGD", s)):
            rows.append({"problem": key, "algorithm": name, "epsilon": 1.0,
                         "metrics": {"goldstein": {"mean": mean, "std": 0.01 * mean * math.sqrt(2)}}})
            curves[(key, name, 1.0)] = [SimpleNamespace(final={"goldstein": mean * f}) for f in (0.99, 1.01)]
    return {"rows": rows, "_curves": curves, "facts": {key: {"goldstein_start": 0.1} for key in keys}, "seeds": 2}


def test_the_report_says_from_which_n_ours_leaves_theta0_and_fits_the_slopes(tmp_path):
    n = np.array([4e3, 1.6e4, 6.4e4, 2.56e5])
    ours = [0.1, 0.095, 0.08, 0.04]  # below 0.9 × θ0's 0.1 from n = 64,000
    text = "\n".join(sweep.analyses(_payload(ours, list(0.03 * (n / 4e3) ** -0.5))))
    assert "| 64000 | 1 | 0.1 | 0.08 (0.0011) |" in text
    assert "DP-O2NC leaves θ0 (mean < 0.9 × θ0's) at n = 64000, 256000." in text
    assert f"O2NC-ZO (ours) {sweep.fit(n, np.array(ours))[0]:+.3f} ± " in text
    assert "DP-SGD -0.500 ± 0.003" in text and "θ0 +0.000" in text
    theory = sweep.fit(n, np.array([sweep.bound(v, 32, 1.0) for v in n]))[0]
    assert -0.5 < theory < -0.4 and f"the bound β {theory:+.3f}." in text
    assert "at n = none of the sweep" in "\n".join(sweep.analyses(_payload([0.1] * 4, [0.03] * 4)))
    sweep.figures(tmp_path, _payload(ours, [0.03] * 4))
    assert (tmp_path / "goldstein_vs_n_eps.png").stat().st_size > 0


def test_quick_sweep_runs_the_cross_each_at_its_ledgers_epsilon(tmp_path):
    payload = reproduce("o2nc-nonsmooth-sweep", quick=True, seeds=1, out=tmp_path, workers=1)
    got = {(row["problem"], row["algorithm"], row["epsilon"]): row["metrics"]["epsilon"]["mean"]
           for row in payload["rows"]}
    small, large = sweep.PRESET.SMOKE_PROBLEMS
    assert set(got) == ({(small, name, eps) for name in sweep.METHODS for eps in (1.0, 2.0, 4.0, 8.0)}
                        | {(large, name, 1.0) for name in sweep.METHODS})
    for (_, _, eps), spent in got.items():
        assert 0.99 * eps <= spent <= eps
    text = (tmp_path / "results.md").read_text()
    assert "at the output against n, mean (std)" in text and "at the output against ε, mean (std)" in text
    assert "| 500 | 8 |" in text and "| 2000 | 1 |" in text
    assert (tmp_path / "goldstein_vs_n_eps.png").stat().st_size > 0
