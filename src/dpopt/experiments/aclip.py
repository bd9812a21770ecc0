"""Seed 002, Tables 2 and 4: AClipped-dpSGD against DP-SGD and DP-GD on heavy-tailed data.

Two presets, ``aclip-synthetic`` (Student's t, Laplace and χ² noise, n = 100,000, d = 10) and
``aclip-real`` (Adult, Diabetes), each for logistic and least-squares ("ridge", no penalty,
as in the paper's code) regression at ε ∈ {0.5, 0.75, 1, 2}, δ = 1/n.

Methods, each in two column sets:

* **paper**: the paper's settings (ALGORITHMS.md §2; appendix B of the paper). Batch m = 200
  (Adult, synthetic) or 24 (Diabetes); CC: λ = 0.54, γ = 5e−4 (Diabetes 5e−3), constrained to
  a ball; UC: λ = 0.87, γ = 2e−4 (Diabetes 1e−2); DP-SGD: per-record clip 0.74, γ = 4e−4
  (Diabetes 6e−3); DP-GD: per-record clip 0.74, γ = 1e−3 (Diabetes 8e−3).
* **tuned**: our own step size and clip for each method, chosen on a grid by mean final
  training objective over tuning seeds at ε = 1 and used at every ε (``TUNED``; ``--retune``).

Plus "CC, λ-noise (NOT PRIVATE)": CC with the noise the paper's proof would calibrate (half the
honest noise, sensitivity λ instead of 2λ): for comparison only; its ledger reports the ε it
really spends.

Metrics at the averaged output θ̄: ``error_ratio`` = ‖θ̄ − x_ref‖ / ‖θ0 − x_ref‖ (θ0 = 0;
x_ref = x* for synthetic ridge, the non-private optimum of the training objective otherwise)
and ``loss_ratio`` = test loss(θ̄) / test loss(θ0), which is what the paper's code reports as
"estimation error divided by initial error"; the paper's numbers are set beside ``loss_ratio``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..algorithms import DPSGD, AClip, dp_gd
from ..data import load
from ..data.synthetic import NOISES, heavy_tailed
from ..oracles import GLM, LeastSquares, Logistic
from ._runner import Method, Params, Problem
from .aclip_paper import convex_rows
from .preset import Experiment

EPSILONS = (0.5, 0.75, 1.0, 2.0)
MODELS = ("logistic", "ridge")
TUNE_EPSILON = 1.0
TUNING_SEEDS = (1000, 1001, 1002)
METRICS = ("loss_ratio", "error_ratio", "test_error", "objective", "passes", "wall_time_s", "epsilon")
TABLE_METRICS = ("loss_ratio", "error_ratio", "wall_time_s", "epsilon")
PAPER_METRICS = ("loss_ratio", "wall_time_s")
TEST_METRICS = ("error_ratio", "loss_ratio")
CURVES = {"training objective at the averaged iterate": "objective"}
SETTINGS = ("paper", "tuned")
NOT_PRIVATE = "CC, λ-noise (NOT PRIVATE)"
#: AClip against DP-SGD, in each column set (the acceptance comparison).
COMPARISONS = [(f"{aclip} ({setting})", f"DP-SGD ({setting})") for setting in SETTINGS for aclip in ("CC", "UC")]

#: The paper's settings (appendix B): batch, then (clip, step size) per method.
PAPER_SETTINGS = {
    "default": {"batch_size": 200, "CC": (0.54, 5e-4), "UC": (0.87, 2e-4), "DP-SGD": (0.74, 4e-4),
                "DP-GD": (0.74, 1e-3)},
    # Diabetes: m = 24 and the step sizes 1e-2 (printed "1E2"), 5e-3, 6e-3, 8e-3; no λ is given,
    # so Adult's λ values are used.
    "diabetes": {"batch_size": 24, "CC": (0.54, 5e-3), "UC": (0.87, 1e-2), "DP-SGD": (0.74, 6e-3),
                 "DP-GD": (0.74, 8e-3)},
}
#: Training-set sizes (δ = 1/n): the paper's splits.
N_TRAIN = {"synthetic": 100_000, "adult": 21_000, "diabetes": 500}
#: CC's constraint: the ball ‖θ‖ ≤ R around θ0 = 0. The paper's Assumption 2 uses the ball
#: around x* of radius ‖θ0 − x*‖, which needs x*; we fix R ≈ 2‖x_ref‖ (rounded up), read off the
#: non-private optimum (real data, synthetic logistic) or x* (synthetic ridge, ‖x*‖ ≈ 1 by
#: construction). Like the paper's, this is a choice informed by the data, stated here.
CC_RADIUS = {"logistic:student-t": 1.6, "logistic:laplace": 1.8, "logistic:chi2": 1.2, "ridge:student-t": 1.5,
             "ridge:laplace": 1.5, "ridge:chi2": 1.5, "logistic:diabetes": 2.6, "logistic:adult": 92.0,
             "ridge:diabetes": 1.0, "ridge:adult": 3.2}
#: Tuned column set: factors 4^k on the paper's step size (k = 0..6) and clip (k = −3..2).
GRID = {"lr_factor": tuple(4.0**k for k in range(7)), "clip_factor": tuple(4.0**k for k in range(-3, 3))}


# ------------------------------------------------------------------------------------ problems


def split_key(key: str) -> tuple[str, str]:
    """``"logistic:adult"`` → ("logistic", "adult")."""
    model, data = key.split(":")
    return model, data


def _standardised(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns to zero mean and unit variance with the training split's statistics."""
    mean, std = X_train.mean(axis=0), X_train.std(axis=0)
    std[std == 0] = 1.0
    return (X_train - mean) / std, (X_test - mean) / std


