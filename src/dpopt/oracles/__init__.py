"""Oracles: what is measured on the data (per-record gradients, losses); no privacy here."""

from .glm import GLM, LeastSquares, Logistic, NonconvexLogistic, Ridge, TruncatedAbsolute, make
from .ghost import KNOWN_LAYERS, Registry
from .torch_model import ENGINES, TorchModel, reject_batch_norm

__all__ = ["ENGINES", "GLM", "KNOWN_LAYERS", "Registry", "LeastSquares", "Logistic", "NonconvexLogistic", "Ridge",
           "TorchModel",
           "TruncatedAbsolute", "make", "reject_batch_norm"]
