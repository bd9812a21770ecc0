"""Every algorithm by name: the registry the command line, ``Private``, ``fit``, ``tune``,
``audit`` and ``bench`` build from.

An :class:`Entry` names the function that builds the algorithm from its parameters
(``"module:function"``, imported on first use, so that this module and ``dpopt --help`` import
neither torch nor dp_accounting), the frozen dataclass of those parameters (:mod:`.params`: each
field's help, type and range, from which the command line's flags, their checks and the tuning's
grid names are generated) and says what the algorithm is: private or not, federated or not. Noise
multipliers are left at 1 for :meth:`dpopt.plan.Plan.calibrated` to scale.

A :class:`Registry` is an immutable value: :meth:`Registry.register` returns a new one.
:data:`REGISTRY` is the one in use (the shipped :data:`ENTRIES`, and those :func:`register`
added); the names, the private and the federated algorithms are computed from it when asked.

Adding an algorithm: write its file under ``dpopt/algorithms/`` with its parameters (a subclass of
:class:`~.params.Params` whose new fields are declared with :func:`~.params.knob`) and a
``from_params(params)`` function, and add one :class:`Entry` line to :data:`ENTRIES`
(``tests/contracts/test_algorithms.py`` then asks for its contract row). The command line (its new
flags included), ``Private``, ``fit``, ``tune`` and ``audit`` then offer it by name;
``tests/test_adding_an_algorithm.py`` does exactly this for a toy algorithm with a hyper-parameter
of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .. import _validate
from ..names import NOISES
from .params import (OPTIMIZERS, SAMPLINGS, AClipParams, DIFF2Params, DPAGDParams, DPSGDParams, DPSRMParams,
                     DPSURParams, O2NCParams, Params, StormParams)

if TYPE_CHECKING:
    from ..base import Algorithm

__all__ = ["ENTRIES", "OPTIMIZERS", "REGISTRY", "SAMPLINGS", "Entry", "Knobs", "Params", "Registry", "build", "entry",
           "register"]

@dataclass(frozen=True)
class Knobs:
    """Hyper-parameters ``given`` by name for ``n`` records, before an algorithm is chosen (what
    ``Private``, ``fit``, :func:`build` and the command line collect): :meth:`Entry.build` keeps
    those of its algorithm's parameters and refuses ``bands`` > 1 or a ``clip_quantile`` that they
    cannot take, with the reason."""

    n: int
    given: Mapping[str, object]

    @classmethod
    def of(cls, n: int, **given: object) -> Knobs:
        """The knobs for ``n`` records with the hyper-parameters ``given`` by name (the others at their
        algorithm's defaults); a name no registered algorithm takes is refused with the list of known ones."""
        known = set(REGISTRY.declared())
        unknown = sorted(set(given) - known)
        if unknown:
            raise _validate.DpoptError(f"options {unknown} are not hyper-parameters of any algorithm; known: "
                                       f"{', '.join(sorted(known))}")
        return cls(n=n, given=types.MappingProxyType(dict(given)))


@dataclass(frozen=True)
class Entry:
    """An algorithm by name: ``builder`` (``"module:function"``, the function taking ``params``, an
    instance of the entry's parameter dataclass), a one-line ``summary``, whether it is ``private`` (a
    non-private reference has nothing to calibrate and cannot meet an ε), whether it is ``federated``
    (clients and a server: ``--backend torch`` runs it across processes), which ``noises`` it takes,
    and why it takes no ``bands`` > 1 (correlated noise) or no ``clip_quantile`` (adaptive clipping),
    said where its parameters have no such field."""

    name: str
    builder: str
    summary: str
    params: type[Params] = Params
    private: bool = True
    federated: bool = False
    noises: tuple[str, ...] = NOISES
    no_bands: str | None = "it releases no noised gradient sum at one noise multiplier and sensitivity per step"
    no_clip_quantile: str | None = "adaptive clipping is DP-SGD's (per-record clipping of one gradient sum)"

    def params_of(self, n: int, given: Mapping[str, object]) -> Params:
        """The entry's parameters for ``n`` records from the hyper-parameters ``given`` by name: those
        of its dataclass are kept, the others ignored, except ``bands`` > 1 and a ``clip_quantile``
        where the dataclass has no such field (refused with the reason)."""
        own = {field.name for field in dataclasses.fields(self.params)}
        params = self._checked(self.params(n, **cast(dict[str, Any], {k: v for k, v in given.items() if k in own})))
        bands, quantile = given.get("bands"), given.get("clip_quantile")
        if "bands" not in own and bands not in (None, 1):
            raise _validate.DpoptError(f"bands={bands!r} (correlated noise) is refused for algorithm={self.name!r}: "
                                       f"{self.no_bands or 'its parameters have no bands'}")
        if "clip_quantile" not in own and quantile is not None:
            raise _validate.DpoptError(f"clip_quantile={quantile!r} (adaptive clipping) is refused for algorithm="
                                       f"{self.name!r}: {self.no_clip_quantile or 'its parameters have no quantile'}")
        return params

    def _checked(self, params: Params) -> Params:
        """``params`` if they are the entry's and name a noise it takes and a known update rule."""
        if not isinstance(params, self.params):
            raise _validate.DpoptError(f"params={type(params).__name__} are not those of algorithm={self.name!r}: "
                                       f"give {self.params.__name__}")
        _validate.one_of("noise", params.noise, self.noises)
        _validate.one_of("optimizer", params.optimizer, OPTIMIZERS)
        return params

    def build(self, given: Knobs | Params) -> Algorithm[Any]:
        """The algorithm for ``given`` (its parameters, or knobs by name: :meth:`params_of`), its noise
        multipliers at 1, with the update rule ``optimizer``."""
        params = self.params_of(given.n, given.given) if isinstance(given, Knobs) else self._checked(given)
        algorithm = cast("Algorithm[Any]", _named(self.builder)(params))
        rule = OPTIMIZERS[params.optimizer]
        return algorithm if rule is None else cast("Algorithm[Any]", _named(rule)(algorithm, params))


def _named(builder: str) -> Callable[..., object]:
    """The function ``"module:function"`` names (its module imported now): a builder returns an
    algorithm (:meth:`Entry.build` says so to the type checker)."""
    module, function = builder.split(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Registry(Mapping[str, Entry]):
    """Algorithms by name, in the order of their ``entries``: an immutable mapping, which
    :meth:`register` extends into a new one."""

    entries: tuple[Entry, ...]

    def __post_init__(self) -> None:
        names = [entry.name for entry in self.entries]
        for name in names:
            if names.count(name) > 1:
                raise _validate.DpoptError(f"algorithm={name!r} is registered already")
        self.declared()  # one declaration per hyper-parameter name

    def __getitem__(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (entry.name for entry in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, name: str) -> Entry:
        """The entry for ``name`` (a one-line error listing the names otherwise)."""
        return self[_validate.one_of("algorithm", name, tuple(self))]

    def register(self, new: Entry) -> Registry:
        """A registry with ``new`` added under a name not yet taken (this one unchanged)."""
        return Registry((*self.entries, new))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self)

    @property
    def private(self) -> tuple[str, ...]:
        """The private algorithms (a target ε can be met)."""
        return tuple(entry.name for entry in self.entries if entry.private)

    @property
    def federated(self) -> tuple[str, ...]:
        """The federated algorithms (``--backend torch`` runs them across processes)."""
        return tuple(entry.name for entry in self.entries if entry.federated)

    def declared(self) -> dict[str, dataclasses.Field[object]]:
        """Every hyper-parameter field of the entries' parameters by name (``n`` aside), in the order
        they first appear; a name two dataclasses declare with another default or metadata is refused
        (it would be two flags of one name)."""
        found: dict[str, dataclasses.Field[object]] = {}
        for entry in self.entries:
            for field in dataclasses.fields(entry.params):
                if field.name == "n":
                    continue
                seen = found.setdefault(field.name, field)
                if seen is not field and (seen.default, seen.metadata) != (field.default, field.metadata):
                    raise _validate.DpoptError(f"hyper-parameter {field.name!r} of algorithm={entry.name!r} is "
                                               "declared differently by another algorithm: declare it once, in a "
                                               "base both parameter classes inherit")
        return found

    def flags(self, command: str) -> dict[str, dataclasses.Field[object]]:
        """The hyper-parameters ``command`` ("run", "tune", "audit") sets by flags."""
        return {name: field for name, field in self.declared().items()
                if command in field.metadata.get("commands", ())}

    def tunable(self) -> tuple[str, ...]:
        """The hyper-parameters a private tuning may vary across its trials."""
        return tuple(name for name, field in self.declared().items() if field.metadata.get("tunable"))


_CONTINUOUS = ("torch", "secure")
#: DP-SRM's two kinds of release (its refusal of correlated noise).
_TWO_RELEASES = ("its first step releases at (σ0, C1) and the others at (σ, γC1 + (1−γ)C2): correlated noise "
                 "needs one noise multiplier and one sensitivity at every step")
ENTRIES = (
    Entry("dp-sgd", "dpopt.algorithms.dp_sgd:dp_sgd_from_params", "DP-SGD: Poisson batches, per-record clipping",
          DPSGDParams),
    Entry("dp-bandmf", "dpopt.algorithms.dp_sgd:bandmf_from_params",
          "DP-SGD with banded correlated noise over cyclic Poisson batches", DPSGDParams, noises=_CONTINUOUS),
    Entry("dp-gd", "dpopt.algorithms.dp_sgd:dp_gd_from_params", "DP-GD: DP-SGD on the full data every step",
          no_bands="it uses every record at every step: there are no groups to cycle through",
          no_clip_quantile="adaptive clipping is accounted on sampled batches, and DP-GD's are the full data"),
    Entry("dp-srm", "dpopt.algorithms.dp_srm:from_params", "DP-SRM: private recursive momentum", DPSRMParams,
          no_bands=_TWO_RELEASES),
    Entry("rrpsgd", "dpopt.algorithms.dp_sgd:rrpsgd_from_params", "RRPSGD: DP-SGD output at a random round",
          DPSGDParams),
    Entry("dp-agd", "dpopt.algorithms.dp_agd:from_params", "DP-AGD: adaptive budget, noisy step-size choice",
          DPAGDParams),
    Entry("aclip", "dpopt.algorithms.aclip:from_params", "AClipped-dpSGD: clip the batch mean once", AClipParams),
    Entry("storm", "dpopt.algorithms.storm:from_params", "STORM: non-private recursive momentum (reference)",
          StormParams, private=False, noises=_CONTINUOUS),
    Entry("o2nc-zeroth", "dpopt.algorithms.o2nc:zeroth_from_params", "DP-O2NC, single pass, zeroth-order oracle",
          O2NCParams, noises=_CONTINUOUS),
    Entry("o2nc-first", "dpopt.algorithms.o2nc:first_from_params", "DP-O2NC, single pass, first-order oracle",
          O2NCParams, noises=_CONTINUOUS),
    Entry("o2nc-multi", "dpopt.algorithms.o2nc:multi_from_params", "DP-O2NC, every record every step",
          O2NCParams, noises=_CONTINUOUS),
    Entry("diff2-gd", "dpopt.algorithms.diff2:gd_from_params", "DIFF2-GD: private gradient differences, P clients",
          DIFF2Params, federated=True, noises=_CONTINUOUS),
    Entry("diff2-bvr", "dpopt.algorithms.diff2:bvr_from_params", "DIFF2-BVR-L-SGD: DIFF2 with local steps",
          DIFF2Params, federated=True, noises=_CONTINUOUS),
    Entry("dp-sur", "dpopt.algorithms.selective:from_params",
          "DPSUR: a DP-SGD step kept only if a noised validation test says it lowered the loss", DPSURParams,
          noises=_CONTINUOUS,
          no_bands="each step also releases a noised test on an independent batch, which correlated noise does not "
                   "account for"),
)
#: The registry in use: :data:`ENTRIES`, and those :func:`register` added.
REGISTRY = Registry(ENTRIES)


def __getattr__(name: str) -> tuple[str, ...]:
    """``NAMES``, ``PRIVATE`` and ``FEDERATED``: the names of every, of the private and of the
    federated algorithms of :data:`REGISTRY` as it is now (additions included)."""
    computed = {"NAMES": "names", "PRIVATE": "private", "FEDERATED": "federated"}
    if name not in computed:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cast(tuple[str, ...], getattr(REGISTRY, computed[name]))


def entry(name: str) -> Entry:
    """The entry for ``name`` in :data:`REGISTRY` (a one-line error listing the names otherwise)."""
    return REGISTRY.entry(name)


def register(new: Entry) -> Entry:
    """Make :data:`REGISTRY` the registry with ``new`` added under a name not yet taken
    (:meth:`Registry.register`): an algorithm defined outside :data:`ENTRIES` (a test's, a user's) is
    then built, run and audited by name like the others."""
    global REGISTRY
    REGISTRY = REGISTRY.register(new)
    return new


def build(name: str, *, n: int, **given: object) -> Algorithm[Any]:
    """Algorithm ``name`` for ``n`` records with the hyper-parameters ``given`` by name
    (:meth:`Knobs.of`), its noise multipliers at 1 for calibration."""
    return entry(name).build(Knobs.of(n, **given))
