"""A preset's declared data, read from its file ``presets/<name>.toml`` and checked.

The file holds everything about a reproduction that is a choice or a published number rather than
code: the ε list and δ, the problems, seeds, metrics and comparisons, the paper's table, each
method's grid and settings, the values the last tuning chose (with its date, command and cost),
preset-specific values (``[parameters]``, read by the preset's code through
:meth:`Declared.parameter`), and the report's static text in Markdown: ``notes``; ``problem_note``,
a line filled from each problem's facts; ``quick_note``, added under ``--quick``; ``figure_note``, a
line added to every figure's title (e.g. how the hyper-parameters were chosen); and per baseline
an explanation of the comparisons it wins. A file with ``extends = "<other preset>"`` is a
variant: the other file's values, its own replacing them key by key (a table is replaced whole).
A key the schema does not know, a missing key or a value of the wrong type is an error that names
the file and the key.

Tuned values are records ``{problem, method, epsilon, params}``: ``problem`` is omitted when the
values hold for every problem (or the preset has one unnamed problem); ``epsilon`` is omitted when
they are used at every ε (or for a non-private method). :meth:`Declared.tuned` turns them into
``problem → method → {ε or None: params}``, the form a :class:`~dpopt.experiments._runner.Method`
reads.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._validate import DpoptError
from ..json_types import JsonObject, JsonValue

#: A method's ``settings`` table, read by its builder.
Settings = Mapping[str, JsonValue]
#: A row of the paper's table (:meth:`Declared.paper`): keys and metrics, a [mean, std] pair as a tuple.
PaperEntry = dict[str, JsonValue | tuple[JsonValue, ...]]

#: Where the preset files are (packaged with dpopt: see pyproject.toml).
FOLDER = Path(__file__).with_name("presets")

_NUMBER = (int, float)
#: Top-level keys: key → (type, required).
SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "name": (str, True), "epsilons": (list, True), "delta": (_NUMBER + (dict,), True), "seeds": (int, True),
    "log_points": (int, True), "tuning_seeds": (list, True), "metrics": (list, True), "table_metrics": (list, True),
    "paper_metrics": (list, True), "test_metrics": (list, True), "verdict_metrics": (list, True),
    "comparisons": (list, True),
    "curves": (dict, True), "paper": (list, True), "methods": (dict, True), "tuned": (list, True),
    "tuning": (dict, False), "notes": (str, True), "explanations": (dict, True), "parameters": (dict, True),
    "problems": (list, False), "smoke_problems": (list, False), "tune_epsilon": (_NUMBER, False),
    "epochs": (int, False), "extends": (str, False), "problem_note": (str, False), "quick_note": (str, False),
    "figure_note": (str, False),
}
#: Keys of a ``[methods.<name>]`` table.
METHOD_SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "grid": (dict, True), "private": (bool, False), "deterministic": (bool, False), "noise_scale": (_NUMBER, False),
    "settings": (dict, False), "tuner": (str, False)}
#: The tuners a method can name (:data:`dpopt.experiments.preset.TUNERS`).
TUNER_NAMES = ("grid", "patience")
#: Keys of a record of ``tuned``.
TUNED_SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "method": (str, True), "params": (dict, True), "problem": (str, False), "epsilon": (_NUMBER, False)}
#: Keys of the ``[tuning]`` table: how the tuned values were chosen and what that cost.
TUNING_SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "date": (str, True), "command": (str, True), "cost": (dict, True)}


@dataclass(frozen=True)
class Declared:
    """A preset file's content, checked (``file``: where it was read)."""

    file: Path
    values: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def parameter(self, key: str) -> Any:
        """A preset-specific value of ``[parameters]``; an error naming the file if it is missing."""
        if key not in self.values["parameters"]:
            raise DpoptError(f"{self.file}: parameters.{key} is missing")
        return self.values["parameters"][key]

    def private(self, method: str) -> bool:
        return self.values["methods"][method].get("private", True)

    def tuned(self) -> dict[str | None, dict[str, dict[float | None, JsonObject]]]:
        """problem (None: the unnamed one) → method → {ε: values} (ε None: a non-private method's one
        setting). A record without ``problem`` holds for every problem, one without ``epsilon`` at every
        ε; a more specific record wins."""
        keys = self.values.get("problems", [None]) + self.values.get("smoke_problems", [])
        found: dict[str | None, dict[str, dict[float | None, JsonObject]]] = {key: {} for key in keys}
        for record in sorted(self.values["tuned"], key=lambda r: ("problem" in r, "epsilon" in r)):
            for key in [record["problem"]] if "problem" in record else keys:
                by_eps = found.setdefault(key, {}).setdefault(record["method"], {})
                if "epsilon" in record:
                    by_eps[float(record["epsilon"])] = record["params"]
                elif self.private(record["method"]):
                    by_eps.update(dict.fromkeys(self.epsilons, record["params"]))
                else:
                    by_eps[None] = record["params"]
        return {key: methods for key, methods in found.items() if methods}

    def paper(self) -> list[PaperEntry]:
        """The paper's rows: a [mean, std] pair as a tuple, an omitted ε as None (non-private)."""
        return [{"epsilon": None} | {k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}
                for row in self.values["paper"]]

    @property
    def epsilons(self) -> tuple[float, ...]:
        return tuple(float(eps) for eps in self.values["epsilons"])


