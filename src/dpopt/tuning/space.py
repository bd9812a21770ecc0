"""Where the candidates of a private tuning come from: each trial draws its own, independently.

The repeat-and-select bound (:mod:`dpopt.tuning.trials`) needs every trial to be the same
randomised procedure, so a grid is not walked in order: every trial draws one of its points
uniformly at random (a random grid search), and a random search draws each hyper-parameter from
its own distribution. The draws come from the tuning's secret generator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import numpy as np

from .. import _validate

#: A hyper-parameter's value: a number, a name (e.g. an update rule), or None (off).
Value: TypeAlias = float | str | None


class Dimension(Protocol):
    """One hyper-parameter's distribution."""

    def draw(self, rng: np.random.Generator) -> Value: ...

    def reference(self) -> Value: ...


@dataclass(frozen=True)
class Choice:
    """One of ``values``, uniformly (a grid's axis)."""

    values: tuple[Value, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise _validate.DpoptError("values=() must hold at least one value")

    def draw(self, rng: np.random.Generator) -> Value:
        return self.values[int(rng.integers(len(self.values)))]

    def reference(self) -> Value:
        return self.values[0]


@dataclass(frozen=True)
class LogUniform:
    """exp(U) with U uniform on [ln ``low``, ln ``high``] (a random search over scales)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        _validate.positive("low", self.low)
        if not _validate.positive("high", self.high) >= self.low:
            raise _validate.DpoptError(f"high={self.high!r} must be >= low={self.low!r}")

    def draw(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def reference(self) -> float:
        return self.low


@dataclass(frozen=True)
class Space:
    """Independent ``dimensions`` by hyper-parameter name; :meth:`grid` builds a grid of values."""

    dimensions: Mapping[str, Dimension]

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise _validate.DpoptError("space must name at least one hyper-parameter")

    @classmethod
    def grid(cls, **values: Sequence[Value]) -> Space:
        """Every trial draws one point of the product of ``values`` uniformly at random."""
        return cls({name: Choice(tuple(axis)) for name, axis in values.items()})

    def draw(self, rng: np.random.Generator) -> dict[str, Value]:
        return {name: dimension.draw(rng) for name, dimension in self.dimensions.items()}

    def reference(self) -> dict[str, Value]:
        """A fixed point (the first value, or the low end): what the noise is calibrated on."""
        return {name: dimension.reference() for name, dimension in self.dimensions.items()}
