"""Preparation from public bounds: values, errors, and that it prepares each record on its own."""

import numpy as np
import pytest

from dpopt._validate import DpoptError
from dpopt.data import Dataset, load, preparation
from dpopt.data.bounds import AsGiven, PublicBounds, Range, feature_ranges
from dpopt.data.tabular import prepared


def _regression(X: np.ndarray, y: np.ndarray) -> Dataset:
    return Dataset("toy", "regression", X, y, X[:2], y[:2], "toy")


def test_features_and_target_are_clipped_to_their_ranges_and_mapped_onto_minus_one_one():
    X = np.array([[-5.0, 0.0], [5.0, 1.0], [20.0, 0.5]])
    ready = PublicBounds((Range(0, 10), Range(0, 1)), target=Range(100, 300)).prepare(
        _regression(X, np.array([0.0, 200.0, 1e9])))
    assert np.array_equal(ready.X_train, [[-1.0, -1.0], [0.0, 1.0], [1.0, 0.0]])
    assert np.array_equal(ready.y_train, [-1.0, 0.0, 1.0])
    assert "prepared from public bounds (given by the user)" in ready.source


def test_one_range_serves_every_feature_and_rows_are_scaled_to_the_row_norm():
    X = np.array([[10.0, 10.0, 10.0, 10.0], [5.0, 5.0, 5.0, 6.0]])
    ready = PublicBounds(Range(0, 10), target=Range(0, 1), row_norm=1.0).prepare(_regression(X, np.zeros(2)))
    assert np.allclose(ready.X_train[0], [0.5, 0.5, 0.5, 0.5])  # (1, 1, 1, 1) has norm 2: halved
    assert np.allclose(ready.X_train[1], [0.0, 0.0, 0.0, 0.2], rtol=0, atol=1e-15)  # norm 0.2 ≤ 1: unchanged


def test_preparation_of_a_record_depends_on_that_record_alone():
    """Replacing one training record changes no other prepared record: the preparation uses no
    statistic of the data, so it costs no privacy. Mutant caught: the DIFF2 paper's preparation
    (standardised with the training rows' mean and deviation, the target divided by its largest
    value), which moves every record."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 10, size=(50, 3)), rng.uniform(0, 100, size=50)
    X_other, y_other = X.copy(), y.copy()
    X_other[0], y_other[0] = [1e6, -1e6, 3.0], 1e6

    def others_unchanged(prepare) -> bool:
        one, other = prepare(_regression(X, y)), prepare(_regression(X_other, y_other))
        return np.array_equal(one.X_train[1:], other.X_train[1:]) and np.array_equal(one.y_train[1:], other.y_train[1:])

    assert others_unchanged(PublicBounds(Range(0, 10), target=Range(0, 100), row_norm=1.0).prepare)
    assert not others_unchanged(prepared)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Range(1, 1), "range=[1, 1] must be finite with low < high"),
    (lambda: Range.parse("target_bounds", "0-1"), "target_bounds='0-1' must be LOW:HIGH with finite numbers"),
    (lambda: PublicBounds(Range(0, 1), row_norm=0.0), "row_norm=0.0 must be > 0 and finite"),
    (lambda: PublicBounds((Range(0, 1),) * 3, Range(0, 1)).prepare(_regression(np.ones((3, 2)), np.ones(3))),
     "feature_bounds has 3 ranges; the data set 'toy' has 2 features"),
    (lambda: PublicBounds(Range(0, 1)).prepare(_regression(np.ones((3, 2)), np.ones(3))),
     "target_bounds must be given for the regression data set 'toy'"),
])
def test_bad_bounds_are_refused_with_the_argument_named(make, message):
    with pytest.raises(DpoptError, match=message.replace("[", r"\[").replace("(", r"\(")):
        make()


def test_feature_ranges_from_a_json_file_by_column_name_or_in_order(tmp_path):
    named, listed = tmp_path / "named.json", tmp_path / "listed.json"
    named.write_text('{"b": [0, 2], "a": [-1, 1]}')
    listed.write_text("[[-1, 1], [0, 2]]")
    expected = (Range(-1, 1), Range(0, 2))
    assert feature_ranges(str(named), ("a", "b")) == expected == feature_ranges(str(listed))
    assert feature_ranges("0:5") == Range(0, 5)
    with pytest.raises(DpoptError, match="must name exactly the feature columns a, c"):
        feature_ranges(str(named), ("a", "c"))


def test_california_housing_is_prepared_from_its_declared_public_bounds(shared_data_dir):
    """Finding: its raw features (rooms in thousands) and target (dollars) gave ridge an objective
    of 2.65e10. Its declared bounds put every feature and the target in [−1, 1]."""
    ready = preparation("california_housing").prepare(load("california_housing", shared_data_dir))
    for values in (ready.X_train, ready.X_test, ready.y_train, ready.y_test):
        assert np.abs(values).max() <= 1.0
    assert ready.X_train.std(axis=0).min() > 0.01  # no feature squashed to a constant
    assert isinstance(preparation("adult"), AsGiven) and preparation("gas_turbine") is None
