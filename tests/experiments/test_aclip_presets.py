"""The AClip presets: problems, reference points, the stated constraint radii, the paper's tables."""

from __future__ import annotations

import math

import pytest
import torch

from dpopt.experiments import EXPERIMENTS, aclip


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
    methods = {m.name: m for m in aclip.build_methods("ridge:adult", 30, {}, 1.0)}
    cc, _ = methods["CC (paper)"].build(21_000, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (cc.clip, cc.lr, cc.batch_size, cc.radius) == (0.54, 5e-4, 200, aclip.CC_RADIUS["ridge:adult"])
    sgd, steps = methods["DP-SGD (paper)"].build(21_000, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (sgd.clip, sgd.lr, sgd.batch_size, steps) == (0.74, 4e-4, 200, 3150)
    assert methods[aclip.NOT_PRIVATE].noise_scale == 0.5
    assert aclip.NOT_PRIVATE not in {m.name for m in aclip.build_methods("ridge:adult", 30, {}, 0.5)}
    uc, _ = {m.name: m for m in aclip.build_methods("ridge:diabetes", 30, {}, 1.0)}["UC (paper)"].build(
        500, {"lr_factor": 1.0, "clip_factor": 1.0})
    assert (uc.clip, uc.lr, uc.batch_size) == (0.87, 1e-2, 24)
