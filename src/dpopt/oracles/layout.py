"""Where a module's trainable parameters live in one flat θ (docs/design.md rule 5), the call of
the module with them, and a description of a loss function for the checkpoints' settings."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from . import ghost


@dataclass(frozen=True)
class Layout:
    """Trainable parameter ``names[k]`` of shape ``shapes[k]`` is ``θ[starts[k] : starts[k] + numel]``."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    starts: tuple[int, ...]
    dim: int
    aliases: tuple[tuple[str, ...], ...]   # every name of each parameter (tied weights, reused modules)

    @classmethod
    def of(cls, module: nn.Module) -> Layout:
        """The trainable parameters of ``module``, in ``named_parameters()`` order."""
        params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        aliases = ghost.parameter_names(module)
        sizes = [p.numel() for p in params.values()]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return cls(tuple(params), tuple(p.shape for p in params.values()), tuple(starts), sum(sizes),
                   tuple(aliases[name] for name in params))

    def place(self, name: str) -> slice:
        k = self.names.index(name)
        return slice(self.starts[k], self.starts[k] + self.shapes[k].numel())

    def views(self, theta: Tensor) -> dict[str, Tensor]:
        """Name → view of θ, for every name of each parameter (pass to ``call``)."""
        return {alias: theta[start:start + shape.numel()].view(shape)
                for shape, start, aliases in zip(self.shapes, self.starts, self.aliases) for alias in aliases}


def callable_fingerprint(fn: Callable[..., object]) -> str:
    """A description of what ``fn`` computes: its qualified name with its code (bytecode, constants
    and names, recursively for ``functools.partial``), or the repr of a callable object without
    code (an ``nn.Module`` loss)."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_fingerprint(fn.func)}, {fn.args!r}, {sorted(fn.keywords.items())!r})"
    code = getattr(fn, "__code__", None)
    if code is None:
        return f"{type(fn).__qualname__}:{fn!r}"
    return f"{getattr(fn, '__qualname__', '')}:{code.co_code.hex()}:{code.co_consts!r}:{code.co_names!r}"


def call(module: nn.Module, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """``module(x)`` with ``params`` (every alias given, so no tying is needed)."""
    return functional_call(module, params, (x,), tie_weights=False)
