"""Seed 000, Table 1: nonconvex logistic regression on ijcnn1 (DP-SRM vs its baselines).

Objective: F(θ) = (1/n) Σ log(1 + exp(−y_i⟨x_i, θ⟩)) + λ Σ_j θ_j²/(1 + θ_j²). DP-SRM with C1 = 1,
C2 = 0.01, γ = C2 (the paper's settings); DP-GD, DP-AGD and RRPSGD with clip 1; non-private STORM
(b0 = 2b, momentum 0.01) as the reference. The declared data (ε, δ, the paper's table, grids, the
tuned values with the date and command of their tuning, passes) is ``presets/dp-srm-ijcnn1.toml``;
this module builds the problem and the methods from it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..algorithms import DPAGD, DPSGD, DPSRM, Storm, dp_gd, rrpsgd
from ..data import load
from ..data.bounds import Preparation
from ..json_types import JsonObject
from ..oracles import NonconvexLogistic
from . import declared
from ._runner import Params, Problem, steps_for_passes
from ..jobs.preparation import registered
from .declared import Settings, number
from .payload import ProblemKey
from .preset import Build, declared_experiment, declared_methods

DATA = declared.load("dp-srm-ijcnn1")
NAME = DATA["name"]


def _passes(settings: Settings, epsilon: float) -> float:
    passes = settings["passes"]
    return number(passes[str(epsilon)] if isinstance(passes, dict) else passes, "passes")


def _dp_srm(settings: Settings, epsilon: float, key: ProblemKey) -> Build[DPSRM]:
    def build(n: int, p: Params) -> tuple[DPSRM, int]:
        b0 = p["batch_size"] * p["b0_factor"]
        algo = DPSRM(lr=p["lr"], clip=1.0, clip_diff=0.01, gamma=0.01, noise_multiplier0=1.0, noise_multiplier=1.0,
                     batch_size0=b0, batch_size=p["batch_size"])
        return algo, steps_for_passes(_passes(settings, epsilon), n, b0, p["batch_size"])
    return build


def _rrpsgd(settings: Settings, epsilon: float, key: ProblemKey) -> Build[DPSGD]:
    def build(n: int, p: Params) -> tuple[DPSGD, int]:
        algo = rrpsgd(lr=p["lr"], clip=1.0, noise_multiplier=1.0, batch_size=p["batch_size"])
        return algo, steps_for_passes(_passes(settings, epsilon), n, p["batch_size"], p["batch_size"])
    return build


def _dp_gd(settings: Settings, epsilon: float, key: ProblemKey) -> Build[DPSGD]:
    def build(n: int, p: Params) -> tuple[DPSGD, int]:
        return dp_gd(lr=p["lr"], clip=1.0, noise_multiplier=1.0), int(_passes(settings, epsilon))
    return build


def _dp_agd(settings: Settings, epsilon: float, key: ProblemKey) -> Build[DPAGD]:
    def build(n: int, p: Params) -> tuple[DPAGD, int]:
        steps = DATA.parameter("dpagd_max_steps")
        return DPAGD(clip=1.0, obj_clip=1.0, noise_multiplier=1.0, max_step=p["max_step"]), steps
    return build


def _storm(settings: Settings, epsilon: float, key: ProblemKey) -> Build[Storm]:
    def build(n: int, p: Params) -> tuple[Storm, int]:
        b0 = p["batch_size"] * 2
        algo = Storm(lr=p["lr"], momentum=0.01, batch_size0=b0, batch_size=p["batch_size"])
        return algo, steps_for_passes(_passes(settings, epsilon), n, b0, p["batch_size"])
    return build


BUILDERS = {"DP-SRM": _dp_srm, "DP-GD": _dp_gd, "DP-AGD": _dp_agd, "RRPSGD": _rrpsgd, "STORM": _storm}


def preparation(key: ProblemKey) -> Preparation:
    """ijcnn1 as LIBSVM scaled it, in [-1, 1] (its registered public preparation: nothing to do)."""
    return registered(DATA.parameter("dataset"))


def majority_test_error(y_test: np.ndarray) -> float:
    """The test error of the best constant classifier on the test set, 1 − (the share of its most
    frequent label): a statistic of the test labels alone, outside the protected training set."""
    _, counts = np.unique(y_test, return_counts=True)
    return float(1 - counts.max() / len(y_test))


def problem(key: ProblemKey, data_dir: str | None) -> tuple[Problem, JsonObject]:
    """The ijcnn1 oracle, its test error, and facts for the report (the majority-class test error)."""
    data = preparation(key).prepare(load(DATA.parameter("dataset"), data_dir))
    oracle = NonconvexLogistic(torch.as_tensor(data.X_train), torch.as_tensor(data.y_train), reg=DATA.parameter("reg"))
    X_test, y_test = torch.as_tensor(data.X_test), torch.as_tensor(data.y_test)
    facts: JsonObject = {"n": data.n, "dim": data.dim, "majority_class_test_error": majority_test_error(data.y_test),
                         "source": data.source}
    return Problem(oracle, lambda theta: oracle.error(theta, X_test, y_test)), facts


PRESET = declared_experiment(DATA, make_problem=problem, make_methods=declared_methods(DATA, BUILDERS),
                             preparation=preparation)
