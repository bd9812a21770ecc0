"""The DIFF2 paper's regression data sets: sizes, the fixed 80/20 split, known values, preparation."""

import numpy as np
import pytest
import torch

from dpopt.data import load
from dpopt.data.tabular import prepared, split
from dpopt.models import mlp


@pytest.fixture(scope="module")
def housing(shared_data_dir):
    return load("california_housing", shared_data_dir)


def test_california_housing_split_and_known_values(housing):
    assert housing.task == "regression"
    assert housing.X_train.shape == (16_512, 8) and housing.X_test.shape == (4_128, 8)
    every = np.vstack([housing.X_train, housing.X_test])
    targets = np.concatenate([housing.y_train, housing.y_test])
    # the README's file: 20,640 rows, mean median house value 206,855.8; first row -122.23, 37.88, …
    assert targets.mean() == pytest.approx(206_855.8, abs=0.1)
    assert any(np.array_equal(row, [-122.23, 37.88, 41, 880, 129, 322, 126, 8.3252]) for row in every[:, :8]
               if row[0] == -122.23 and row[1] == 37.88)


def test_split_is_a_fixed_permutation_80_20():
    X, y = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    X_train, y_train, X_test, y_test = split(X, y)
    assert len(y_train) == 8 and len(y_test) == 2
    assert sorted(np.concatenate([y_train, y_test])) == list(range(10))
    assert np.array_equal(X_train[:, 1] // 2, y_train)  # rows stay whole
    assert np.array_equal(split(X, y)[1], y_train) and not np.array_equal(split(X, y, seed=1)[1], y_train)


def test_preparation_standardises_with_training_statistics_and_scales_the_target(housing):
    ready = prepared(housing)
    assert np.allclose(ready.X_train.mean(axis=0), 0, atol=1e-12)
    assert np.allclose(ready.X_train.std(axis=0), 1, atol=1e-12)
    top = max(np.abs(housing.y_train).max(), np.abs(housing.y_test).max())
    assert np.allclose(ready.y_test, housing.y_test / top, rtol=1e-15)
    assert max(np.abs(ready.y_train).max(), np.abs(ready.y_test).max()) == 1.0


@pytest.mark.parametrize(("name", "n_train", "dim"), [("gas_turbine", 29_386, 9), ("blogfeedback", 48_016, 280)])
def test_other_regression_sets(shared_data_dir, name, n_train, dim):
    ds = load(name, shared_data_dir)
    assert ds.X_train.shape == (n_train, dim) and ds.task == "regression"
    assert ds.n + len(ds.y_test) == {"gas_turbine": 36_733, "blogfeedback": 60_021}[name]


def test_mlp_shape_and_initialisation_range():
    model = mlp(8, seed=3)
    assert sum(p.numel() for p in model.parameters()) == 8 * 10 + 10 + 10 + 1
    assert model(torch.zeros(4, 8, dtype=torch.float64)).shape == (4,)
    first, second = model[0], model[2]
    assert first.weight.abs().max() <= 8 ** -0.5 and second.weight.abs().max() <= 10 ** -0.5
    assert first.weight.abs().max() > 0.9 * 8 ** -0.5  # the whole range is used
    assert torch.equal(first.weight, mlp(8, seed=3)[0].weight)
    assert mlp(8, outputs=3)(torch.zeros(4, 8, dtype=torch.float64)).shape == (4, 3)
