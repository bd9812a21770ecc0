"""Oracles: what is measured on the data (per-record gradients, losses); no privacy here."""

from .glm import GLM, LeastSquares, Logistic, NonconvexLogistic, Oracle, Ridge, make

__all__ = ["GLM", "LeastSquares", "Logistic", "NonconvexLogistic", "Oracle", "Ridge", "make"]
