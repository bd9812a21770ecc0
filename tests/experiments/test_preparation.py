"""Every bench problem and every preset problem declares how its data are prepared, and a
preparation that reads the data is labelled NOT PRIVATE wherever its results are shown.

:func:`unlabelled_data_dependent` is the check: a declared preparation not labelled NOT PRIVATE
must prepare every record on its own, which is tested by changing one training record to an
extreme one and comparing every other prepared record. The walks run it over every problem of
``problems.toml`` (every variant) and every preset; mutants show what it catches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpopt import experiments
from dpopt._validate import DpoptError
from dpopt.bench import problems, tasks
from dpopt.data import Dataset
from dpopt.data.bounds import PublicBounds, Range
from dpopt.data.tabular import prepared
from dpopt.jobs.preparation import LABEL, SYNTHETIC, NotPrivate, described, is_public

VARIANTS = (None, "quick", "main")


def toy(preparation) -> Dataset:
    """Random data of the shape ``preparation`` expects: regression if it bounds a target."""
    features = getattr(preparation, "features", None)
    dim = len(features) if isinstance(features, tuple) else 5
    rng = np.random.default_rng(0)
    regression = getattr(preparation, "target", None) is not None
    y = rng.normal(size=60) * 100 if regression else np.where(rng.random(60) < 0.5, -1.0, 1.0)
    X = rng.normal(size=(60, dim)) * 10 + 3
    return Dataset("toy", "regression" if regression else "binary", X[:40], y[:40], X[40:], y[40:], "toy")


def unlabelled_data_dependent(preparation) -> bool:
    """Whether ``preparation`` is neither labelled NOT PRIVATE nor prepares each record on its own:
    one training record changed to an extreme one must leave every other prepared record as it was."""
    if isinstance(preparation, NotPrivate):
        return False
    if not is_public(preparation):
        return True  # not a declared kind: nothing says what it reads
    data = toy(preparation)
    X, y = data.X_train.copy(), data.y_train.copy()
    X[0], y[0] = 1e4, 1e6 if data.task == "regression" else -1.0
    one, other = preparation.prepare(data), preparation.prepare(dataclasses.replace(data, X_train=X, y_train=y))
    return not all(np.array_equal(a, b) for a, b in ((one.X_train[1:], other.X_train[1:]),
                                                      (one.y_train[1:], other.y_train[1:]),
                                                      (one.X_test, other.X_test), (one.y_test, other.y_test)))


def bench_preparations() -> dict[str, object]:
    return {f"{name} ({variant})": tasks.preparation(problem.task) for variant in VARIANTS
            for name, problem in problems(variant).items()}


def preset_preparations() -> dict[str, object]:
    return {f"{name} {key}": exp.preparation(key) for name, exp in experiments.EXPERIMENTS.items()
            for key in exp.PROBLEMS + (exp.SMOKE_PROBLEMS or ())}


def test_every_bench_problem_prepares_its_data_publicly():
    """Finding: the bench's california-diff2 standardised its features with the training mean and std
    and divided its target by max |y| over both splits, while its tables claimed ε. Every problem of
    problems.toml, in every variant, now declares a public preparation, each record on its own."""
    declared = bench_preparations()
    assert len(declared) >= 8
    assert [name for name, preparation in declared.items() if not is_public(preparation)] == []
    assert [name for name, preparation in declared.items() if unlabelled_data_dependent(preparation)] == []
    assert isinstance(declared["california-diff2 (None)"], PublicBounds)


def test_every_preset_declares_its_preparation_and_labels_one_that_reads_the_data():
    declared = preset_preparations()
    assert len(declared) == sum(len(exp.PROBLEMS + (exp.SMOKE_PROBLEMS or ()))
                                for exp in experiments.EXPERIMENTS.values())
    assert [name for name, preparation in declared.items() if unlabelled_data_dependent(preparation)] == []
    labelled = sorted(name for name, preparation in declared.items() if not is_public(preparation))
    assert labelled == sorted([*(f"diff2-regression {key}"
                                 for key in experiments.EXPERIMENTS["diff2-regression"].PROBLEMS
                                 + experiments.EXPERIMENTS["diff2-regression"].SMOKE_PROBLEMS),
                               *(f"diff2-classification {key}" for key in ("kddcup99", "kddcup99:2000")),
                               "aclip-real logistic:diabetes", "aclip-real ridge:diabetes"])
    assert all(described(declared[name]).startswith(LABEL) for name in labelled)


class Unnamed:
    """A mutant: the paper's standardisation, not declared as NotPrivate."""

    def prepare(self, dataset: Dataset) -> Dataset:
        return prepared(dataset)


@dataclasses.dataclass(frozen=True)
class Disguised(PublicBounds):
    """A mutant: declared as public bounds, but scaling the target by its largest |y| in the data."""

    def prepare(self, dataset: Dataset) -> Dataset:
        done = super().prepare(dataset)
        return dataclasses.replace(done, y_train=done.y_train / np.abs(dataset.y_train).max())


@pytest.mark.parametrize("mutant", [Unnamed(), Disguised(features=(Range(-10, 10),) * 3, target=Range(-500, 500))])
def test_the_check_catches_an_unlabelled_preparation_that_reads_the_data(mutant, monkeypatch):
    """Mutants in a bench problem: the old california-diff2 preparation, undeclared; a public-bounds
    look-alike that reads the data. Each is caught; its honest twin, labelled, is not."""
    assert unlabelled_data_dependent(mutant)
    assert not unlabelled_data_dependent(NotPrivate("the paper's", prepared))
    monkeypatch.setattr(tasks, "registered", lambda dataset: mutant)
    assert "california-diff2 (None)" in [name for name, p in bench_preparations().items()
                                         if unlabelled_data_dependent(p)]


def test_a_bench_problem_on_a_data_set_without_public_bounds_is_refused():
    with pytest.raises(DpoptError, match="dataset='diabetes' declares no public bounds"):
        tasks.build_task({"kind": "glm", "dataset": "diabetes", "model": "logistic", "reg": 0.0},
                         validation_fraction=0.2, data_dir=None)
    assert tasks.preparation({"kind": "truncated-absolute", "dim": 8, "n": 100, "cap": 2.0}) is SYNTHETIC


def test_the_bench_prepares_california_housing_from_its_public_bounds(shared_data_dir):
    """The task's records are the raw records mapped with the declared public ranges: inside [-1, 1]
    (the paper's standardisation gave features beyond 30 standard deviations)."""
    task = tasks.build_task(problems()["california-diff2"].task, validation_fraction=0.2, data_dir=str(shared_data_dir))
    X, y = task.oracle.X, task.oracle.y
    assert float(X.abs().max()) <= 1.0 and float(y.abs().max()) <= 1.0
    assert float(X.abs().max()) == pytest.approx(1.0) and task.oracle.n == round(0.8 * 16_512)
    assert torch.isfinite(torch.tensor(task.test_error(task.theta0)))
