"""The types of the JSON values dpopt reads and writes (results, ledgers, presets, requests).

``JsonValue`` is exactly what :func:`json.loads` can return; a function that takes JSON it only
reads should accept ``Mapping[str, object]`` (dicts are invariant, so a ``dict[str, float]`` is not
a ``JsonObject``), and one that builds JSON returns ``JsonObject``."""

from __future__ import annotations

from typing import TypeAlias, Union

JsonValue: TypeAlias = Union[str, int, float, bool, None, list["JsonValue"], dict[str, "JsonValue"]]
JsonObject: TypeAlias = dict[str, JsonValue]
