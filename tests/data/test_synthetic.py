"""Tests of the heavy-tailed synthetic data of the AClip paper.

Every statistical bound is derived from the exact distribution (5 standard errors, or a KS test)
with a fixed seed; n = 100,000 as in the paper.
"""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpopt._validate import DpoptError
from dpopt.data import NOISES, Dataset, heavy_tailed

N = 100_000
SEED = 0

# Exact distributions of the centred noise e = z - E[z].
NOISE_DIST = {
    "student-t": stats.t(df=2),
    "laplace": stats.laplace(loc=0.0, scale=1.0),
    "chi2": stats.chi2(df=1, loc=-1.0),
}


def stacked(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """All records, train then test."""
    return np.vstack([ds.X_train, ds.X_test]), np.concatenate([ds.y_train, ds.y_test])


@pytest.fixture(scope="module")
def residuals() -> dict[str, np.ndarray]:
    """y - <x*, xi> of the ridge data set of each noise, all N records."""
    out = {}
    for noise in NOISES:
        ds, x_star = heavy_tailed(noise, "regression", n=N, seed=SEED)
        X, y = stacked(ds)
        out[noise] = y - X @ x_star
    return out


def test_names_shapes_dtypes_and_tasks():
    for noise in NOISES:
        ridge, x_star = heavy_tailed(noise, "regression")
        logistic, _ = heavy_tailed(noise, "binary")
        assert (ridge.name, ridge.task) == (f"synthetic-{noise}-ridge", "regression")
        assert (logistic.name, logistic.task) == (f"synthetic-{noise}-logistic", "binary")
        for ds in (ridge, logistic):  # paper: 100,000 records in R^10; 20% held out by default
            assert ds.X_train.shape == (80_000, 10) and ds.y_train.shape == (80_000,)
            assert ds.X_test.shape == (20_000, 10) and ds.y_test.shape == (20_000,)
            assert ds.X_train.dtype == ds.y_train.dtype == ds.X_test.dtype == np.float64
            assert f"noise={noise}" in ds.source and "seed=0" in ds.source
        assert x_star.shape == (10,) and x_star.dtype == np.float64
        assert set(np.unique(stacked(logistic)[1])) == {-1.0, 1.0}
        assert np.isfinite(stacked(ridge)[1]).all()


def test_same_seed_is_bit_identical_and_other_seeds_differ():
    for noise in NOISES:
        for task in ("regression", "binary"):
            (a, xa), (b, xb) = (heavy_tailed(noise, task, n=1000, dim=5, seed=7) for _ in range(2))
            assert np.array_equal(xa, xb)
            for field in ("X_train", "y_train", "X_test", "y_test"):
                assert np.array_equal(getattr(a, field), getattr(b, field))
            c, xc = heavy_tailed(noise, task, n=1000, dim=5, seed=8)
            assert not np.any(xa == xc)
            assert not np.any(a.X_train == c.X_train)
            assert np.mean(a.y_train == c.y_train) < (0.8 if task == "binary" else 1e-3)


def test_split_is_first_and_last_records_of_one_draw():
    whole, x_star = heavy_tailed("laplace", "regression", n=1000, seed=3, test_fraction=0.0)
    assert whole.X_test.shape == (0, 10) and whole.y_test.shape == (0,)
    split, x_split = heavy_tailed("laplace", "regression", n=1000, seed=3, test_fraction=0.25)
    assert (split.n, len(split.y_test)) == (750, 250)
    assert np.array_equal(x_star, x_split)
    assert np.array_equal(np.vstack([split.X_train, split.X_test]), whole.X_train)
    assert np.array_equal(np.concatenate([split.y_train, split.y_test]), whole.y_train)
    # round(test_fraction * n): round(0.333 * 10) = 3 test records; n = 2 keeps one for training.
    assert len(heavy_tailed("chi2", "binary", n=10, test_fraction=0.333)[0].y_test) == 3
    tiny, _ = heavy_tailed("chi2", "binary", n=2, dim=1, test_fraction=0.5)
    assert (tiny.n, len(tiny.y_test)) == (1, 1)


def test_features_and_true_parameter_distributions():
    ds, x_star = heavy_tailed("laplace", "regression", n=N, seed=SEED)
    X = stacked(ds)[0].ravel()  # 10^6 i.i.d. N(0, 1) entries
    assert abs(X.mean()) < 5 / math.sqrt(X.size)
    assert abs(X.var() - 1) < 5 * math.sqrt(2 / X.size)
    assert stats.kstest(X[:100_000], "norm").pvalue > 0.01
    # x* ~ N(0, I_d)/sqrt(d): ||x*||^2 ~ chi2_d / d, mean 1, sd sqrt(2/d).
    dim = 10_000
    _, big = heavy_tailed("chi2", "regression", n=2, dim=dim, seed=SEED)
    assert abs(big @ big - 1) < 5 * math.sqrt(2 / dim)
    assert stats.kstest(big * math.sqrt(dim), "norm").pvalue > 0.01
    # Drawn from the same generator, before the noise: the same x* and X for every noise and task.
    for noise in NOISES:
        other, x_other = heavy_tailed(noise, "binary", n=N, seed=SEED)
        assert np.array_equal(x_other, x_star) and np.array_equal(other.X_test, ds.X_test)


@pytest.mark.parametrize("noise", ["laplace", "chi2"])
def test_finite_variance_noise_is_centred(residuals, noise):
    e = residuals[noise]
    sd = math.sqrt(2)  # Laplace(0, b=1): 2 b^2 = 2; chi2(1): 2 k = 2
    assert NOISE_DIST[noise].std() == pytest.approx(sd)
    assert abs(e.mean()) < 5 * sd / math.sqrt(N)
    # Sample sd: s.e. sqrt((mu4 - sd^4) / n) / (2 sd) (delta method), mu4 = (excess kurtosis + 3) sd^4:
    # Laplace mu4 = 24, chi2(1) mu4 = 60. Catches a Laplace "sigma = 1" read as the sd (b = 1/sqrt 2).
    mu4 = (float(NOISE_DIST[noise].stats(moments="k")) + 3) * sd**4
    assert abs(e.std() - sd) < 5 * math.sqrt((mu4 - sd**4) / N) / (2 * sd)


def test_laplace_residual_is_laplace_0_1_not_gaussian(residuals):
    e = residuals["laplace"]
    assert stats.kstest(e, "laplace", args=(0.0, 1.0)).pvalue > 0.01
    assert stats.kstest(e, "norm", args=(0.0, math.sqrt(2))).pvalue < 1e-6  # same variance
    assert abs(np.median(e)) < 5 * 1 / (2 * 0.5 * math.sqrt(N))  # density at the median 1/(2b)


def test_chi2_residual_is_shifted_chi2_1(residuals):
    e = residuals["chi2"]
    assert e.min() >= -1 - 1e-9  # z >= 0
    assert stats.kstest(e, NOISE_DIST["chi2"].cdf).pvalue > 0.01
    # Skewed: the median of chi2(1) is 0.4549, so that of e is -0.5451, far below the mean 0.
    median = NOISE_DIST["chi2"].median()
    se = 1 / (2 * NOISE_DIST["chi2"].pdf(median) * math.sqrt(N))
    assert abs(np.median(e) - median) < 5 * se


def test_student_t_residual_is_centred_and_heavy_tailed(residuals):
    e = residuals["student-t"]
    # Infinite variance: test the median. f(0) of t_2 is 1/(2 sqrt 2); s.e. = 1/(2 f(0) sqrt n).
    f0 = 1 / (2 * math.sqrt(2))
    assert f0 == pytest.approx(NOISE_DIST["student-t"].pdf(0.0))
    assert abs(np.median(e)) < 5 / (2 * f0 * math.sqrt(N))
    # Tails: P(|T_2| > 10) = 1 - 10/sqrt(102) exactly (about 0.98%, vs 0 for any light tail).
    p = 1 - 10 / math.sqrt(102)
    assert p == pytest.approx(2 * NOISE_DIST["student-t"].sf(10.0))
    assert abs(np.mean(np.abs(e) > 10) - p) < 5 * math.sqrt(p * (1 - p) / N)
    assert stats.kstest(e, NOISE_DIST["student-t"].cdf).pvalue > 0.01


@pytest.mark.parametrize("noise", NOISES)
def test_logistic_labels_threshold_the_ridge_responses_at_ln2(noise):
    ridge, x_ridge = heavy_tailed(noise, "regression", n=N, seed=SEED)
    logistic, x_logistic = heavy_tailed(noise, "binary", n=N, seed=SEED)
    X, u = stacked(ridge)
    assert np.array_equal(x_ridge, x_logistic) and np.array_equal(stacked(logistic)[0], X)
    # y = sign(1/exp(u) - 1/2) = +1 iff u < ln 2, with u = <x*, xi> + e (the ridge response).
    expected = np.where(1 / np.exp(np.clip(u, -700, 700)) - 0.5 > 0, 1.0, -1.0)
    assert np.array_equal(stacked(logistic)[1], expected)


@pytest.mark.parametrize("noise", NOISES)
def test_logistic_label_frequency_matches_the_model(noise):
    """Independent of the ridge data set: given x*, the labels are i.i.d. with
    P(y = +1) = P(s G + e < ln 2) = E[Phi((ln 2 - e)/s)], G ~ N(0, 1), s = ||x*||."""
    logistic, x_star = heavy_tailed(noise, "binary", n=N, seed=SEED)
    y = stacked(logistic)[1]
    s, dist = float(np.linalg.norm(x_star)), NOISE_DIST[noise]
    low, high = dist.support()

    def integrand(e: float) -> float:
        return stats.norm.cdf((math.log(2) - e) / s) * dist.pdf(e)

    # Split at 0: the Laplace density has its kink there.
    p = integrate.quad(integrand, low, 0.0)[0] + integrate.quad(integrand, 0.0, high)[0]
    assert 0.6 < p < 0.85  # far from 1/2 and from 1 - p: a flipped sign or threshold 0 fails
    assert abs(np.mean(y == 1.0) - p) < 5 * math.sqrt(p * (1 - p) / N)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"noise": "cauchy"}, r"^noise='cauchy' must be one of: student-t, laplace, chi2$"),
    ({"task": "ridge"}, r"^task='ridge' must be one of: regression, binary$"),
    ({"task": "multiclass"}, r"^task='multiclass' must be one of: regression, binary$"),
    ({"n": 1}, r"^n=1 must be an integer >= 2$"),
    ({"n": 100.0}, r"^n=100.0 must be an integer >= 2$"),
    ({"dim": 0}, r"^dim=0 must be >= 1$"),
    ({"seed": -1}, r"^seed=-1 must be an integer >= 0$"),
    ({"test_fraction": 1.0}, r"^test_fraction=1.0 must be a number in \[0, 1\)$"),
    ({"test_fraction": -0.1}, r"^test_fraction=-0.1 must be a number in \[0, 1\)$"),
    ({"test_fraction": float("nan")}, r"^test_fraction=nan must be a number in \[0, 1\)$"),
    ({"n": 2, "test_fraction": 0.9}, r"^test_fraction=0.9 must leave at least one training record "
                                     r"out of n=2"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    args = {"noise": "laplace", "task": "regression", "n": 100} | kwargs
    with pytest.raises(DpoptError, match=message):
        heavy_tailed(args.pop("noise"), args.pop("task"), **args)