def _arrays(data: str, model: str, data_dir: str | None) -> tuple[np.ndarray, ...] | tuple[Any, ...]:
    """(X_train, y_train, X_test, y_test, x* or None) of data set ``data`` for ``model``."""
    if data in NOISES:
        task = "binary" if model == "logistic" else "regression"
        # 125,000 records: the first 100,000 (the paper's n) train, the last 25,000 test
        dataset, x_star = heavy_tailed(data, task, n=125_000, dim=10, seed=0, test_fraction=0.2)
        return dataset.X_train, dataset.y_train, dataset.X_test, dataset.y_test, x_star
    if data == "adult":
        # the paper: 21,000 of Adult's 32,561 training records train, the rest test
        dataset = load("adult", data_dir)
        X, y = dataset.X_train, dataset.y_train
        return X[:21_000], y[:21_000], X[21_000:], y[21_000:], None
    dataset = load("diabetes", data_dir)  # 500 train / 268 test, features on very different scales
    X_train, X_test = _standardised(dataset.X_train, dataset.X_test)
    return X_train, dataset.y_train, X_test, dataset.y_test, None


def _oracle(model: str, X: np.ndarray, y: np.ndarray) -> GLM:
    X_t, y_t = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    return Logistic(X_t, y_t) if model == "logistic" else LeastSquares(X_t, y_t)


def nonprivate_optimum(oracle: GLM) -> torch.Tensor:
    """argmin of the training objective: least squares in closed form; logistic by Newton's
    method with the exact Hessian Aᵀ diag(σ(1 − σ)) A / n (d ≤ a few hundred here) and a
    backtracking line search, until ‖∇F‖ ≤ 1e−10."""
    if isinstance(oracle, LeastSquares):
        # SVD driver: Adult's one-hot X is rank-deficient (each group of columns sums to 1)
        return torch.linalg.lstsq(oracle.X, oracle.y[:, None], driver="gelsd").solution[:, 0]
    theta = torch.zeros(oracle.dim, dtype=torch.float64)
    for _ in range(200):
        grad = oracle.gradient(theta)
        if float(grad.norm()) <= 1e-10:
            break
        p = torch.sigmoid(oracle.A @ theta)
        hessian = (oracle.A.T * (p * (1 - p))) @ oracle.A / oracle.n
        step = torch.linalg.solve(hessian + 1e-12 * torch.eye(oracle.dim, dtype=torch.float64), grad)
        value, size = float(oracle.loss(theta)), 1.0
        while float(oracle.loss(theta - size * step)) > value - 1e-4 * size * float(grad @ step) and size > 1e-10:
            size /= 2
        theta = theta - size * step
    return theta