def number(value: JsonValue, name: str) -> float:
    """``value`` of the declared key ``name``, which must be a number (returned as declared)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DpoptError(f"{name}={value!r} must be a number")
    return value


def text(value: JsonValue, name: str) -> str:
    """``value`` of the declared key ``name``, which must be a string."""
    if not isinstance(value, str):
        raise DpoptError(f"{name}={value!r} must be a string")
    return value


def load(name: str, folder: Path = FOLDER) -> Declared:
    """The checked content of ``folder/<name>.toml``."""
    path = folder / f"{name}.toml"
    values: dict[str, Any] = _read(path)  # checked against SCHEMA below
    if "extends" in values:  # a variant: the base file's values, its own replacing them key by key
        base: dict[str, Any] = _read(folder / f"{values['extends']}.toml")
        values = base | values
        del values["extends"]
    _check(path, "", values, SCHEMA)
    for method, table in values["methods"].items():
        _check(path, f"methods.{method}.", table, METHOD_SCHEMA)
    for method, table in values["methods"].items():
        if table.get("noise_scale", 1.0) != 1.0 and "NOT PRIVATE" not in method:
            raise DpoptError(f"{path}: methods.{method}.noise_scale={table['noise_scale']!r}: a noise scale other "
                             "than 1 is allowed only for a method whose name says NOT PRIVATE")
        if table.get("tuner", "grid") not in TUNER_NAMES:
            raise DpoptError(f"{path}: methods.{method}.tuner={table['tuner']!r} must be one of: "
                             + ", ".join(TUNER_NAMES))
    for i, record in enumerate(values["tuned"]):
        _check(path, f"tuned[{i}].", record, TUNED_SCHEMA)
        if record["method"] not in values["methods"]:
            raise DpoptError(f"{path}: tuned[{i}].method={record['method']!r} is not one of the methods "
                             f"({', '.join(values['methods'])})")
    if "tuning" in values:  # a preset whose values were all set by hand has none
        _check(path, "tuning.", values["tuning"], TUNING_SCHEMA)
    names = set(values["methods"])
    for i, pair in enumerate(values["comparisons"]):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise DpoptError(f"{path}: comparisons[{i}] must be a pair [ours, baseline]")
    if not set(values["verdict_metrics"]) <= set(values["test_metrics"]):
        raise DpoptError(f"{path}: verdict_metrics={values['verdict_metrics']!r} must be among test_metrics")
    for baseline in values["explanations"]:
        if baseline not in names:
            raise DpoptError(f"{path}: explanations.{baseline} names no method ({', '.join(sorted(names))})")
    if values["name"] != name:
        raise DpoptError(f"{path}: name={values['name']!r} must be the file's name {name!r}")
    return Declared(path, values)


def _read(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DpoptError(f"{path}: not a readable preset file ({err})") from None


def _check(path: Path, prefix: str, table: Mapping[str, object],
           schema: dict[str, tuple[type | tuple[type, ...], bool]]) -> None:
    for key in table:
        if key not in schema:
            raise DpoptError(f"{path}: {prefix}{key} is not a known key (known: {', '.join(schema)})")
    for key, (kind, required) in schema.items():
        if key not in table:
            if required:
                raise DpoptError(f"{path}: {prefix}{key} is missing")
        elif not isinstance(table[key], kind) or (kind is _NUMBER and isinstance(table[key], bool)):
            raise DpoptError(f"{path}: {prefix}{key}={table[key]!r} has the wrong type")
