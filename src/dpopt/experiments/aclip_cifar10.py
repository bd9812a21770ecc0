"""Seed 002's CIFAR-10 experiment (its Table 3): ResNet-18 trained with AClip and DP-SGD.

Batch 500, λ = 30, ε ∈ {2, 4, 6}, δ = 1e−5, 150 epochs: sized for a GPU (the same code runs on
one when present). ``--quick`` is a CPU smoke version on a few records. The declared data (the
paper's table, the methods' settings, the notes) is ``presets/aclip-cifar10.toml``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..algorithms import DPSGD, AClip
from ..data import load
from ..data.bounds import Preparation
from ..json_types import JsonObject
from . import declared
from ._runner import Params, Problem
from ._torch import classifier_problem
from .declared import Settings, number
from .payload import ProblemKey, named
from ..jobs.preparation import registered
from .preset import Build, declared_experiment, declared_methods

DATA = declared.load("aclip-cifar10")
SMOKE_RECORDS = DATA.parameter("smoke_records")


def preparation(key: ProblemKey) -> Preparation:
    """CIFAR-10's registered public preparation (pixels / 255: nothing to do), for both problems."""
    return registered("cifar10")


def cifar_arrays(data_dir: str | None, records: int | None) -> tuple[np.ndarray, ...]:
    """CIFAR-10 train and test arrays (the first ``records`` of each for the smoke version)."""
    data = preparation("resnet18:cifar10").prepare(load("cifar10", data_dir))
    cut = slice(None) if records is None else slice(records)
    return data.X_train[cut], data.y_train[cut], data.X_test[cut], data.y_test[cut]


def build_cifar_problem(key: ProblemKey, data_dir: str | None) -> tuple[Problem, JsonObject]:
    """ResNet-18 (GroupNorm) on CIFAR-10 from its initial weights; key ``resnet18:cifar10-smoke``
    uses ``smoke_records`` records."""
    smoke = named(key).endswith("-smoke")
    problem = classifier_problem("resnet18", *cifar_arrays(data_dir, SMOKE_RECORDS if smoke else None),
                                 microbatch_size=8 if smoke else 64)
    facts: JsonObject = {"n": problem.oracle.n, "dim": problem.oracle.dim, "smoke": smoke, "delta": DATA["delta"]}
    return problem, facts


def _builder(algorithm: type[AClip] | type[DPSGD]) -> Callable[[Settings, float, ProblemKey], Build[AClip | DPSGD]]:
    """AClip (λ = ``clip``, unconstrained: the paper's UC) or DP-SGD (C = ``clip``) at the file's batch
    (the smoke version's, for ``smoke_steps`` steps), for the preset's epochs."""
    def builder(settings: Settings, epsilon: float, key: ProblemKey) -> Build[AClip | DPSGD]:
        smoke = named(key).endswith("-smoke")
        batch = DATA.parameter("smoke_batch_size" if smoke else "batch_size")

        def build(n: int, p: Params) -> tuple[AClip | DPSGD, int]:
            steps = DATA.parameter("smoke_steps") if smoke else round(DATA["epochs"] * n / batch)
            lr, clip = number(settings["lr"], "lr"), number(settings["clip"], "clip")
            return algorithm(lr=lr, clip=clip, noise_multiplier=1.0, batch_size=batch), steps
        return build
    return builder


CIFAR = declared_experiment(DATA, make_problem=build_cifar_problem, preparation=preparation,
                            make_methods=declared_methods(DATA, {"UC": _builder(AClip), "DP-SGD": _builder(DPSGD)}))