def build_problem(key: str, data_dir: str | None) -> tuple[Problem, dict[str, Any]]:
    """The training oracle, test metrics and reference point of problem ``key``."""
    model, data = split_key(key)
    X_train, y_train, X_test, y_test, x_star = _arrays(data, model, data_dir)
    oracle, test = _oracle(model, X_train, y_train), _oracle(model, X_test, y_test)
    reference = torch.as_tensor(x_star) if (x_star is not None and model == "ridge") else nonprivate_optimum(oracle)
    theta0 = torch.zeros(oracle.dim, dtype=torch.float64)
    initial_error, initial_loss = float((theta0 - reference).norm()), float(test.loss(theta0))

    def extra(theta: torch.Tensor) -> dict[str, float]:
        return {"error_ratio": float((theta - reference).norm()) / initial_error,
                "loss_ratio": float(test.loss(theta)) / initial_loss}

    facts = {"n": oracle.n, "n_test": test.n, "dim": oracle.dim, "delta": 1.0 / oracle.n,
             "reference": "x*" if model == "ridge" and x_star is not None else "non-private optimum",
             "reference_norm": float(reference.norm()),
             "nonprivate_loss_ratio": float(test.loss(reference)) / initial_loss}
    X_test_t, y_test_t = test.X, test.y
    return Problem(oracle, lambda theta: oracle.error(theta, X_test_t, y_test_t), extra), facts


# ------------------------------------------------------------------------------------- methods


def _settings(data: str) -> dict[str, Any]:
    return PAPER_SETTINGS["diabetes" if data == "diabetes" else "default"]


def build_methods(key: str, epochs: int, tuned: dict[str, Params], epsilon: float) -> list[Method]:
    """CC, UC, DP-SGD and DP-GD with the paper's settings and with ours, and (at ε ≥ 1) the NOT
    PRIVATE row."""
    model, data = split_key(key)
    paper = _settings(data)
    batch = paper["batch_size"]

    def builder(name: str, radius: float) -> Callable[[int, Params], tuple[Any, int]]:
        clip0, lr0 = paper[name]

        def build(n: int, p: Params) -> tuple[Any, int]:
            clip, lr = clip0 * p["clip_factor"], lr0 * p["lr_factor"]
            if name == "DP-GD":
                return dp_gd(lr=lr, clip=clip, noise_multiplier=1.0), epochs
            steps = max(1, round(epochs * n / batch))
            if name == "DP-SGD":
                return DPSGD(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch), steps
            return AClip(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch, radius=radius), steps
        return build

    radius = CC_RADIUS[key]
    unit = {"lr_factor": 1.0, "clip_factor": 1.0}
    methods = []
    for setting in SETTINGS:
        for name in ("CC", "UC", "DP-SGD", "DP-GD"):
            build = builder(name, radius if name == "CC" else math.inf)
            label = f"{name} ({setting})"
            if setting == "paper":
                methods.append(Method(label, build, {}, {eps: unit for eps in EPSILONS}))
            else:
                chosen = tuned.get(name)
                methods.append(Method(label, build, GRID, {eps: chosen for eps in EPSILONS} if chosen else {}))
    if epsilon >= 1:  # the comparison the acceptance asks for is at ε ≥ 1
        methods.append(Method(NOT_PRIVATE, builder("CC", radius), {}, {epsilon: unit}, noise_scale=0.5))
    return methods


# ----------------------------------------------------------------------------------- the notes


