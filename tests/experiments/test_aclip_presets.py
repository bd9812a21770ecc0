"""The AClip presets: problems, reference points, the stated constraint radii, the paper's tables."""

from __future__ import annotations

import math

import pytest
import torch

from dpopt.experiments import EXPERIMENTS, aclip, aclip_cifar10


@pytest.mark.parametrize("key", aclip.SYNTHETIC.PROBLEMS + aclip.REAL.PROBLEMS)
def test_problem_reference_and_radius(key, shared_data_dir):
    problem, facts = aclip.build_problem(key, str(shared_data_dir))
    oracle = problem.oracle
    if facts["reference"] == "non-private optimum":  # the reference is the optimum: its gradient vanishes
        theta = aclip.nonprivate_optimum(oracle)
        assert float(oracle.gradient(theta).norm()) <= 1e-8
    # CC's radius is the stated rule: 2‖x_ref‖ rounded up (one decimal; whole numbers above 10)
    step = 1.0 if 2 * facts["reference_norm"] > 10 else 0.1
    assert aclip.CC_RADIUS[key] == pytest.approx(math.ceil(2 * facts["reference_norm"] / step) * step)
    # at θ0 = 0 both ratios are 1 by definition; the reference has loss ratio < 1 (it fits)
    zero = problem.extra_metrics(torch.zeros(oracle.dim, dtype=torch.float64))
    assert zero == {"error_ratio": 1.0, "loss_ratio": 1.0}
    assert facts["nonprivate_loss_ratio"] < 1
    n = {"adult": 21_000, "diabetes": 500}.get(aclip.split_key(key)[1], 100_000)
    assert oracle.n == n and facts["delta"] == 1 / n == EXPERIMENTS["aclip-real" if n < 100_000 else
                                                                     "aclip-synthetic"].delta(key)


def test_paper_tables_are_complete():
    for experiment, datasets in ((aclip.SYNTHETIC, aclip.SYNTHETIC_DATA), (aclip.REAL, aclip.REAL_DATA)):
        keys = {(row["problem"], row["algorithm"], row["epsilon"]) for row in experiment.PAPER}
        assert len(keys) == len(experiment.PAPER) == 2 * len(datasets) * 4 * 4
        assert {row["problem"] for row in experiment.PAPER} == set(experiment.PROBLEMS)
    adult = {(r["algorithm"], r["epsilon"]): r for r in aclip.REAL.PAPER if r["problem"] == "logistic:adult"}
    assert adult[("CC (paper)", 0.5)]["loss_ratio"] == 0.8103 and adult[("DP-GD (paper)", 2.0)]["wall_time_s"] == 8.317


def test_methods_use_the_papers_settings():
    methods = {m.name: m for m in aclip.REAL.methods(1.0, "ridge:adult")}
    cc, _ = methods["CC (paper)"].build(21_000, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (cc.clip, cc.lr, cc.batch_size, cc.radius) == (0.54, 5e-4, 200, aclip.CC_RADIUS["ridge:adult"])
    sgd, steps = methods["DP-SGD (paper)"].build(21_000, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (sgd.clip, sgd.lr, sgd.batch_size, steps) == (0.74, 4e-4, 200, 3150)
    assert methods[aclip.NOT_PRIVATE].noise_scale == 0.5
    assert aclip.NOT_PRIVATE not in {m.name for m in aclip.REAL.methods(0.5, "ridge:adult")}
    uc, _ = {m.name: m for m in aclip.REAL.methods(1.0, "ridge:diabetes")}["UC (paper)"].build(
        500, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (uc.clip, uc.lr, uc.batch_size) == (0.87, 1e-2, 24)


def test_cifar10_smoke_version_runs_resnet18_on_cpu(monkeypatch, tmp_path):
    """The CPU smoke version of aclip-cifar10 end to end: ResNet-18 (GroupNorm), AClip and DP-SGD
    calibrated to ε = 2 and run for a step on a tiny subset. CIFAR-10 is not in the shared data,
    so the 8 records are random CIFAR-shaped images (the loader is tested on fake archives in
    tests/data/test_cifar.py)."""
    import dataclasses

    import numpy as np

    from dpopt.experiments.reproduce import reproduce

    rng = np.random.default_rng(0)

    def tiny(data_dir, records):
        assert records == aclip_cifar10.SMOKE_RECORDS
        return (rng.random((records, 3072)), rng.integers(0, 10, records).astype(float),
                rng.random((records, 3072)), rng.integers(0, 10, records).astype(float))

    monkeypatch.setattr(aclip_cifar10, "cifar_arrays", tiny)
    monkeypatch.setitem(EXPERIMENTS, "aclip-cifar10", dataclasses.replace(aclip_cifar10.CIFAR, EPSILONS=(2.0,)))
    payload = reproduce("aclip-cifar10", quick=True, seeds=1, out=tmp_path, workers=1)
    rows = {row["algorithm"]: row for row in payload["rows"]}
    assert set(rows) == {"UC", "DP-SGD"}
    for row in rows.values():
        assert row["problem"] == "resnet18:cifar10-smoke"
        assert 0.99 * 2.0 <= row["metrics"]["epsilon"]["mean"] <= 2.0
        assert math.isfinite(row["diagnostics"]["metrics"]["objective"]["mean"])
    assert {r["algorithm"] for r in payload["paper"]} == {"CC", "UC", "DP-SGD"}
    assert (tmp_path / "results.md").exists()
