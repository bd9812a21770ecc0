"""``torch.optim`` optimizers that read what they need from a :class:`dpopt.Private` run.

    private = dpopt.Private(model, loss_fn, data, algorithm="dp-sgd", epsilon=3.0, delta=1e-5, epochs=5)
    optimizer = dpopt.optim.AdamBC(model.parameters(), private, lr=1e-3)
    for _ in private:
        private.backward()      # .grad = g̃_t
        optimizer.step()        # Adam, its second moment less the noise variance of g̃_t

Whatever they do with the released g̃_t and the public noise variance is post-processing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.optim.optimizer import ParamsT

from . import _validate
from .algorithms.adam import bias_corrected_step, check

if TYPE_CHECKING:
    from .private import Private


class AdamBC(torch.optim.Optimizer):
    """DP-AdamBC (Tang et al., AAAI 2024, arXiv 2312.14334; :mod:`dpopt.algorithms.adam` states the
    update) on ``params``: Adam whose second moment is corrected by Φ_t, the variance per coordinate of
    the noise in the private gradient that ``private.backward()`` wrote into ``.grad``
    (:meth:`dpopt.Private.noise_variance`: no arithmetic of the user's). Call ``step()`` once after
    each ``private.backward()``. ``lr``, ``betas``, ``eps`` (0: the paper's update) and ``gamma``
    (the floor of the corrected second moment) as in :class:`dpopt.algorithms.adam.AdamBC`.

    ``step(closure)`` is refused: torch's closure recomputes the loss and calls ``loss.backward()``,
    which writes the exact, un-noised gradient of the training data into ``.grad`` in place of
    g̃_t; a step on it would be no release that ``private.epsilon()`` accounts for."""

    def __init__(self, params: ParamsT, private: Private, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 0.0, gamma: float = 1e-8) -> None:
        check(lr, betas, eps, gamma)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "gamma": gamma})
        self.private = private

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One DP-AdamBC update on the g̃_t that ``private.backward()`` wrote into ``.grad``."""
        if closure is not None:
            raise _validate.DpoptError(
                f"closure={getattr(closure, '__name__', type(closure).__name__)}: dpopt.optim.AdamBC.step takes no "
                "closure (it would write the exact, un-noised gradient into .grad, which no epsilon covers): call "
                "private.backward(), then optimizer.step()")
        variance = self.private.noise_variance()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(step=0, m=torch.zeros_like(param), v=torch.zeros_like(param), noise=0.0)
                state["step"] += 1
                state["noise"] = bias_corrected_step(
                    param, param.grad, state["m"], state["v"], step=state["step"], noise=state["noise"],
                    variance=variance, lr=group["lr"], betas=group["betas"], eps=group["eps"], gamma=group["gamma"])