def verdicts(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Per problem, ε and column set: the better AClip variant's error ratio against DP-SGD's,
    and the honest-noise price: CC (paper) against CC with the paper's (λ-calibrated) noise."""
    by = {(r["problem"], r["algorithm"], r["epsilon"]): r["metrics"] for r in payload["rows"]}
    found = []
    for problem in dict.fromkeys(r["problem"] for r in payload["rows"]):
        for epsilon in EPSILONS:
            for setting in SETTINGS:
                cells = {name: by.get((problem, f"{name} ({setting})", epsilon)) for name in ("CC", "UC", "DP-SGD")}
                if any(cell is None for cell in cells.values()):
                    continue
                best = min(("CC", "UC"), key=lambda name: cells[name]["error_ratio"]["mean"])
                aclip, dpsgd = cells[best]["error_ratio"]["mean"], cells["DP-SGD"]["error_ratio"]["mean"]
                lam = by.get((problem, NOT_PRIVATE, epsilon))
                found.append({"problem": problem, "epsilon": epsilon, "setting": setting, "AClip": best,
                              "AClip error_ratio": aclip, "DP-SGD error_ratio": dpsgd,
                              "AClip ≤ DP-SGD": aclip <= dpsgd,
                              "CC with λ-noise (NOT PRIVATE)": lam["error_ratio"]["mean"] if lam and setting == "paper"
                              else math.nan})
    return found


def _verdict_lines(payload: dict[str, Any], heavy_tailed_only: bool) -> list[str]:
    from ..report import markdown_table

    rows = verdicts(payload)
    columns = ["problem", "epsilon", "setting", "AClip", "AClip error_ratio", "DP-SGD error_ratio", "AClip ≤ DP-SGD",
               "CC with λ-noise (NOT PRIVATE)"]
    lines = ["### AClip against DP-SGD (error ratio, lower is better)", "", markdown_table(rows, columns), ""]
    scope = [r for r in rows if r["epsilon"] >= 1]
    losses = [r for r in scope if not r["AClip ≤ DP-SGD"]]
    what = "heavy-tailed synthetic sets" if heavy_tailed_only else "real data sets"
    if not losses:
        lines.append(f"* On the {what}, at ε ≥ 1, the better AClip variant's error ratio is ≤ DP-SGD's in every "
                     f"problem and column set ({len(scope)} of {len(scope)}).")
    else:
        lines.append(f"* **Not everywhere:** on the {what}, at ε ≥ 1, AClip's error ratio is above DP-SGD's in "
                     f"{len(losses)} of {len(scope)} cases: "
                     + ", ".join(f"{r['problem']} ε={r['epsilon']} ({r['setting']})" for r in losses) + ".")
    priced = [r for r in scope if r["setting"] == "paper" and math.isfinite(r["CC with λ-noise (NOT PRIVATE)"])]
    if priced:
        gaps = [by_cc - r["CC with λ-noise (NOT PRIVATE)"] for r in priced
                for by_cc in [_cc_paper(payload, r["problem"], r["epsilon"])]]
        lines.append(
            "* The first suspect is the honest 2λ sensitivity: CC run with the noise the paper's proof calibrates "
            "(sensitivity λ, half the standard deviation; NOT PRIVATE at the stated ε, its real ε is in the main "
            f"table): honest CC's error ratio minus that run's is {min(gaps):+.4f} to {max(gaps):+.4f} at ε ≥ 1 "
            "(paper settings; positive = the paper's calibration would have helped).")
    if losses:
        lines.append(
            "* The larger reason: AClip adds its noise to the clipped batch *mean* (std 2zλ), DP-SGD to the "
            "sum of clipped records, then divides by m (std zC/m on the mean). At m = 200 (24 on Diabetes) and similar clips, "
            "DP-SGD's noise on the mean is about 2m = 400 (48) times smaller for the same z; AClip saves the "
            "per-record gradients, not noise. The paper's settings hide this because its DP-SGD step size "
            "(4e−4) barely moves θ in the epochs run here; with each method's own tuned step and clip, DP-SGD "
            "wins wherever this table says False.")
    return lines


def _paper_noise_lines(payload: dict[str, Any], epochs: int) -> list[str]:
    """What the paper's σ̂ formula (c = 1) gives at these problems' settings, accounted exactly;
    and the restarted variant's advanced-composition split (τ = 4 stages) against exact composition."""
    from ..algorithms.aclip import paper_noise
    from ..report import markdown_table

    rows, seen = [], set()
    for key, facts in payload["facts"].items():
        batch = _settings(split_key(key)[1])["batch_size"]
        setting = (facts["n"], batch)
        if setting in seen:
            continue
        seen.add(setting)
        steps = max(1, round(epochs * facts["n"] / batch))
        for restarts in (1, 4):
            for epsilon in EPSILONS:
                result = paper_noise(epsilon=epsilon, delta=facts["delta"], n=facts["n"], batch_size=batch,
                                     steps=max(1, steps // restarts), restarts=restarts)
                rows.append({"n": facts["n"], "m": batch, "steps": steps, "restarts τ": restarts,
                             "claimed ε": epsilon, "σ̂/λ": result["sigma_over_lambda"],
                             "exact ε, sensitivity λ": result["rows"][0]["epsilon"],
                             "exact ε, sensitivity 2λ": result["rows"][1]["epsilon"]})
    columns = ["n", "m", "steps", "restarts τ", "claimed ε", "σ̂/λ", "exact ε, sensitivity λ",
               "exact ε, sensitivity 2λ"]
    return ["", "### The paper's noise formula at these settings (`dpopt account --explain aclip`)", "",
            "σ̂ = λ·m·√(N ln(1/δ))/(nε) (Theorem 2 with c = 1); τ = 4: the paper's advanced-composition "
            "split over 4 stages of N/4 steps (Theorem 5). Exact ε: PLD over all steps.", "",
            markdown_table(rows, columns)]


def _cc_paper(payload: dict[str, Any], problem: str, epsilon: float) -> float:
    for row in payload["rows"]:
        if row["problem"] == problem and row["algorithm"] == "CC (paper)" and row["epsilon"] == epsilon:
            return row["metrics"]["error_ratio"]["mean"]
    return math.nan


def _edges(payload: dict[str, Any]) -> list[str]:
    """Tuned choices at an edge of ``GRID`` (a wider grid might have done better)."""
    found = []
    for row in payload["rows"]:
        if row["algorithm"].endswith("(tuned)") and row["epsilon"] == TUNE_EPSILON:
            at = [f"{name}={row['params'][name]:g}" for name, values in GRID.items()
                  if row["params"][name] in (values[0], values[-1])]
            if at:
                found.append(f"{row['problem']} {row['algorithm']} ({', '.join(at)})")
    return found


def _common_notes(payload: dict[str, Any], epochs: int, paper_epochs: int) -> list[str]:
    facts = payload["facts"]
    edges = _edges(payload)
    refs = "; ".join(f"{key}: n = {f['n']:,}, δ = {f['delta']:.3g}, x_ref = {f['reference']} "
                     f"(‖x_ref‖ = {f['reference_norm']:.3f}, its loss ratio {f['nonprivate_loss_ratio']:.4f})"
                     for key, f in facts.items())
    return [
        f"* Paper: 300 runs, {paper_epochs} epochs. Ours: {payload['seeds']} seeds, {epochs} epochs; every "
        "method gets the same number of data passes. Accountant: PLD (dp_accounting), exact composition of "
        "the per-step events; adjacency add/remove-one (Poisson: CC, UC, DP-SGD) or replace-one (DP-GD).",
        "* AClip's noise is calibrated with the honest sensitivity 2λ of the clipped mean (the paper's proof "
        "uses λ): at the same ε, our CC/UC carry twice the noise standard deviation the paper's formula "
        "assumes. The row 'CC, λ-noise (NOT PRIVATE)' shows what the paper's calibration buys.",
        "* `loss_ratio` = test loss at the averaged output / test loss at θ0 = 0, the quantity the paper's "
        "code computes for its 'estimation error divided by initial error' (the paper itself never defines "
        "it); the paper's columns are set beside it. `error_ratio` = ‖θ̄ − x_ref‖/‖θ0 − x_ref‖. "
        f"Problems: {refs}.",
        "* DP-GD is full-batch gradient descent with per-record clipping (ALGORITHMS.md §5), not the robust "
        "mean estimator of the paper's reference [43]; it takes one step per epoch, as in the paper's code.",
        "* Sampling is Poisson at rate m/n, as the paper's Algorithm 1 states (its code samples a fixed-size "
        "batch with replacement). Wall time: training only (sampling, steps, ledger), per run, one thread.",
        f"* Tuned column set: factors on the paper's (γ, λ) from `{GRID}`, 3 tuning seeds (not the evaluation "
        "seeds), by mean final training objective at ε = 1, then used at every ε. Tuning is not "
        "privacy-accounted. " + ("Choices at an edge of the grid: " + "; ".join(edges) + ". (For AClip, once the "
                                  "clip binds the step is γλ·(unit direction + noise of std 2z), so it depends on "
                                  "γλ only: an edge pair such as (4096, 1/64) has interior equivalents like "
                                  "(256, 1/4); edges in one factor alone are real limits of the grid.)"
                                  if edges else "No choice is at an edge of the grid."),
    ]


def _notes(payload: dict[str, Any], epochs: int, paper_epochs: int, data_notes: list[str], synthetic: bool) -> str:
    lines = _common_notes(payload, epochs, paper_epochs) + data_notes + [""]
    return "\n".join(lines + _verdict_lines(payload, heavy_tailed_only=synthetic) + _paper_noise_lines(payload, epochs))


def _synthetic_notes(payload: dict[str, Any]) -> str:
    return _notes(payload, SYNTHETIC_EPOCHS, 400, [
        "* Synthetic data (`dpopt.data.synthetic.heavy_tailed`, seed 0): the paper does not say how the features "
        "and x* are drawn; ours are ξ_i ~ N(0, I_10) and x* ~ N(0, I_10)/√10. Noise: Student's t (2 d.f.), "
        "Laplace (μ = 1, b = 1) and χ² (1 d.f.), each centred. Logistic labels y = sign(exp(−u) − 1/2), "
        "u = ⟨x*, ξ⟩ + e (the paper's printed formula, 2·sign[·] − 1, would give {1, −3}); their non-private "
        "optimum is not x*, so logistic errors are measured against that optimum. 100,000 records train, 25,000 "
        "more (same generator) are the test set.",
        f"* {SYNTHETIC_EPOCHS} epochs instead of 400: 400 epochs at batch 200 are 200,000 steps per run, hours per "
        "table on 2 cores; the trajectories (figures) show how far each method got."], synthetic=True)


def _real_notes(payload: dict[str, Any]) -> str:
    return _notes(payload, REAL_EPOCHS, 30, [
        "* Adult: the first 21,000 of the 32,561 LIBSVM a9a training records train, the other 11,561 test (the "
        "paper's text; its code uses 28,000). Features unchanged (binary). Diabetes (Pima): the first 500 of 768 "
        "records train, 268 test; features standardised with the training split's mean and std (the paper "
        "names no preprocessing; raw features range up to 846). Diabetes λ: the paper gives none, Adult's are "
        "used; its UC step size is printed '1E2', read as 1e−2."], synthetic=False)


SYNTHETIC_EPOCHS = 5
#: Logged points per run (each costs a full-data objective, gradient and ε): enough for the figures.
LOG_POINTS = 10
REAL_EPOCHS = 30
SYNTHETIC_DATA = NOISES
REAL_DATA = ("diabetes", "adult")

#: Chosen by ``dpopt reproduce aclip-… --retune`` (grid ``GRID`` of factors on the paper's
#: (γ, λ), 3 tuning seeds, at ε = 1, by mean final training objective): problem → method → factors.
TUNED: dict[str, dict[str, Params]] = {
    "logistic:diabetes": {
        "CC": {"lr_factor": 64, "clip_factor": 0.0625},
        "UC": {"lr_factor": 16, "clip_factor": 0.0625},
        "DP-SGD": {"lr_factor": 4, "clip_factor": 4},
        "DP-GD": {"lr_factor": 64, "clip_factor": 0.25},
    },
    "logistic:adult": {
        "CC": {"lr_factor": 256, "clip_factor": 0.0625},
        "UC": {"lr_factor": 1024, "clip_factor": 0.015625},
        "DP-SGD": {"lr_factor": 256, "clip_factor": 4},
        "DP-GD": {"lr_factor": 1024, "clip_factor": 4},
    },
    "ridge:diabetes": {
        "CC": {"lr_factor": 4, "clip_factor": 0.25},
        "UC": {"lr_factor": 4, "clip_factor": 0.0625},
        "DP-SGD": {"lr_factor": 1, "clip_factor": 4},
        "DP-GD": {"lr_factor": 4, "clip_factor": 4},
    },
    "ridge:adult": {
        "CC": {"lr_factor": 64, "clip_factor": 0.0625},
        "UC": {"lr_factor": 64, "clip_factor": 0.0625},
        "DP-SGD": {"lr_factor": 16, "clip_factor": 16},
        "DP-GD": {"lr_factor": 256, "clip_factor": 16},
    },
    "logistic:student-t": {
        "CC": {"lr_factor": 1024, "clip_factor": 0.0625},
        "UC": {"lr_factor": 4096, "clip_factor": 0.015625},
        "DP-SGD": {"lr_factor": 64, "clip_factor": 4},
        "DP-GD": {"lr_factor": 4096, "clip_factor": 4},
    },
    "logistic:laplace": {
        "CC": {"lr_factor": 1024, "clip_factor": 0.0625},
        "UC": {"lr_factor": 4096, "clip_factor": 0.015625},
        "DP-SGD": {"lr_factor": 64, "clip_factor": 4},
        "DP-GD": {"lr_factor": 4096, "clip_factor": 4},
    },
    "logistic:chi2": {
        "CC": {"lr_factor": 1024, "clip_factor": 0.0625},
        "UC": {"lr_factor": 4096, "clip_factor": 0.015625},
        "DP-SGD": {"lr_factor": 16, "clip_factor": 4},
        "DP-GD": {"lr_factor": 4096, "clip_factor": 4},
    },
    "ridge:student-t": {
        "CC": {"lr_factor": 64, "clip_factor": 0.25},
        "UC": {"lr_factor": 64, "clip_factor": 0.25},
        "DP-SGD": {"lr_factor": 4, "clip_factor": 16},
        "DP-GD": {"lr_factor": 1024, "clip_factor": 4},
    },
    "ridge:laplace": {
        "CC": {"lr_factor": 256, "clip_factor": 0.0625},
        "UC": {"lr_factor": 256, "clip_factor": 0.25},
        "DP-SGD": {"lr_factor": 16, "clip_factor": 4},
        "DP-GD": {"lr_factor": 4096, "clip_factor": 1},
    },
    "ridge:chi2": {
        "CC": {"lr_factor": 64, "clip_factor": 0.25},
        "UC": {"lr_factor": 1024, "clip_factor": 0.0625},
        "DP-SGD": {"lr_factor": 16, "clip_factor": 4},
        "DP-GD": {"lr_factor": 1024, "clip_factor": 4},
    },
}
#: What that tuning cost (grid points × 3 seeds; wall seconds with 2 worker processes on the 2-core
#: machine while other jobs shared it). Not privacy-accounted.
TUNING_COST: dict[str, Any] = {
    "logistic:diabetes CC": {"runs": 126, "wall_time_s": 16.8},
    "logistic:diabetes UC": {"runs": 126, "wall_time_s": 31.1},
    "logistic:diabetes DP-SGD": {"runs": 126, "wall_time_s": 18.5},
    "logistic:diabetes DP-GD": {"runs": 126, "wall_time_s": 0.8},
    "logistic:adult CC": {"runs": 126, "wall_time_s": 147.9},
    "logistic:adult UC": {"runs": 126, "wall_time_s": 168.0},
    "logistic:adult DP-SGD": {"runs": 126, "wall_time_s": 106.7},
    "logistic:adult DP-GD": {"runs": 126, "wall_time_s": 15.2},
    "ridge:diabetes CC": {"runs": 126, "wall_time_s": 8.0},
    "ridge:diabetes UC": {"runs": 126, "wall_time_s": 7.3},
    "ridge:diabetes DP-SGD": {"runs": 126, "wall_time_s": 8.4},
    "ridge:diabetes DP-GD": {"runs": 126, "wall_time_s": 0.5},
    "ridge:adult CC": {"runs": 126, "wall_time_s": 69.7},
    "ridge:adult UC": {"runs": 126, "wall_time_s": 107.9},
    "ridge:adult DP-SGD": {"runs": 126, "wall_time_s": 123.6},
    "ridge:adult DP-GD": {"runs": 126, "wall_time_s": 10.9},
    "logistic:student-t CC": {"runs": 126, "wall_time_s": 42.2},
    "logistic:student-t UC": {"runs": 126, "wall_time_s": 49.1},
    "logistic:student-t DP-SGD": {"runs": 126, "wall_time_s": 48.4},
    "logistic:student-t DP-GD": {"runs": 126, "wall_time_s": 1.8},
    "logistic:laplace CC": {"runs": 126, "wall_time_s": 55.5},
    "logistic:laplace UC": {"runs": 126, "wall_time_s": 53.7},
    "logistic:laplace DP-SGD": {"runs": 126, "wall_time_s": 60.4},
    "logistic:laplace DP-GD": {"runs": 126, "wall_time_s": 3.0},
    "logistic:chi2 CC": {"runs": 126, "wall_time_s": 53.5},
    "logistic:chi2 UC": {"runs": 126, "wall_time_s": 51.2},
    "logistic:chi2 DP-SGD": {"runs": 126, "wall_time_s": 47.5},
    "logistic:chi2 DP-GD": {"runs": 126, "wall_time_s": 3.7},
    "ridge:student-t CC": {"runs": 126, "wall_time_s": 40.2},
    "ridge:student-t UC": {"runs": 126, "wall_time_s": 44.1},
    "ridge:student-t DP-SGD": {"runs": 126, "wall_time_s": 49.1},
    "ridge:student-t DP-GD": {"runs": 126, "wall_time_s": 3.3},
    "ridge:laplace CC": {"runs": 126, "wall_time_s": 43.9},
    "ridge:laplace UC": {"runs": 126, "wall_time_s": 50.0},
    "ridge:laplace DP-SGD": {"runs": 126, "wall_time_s": 41.3},
    "ridge:laplace DP-GD": {"runs": 126, "wall_time_s": 3.4},
    "ridge:chi2 CC": {"runs": 126, "wall_time_s": 46.8},
    "ridge:chi2 UC": {"runs": 126, "wall_time_s": 55.2},
    "ridge:chi2 DP-SGD": {"runs": 126, "wall_time_s": 50.0},
    "ridge:chi2 DP-GD": {"runs": 126, "wall_time_s": 2.8},
}

def delta(key: str) -> float:
    """δ = 1/n, n the problem's training-set size."""
    data = split_key(key)[1]
    return 1.0 / N_TRAIN[data if data in N_TRAIN else "synthetic"]


def _preset(name: str, datasets: tuple[str, ...], epochs: int, describe: Any) -> Experiment:
    return Experiment(
        NAME=name, PROBLEMS=tuple(f"{m}:{d}" for m in MODELS for d in datasets), EPSILONS=EPSILONS,
        PAPER=convex_rows(datasets), METRICS=METRICS, TABLE_METRICS=TABLE_METRICS, PAPER_METRICS=PAPER_METRICS,
        TEST_METRICS=TEST_METRICS, COMPARISONS=COMPARISONS, epochs=epochs,
        make_problem=build_problem, make_methods=build_methods, delta_of=delta, describe=describe, CURVES=CURVES,
        TUNED=TUNED, TUNING_COST=TUNING_COST, TUNING_SEEDS=TUNING_SEEDS, TUNE_EPSILON=TUNE_EPSILON,
        LOG_POINTS=LOG_POINTS)


SYNTHETIC = _preset("aclip-synthetic", SYNTHETIC_DATA, SYNTHETIC_EPOCHS, _synthetic_notes)
REAL = _preset("aclip-real", REAL_DATA, REAL_EPOCHS, _real_notes)


