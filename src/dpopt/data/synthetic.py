r"""Heavy-tailed synthetic data of the AClip paper (Jin et al., "Efficient Private SCO for
Heavy-Tailed Data via Averaged Clipping", Sec. 5 and App. B).

Each record is a feature vector :math:`\xi_i \in \mathbb{R}^d` and a response built from a fixed
true parameter :math:`x^*` and a centred heavy-tailed noise :math:`e_i = z_i - \mathbb{E}[z_i]`:

* ridge (``task="regression"``): :math:`y_i = \langle x^*, \xi_i\rangle + e_i`;
* logistic (``task="binary"``): :math:`y_i = \operatorname{sign}(1/\exp(u_i) - 1/2) \in \{-1, +1\}`
  with :math:`u_i = \langle x^*, \xi_i\rangle + e_i`, i.e. :math:`y_i = +1 \iff u_i < \ln 2`.

The noise :math:`z_i` is one of (paper, App. B):

* ``"student-t"``: Student's t with 2 degrees of freedom (mean 0, so :math:`e_i = z_i`; infinite
  variance; density at 0 is :math:`1/(2\sqrt 2)`, :math:`P(|e_i| > t) = 1 - t/\sqrt{2 + t^2}`);
* ``"laplace"``: Laplace with location :math:`\mu = 1` and **scale** :math:`b = 1` (the paper's
  "σ = 1" read as the scale), so :math:`e_i = z_i - 1 \sim \mathrm{Laplace}(0, 1)`, variance 2;
* ``"chi2"``: :math:`\chi^2` with 1 degree of freedom, :math:`e_i = z_i - 1` (variance 2,
  :math:`e_i \ge -1`, heavy right tail).

The paper does not say how :math:`\xi_i` and :math:`x^*` are drawn. **Our choice**:
:math:`\xi_i \sim \mathcal N(0, I_d)` i.i.d. and :math:`x^* \sim \mathcal N(0, I_d)/\sqrt d`
(so :math:`\|x^*\|_2^2 \sim \chi^2_d / d`, about 1), drawn once per data set.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from dpopt._validate import DpoptError, one_of, positive_int
from dpopt.data.dataset import Dataset

__all__ = ["NOISES", "SYNTHETIC_TASKS", "heavy_tailed"]

NOISES = ("student-t", "laplace", "chi2")
SYNTHETIC_TASKS = ("regression", "binary")
_MODEL = {"regression": "ridge", "binary": "logistic"}


def heavy_tailed(noise: str, task: str, *, n: int = 100_000, dim: int = 10, seed: int = 0,
                 test_fraction: float = 0.2) -> tuple[Dataset, np.ndarray]:
    r"""The AClip paper's heavy-tailed synthetic data set and its true parameter :math:`x^*`.

    Draws, in this order and all from one ``numpy.random.default_rng(seed)``:

    1. :math:`x^* = g / \sqrt{d}` with :math:`g \sim \mathcal N(0, I_d)` (our choice);
    2. the features :math:`\xi_1, \dots, \xi_n \sim \mathcal N(0, I_d)` i.i.d., rows of ``X`` (our choice);
    3. the noise :math:`z_1, \dots, z_n` i.i.d. from ``noise`` and :math:`e_i = z_i - \mathbb E[z_i]`:
       Student's :math:`t_2` (mean 0), Laplace(:math:`\mu = 1`, scale :math:`b = 1`) minus 1,
       or :math:`\chi^2_1` minus 1.

    Then :math:`u_i = \langle x^*, \xi_i\rangle + e_i` and

    * ``task="regression"`` (ridge): :math:`y_i = u_i`;
    * ``task="binary"`` (logistic): :math:`y_i = \operatorname{sign}(1/\exp(u_i) - 1/2)`, i.e.
      :math:`+1` if :math:`u_i < \ln 2` and :math:`-1` otherwise (computed as that comparison,
      which cannot overflow; the tie :math:`u_i = \ln 2` has probability 0 and gives :math:`-1`).
      The paper prints :math:`y_i = 2\operatorname{sign}[1/\exp(u_i) - 1/2] - 1`, which literally
      takes the values :math:`\{1, -3\}`; we read it as a typo for the plain sign. Note that
      :math:`x^*` is then *not* the minimiser of the logistic loss (labels are +1 for small
      :math:`\langle x^*, \xi\rangle`, and there is no intercept for the threshold :math:`\ln 2`).

    The draws do not depend on ``task``: with the same ``noise``, ``n``, ``dim`` and ``seed``
    both tasks share ``X`` and :math:`x^*`, and the logistic labels are the ridge responses
    thresholded at :math:`\ln 2`. Same arguments give bit-identical arrays.

    Args:
        noise: one of :data:`NOISES`: ``"student-t"``, ``"laplace"``, ``"chi2"``.
        task: ``"regression"`` (ridge responses) or ``"binary"`` (logistic labels -1.0/+1.0).
        n: number of records in total (train + test), an integer >= 2 (paper: 100,000).
        dim: number of features d, an integer >= 1 (paper: 10).
        seed: seed of the generator, an integer >= 0.
        test_fraction: in [0, 1); the last ``round(test_fraction * n)`` records (Python
            ``round``) are the test split, the first ones the training split (the AClip
            experiments train on the training split). At least one training record must remain.

    Returns:
        ``(dataset, x_star)``: a :class:`~dpopt.data.Dataset` named
        ``"synthetic-<noise>-ridge"`` or ``"synthetic-<noise>-logistic"`` with task
        ``"regression"`` or ``"binary"``, and :math:`x^*` as float64 of shape ``[dim]``.

    Raises:
        DpoptError: an argument is invalid; the message names it and the allowed values.
    """
    one_of("noise", noise, NOISES)
    one_of("task", task, SYNTHETIC_TASKS)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise DpoptError(f"n={n!r} must be an integer >= 2")
    positive_int("dim", dim)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DpoptError(f"seed={seed!r} must be an integer >= 0")
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real)
            or not 0 <= test_fraction < 1):
        raise DpoptError(f"test_fraction={test_fraction!r} must be a number in [0, 1)")
    n, dim = int(n), int(dim)
    n_test = round(float(test_fraction) * n)
    if n_test >= n:
        raise DpoptError(f"test_fraction={test_fraction!r} must leave at least one training "
                         f"record out of n={n} (round(test_fraction * n) = {n_test})")

    x_star, X, e = _draw(noise, n, dim, np.random.default_rng(seed))
    u = X @ x_star + e
    y = u if task == "regression" else np.where(u < math.log(2.0), 1.0, -1.0)

    n_train = n - n_test
    name = f"synthetic-{noise}-{_MODEL[task]}"
    source = (f"heavy-tailed synthetic data of the AClip paper: noise={noise}, n={n}, dim={dim}, "
              f"seed={seed}, test_fraction={test_fraction} (features N(0, I), x* ~ N(0, I)/sqrt(dim))")
    dataset = Dataset(name, task, X[:n_train], y[:n_train], X[n_train:], y[n_train:], source)
    return dataset, x_star


def _draw(noise: str, n: int, dim: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""``(x_star [dim], X [n, dim], e [n])`` drawn from ``rng`` in that order; ``e`` is centred."""
    x_star = rng.standard_normal(dim) / math.sqrt(dim)
    X = rng.standard_normal((n, dim))
    if noise == "student-t":
        e = rng.standard_t(2.0, n)  # E[z] = 0
    elif noise == "laplace":
        e = rng.laplace(1.0, 1.0, n) - 1.0  # E[z] = mu = 1
    else:
        e = rng.chisquare(1.0, n) - 1.0  # E[z] = degrees of freedom = 1
    return x_star, X, e
