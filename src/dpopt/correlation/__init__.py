"""Correlated noise (matrix factorisation): the release adds x = C⁻¹z to the gradient sums instead
of independent noise, for a strategy C chosen so that the noise the training loop accumulates
(θ_t sees Σ_{s≤t} x_s) is small.

* :mod:`~dpopt.correlation.strategy`: b-banded Toeplitz strategies, their error on a workload
  (prefix sums, SGD with momentum) and their optimisation (numpy/scipy, no torch);
* :mod:`~dpopt.correlation.blt`: buffered linear Toeplitz strategies (not banded, a few buffers);
* :mod:`~dpopt.correlation.events`: the planned events (no torch: the accounting commands use them);
* :mod:`~dpopt.correlation.noise`: the releases, with the noise generated online from a state the
  algorithm keeps (torch).

The sampler that goes with a banded strategy is :class:`dpopt.sampling.CyclicPoisson`.
Submodules are imported by name (this package imports none of them, so the torch-free ones stay
torch-free).
"""
