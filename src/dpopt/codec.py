"""Run state as JSON plus tensors: a format whose loading runs no code.

:func:`encode` turns a value into JSON-ready data and a table of tensors (by reference);
:func:`decode` rebuilds it. Allowed values: ``None``, ``bool``, ``int``, ``str``, ``float``
(``inf``, ``-inf`` and ``nan`` included), ``list``, ``tuple``, ``dict`` with ``str`` keys,
``torch.Tensor`` (a generator's state is a uint8 tensor), NamedTuples and dataclasses defined in
a ``dpopt`` module, and ``dp_accounting``'s events. Anything else is refused when saving.

Decoding only ever builds those: a class is looked up by name among the modules already
imported (``dpopt.*`` NamedTuples and dataclasses, ``dp_accounting.dp_event``'s event classes)
and called with its decoded fields; nothing is imported, unpickled or evaluated. The same
tensor object referenced twice is stored once and decoded as one object.

Encoding of a node (JSON): ``null``, ``true``/``false``, a number, a string, a JSON list (a
``list``), or a one-key object: ``{"float": "inf" | "-inf" | "nan"}``, ``{"tuple": [...]}``,
``{"dict": {...}}``, ``{"tensor": key}``, ``{"object": [module, name, {field: node}]}``,
``{"event": [name, {field: node}]}``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
from typing import Any

import attr
import dp_accounting.dp_event as dp_event
import torch
from torch import Tensor

from .json_types import JsonValue

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class CodecError(ValueError):
    """A value this format cannot hold, or an encoding it did not write."""


def encode(value: object) -> tuple[JsonValue, dict[str, Tensor]]:
    """``value`` as JSON-ready data and the tensors it references (contiguous CPU copies)."""
    tensors: dict[str, Tensor] = {}
    keys: dict[int, str] = {}

    def node(v: object) -> JsonValue:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, Tensor):
            if id(v) not in keys:
                keys[id(v)] = key = f"t{len(keys)}"
                tensors[key] = v.detach().cpu().clone(memory_format=torch.contiguous_format)
            return {"tensor": keys[id(v)]}
        if isinstance(v, dp_event.DpEvent):
            return {"event": [type(v).__name__, {f.name: node(getattr(v, f.name))
                                                 for f in attr.fields(type(v)) if f.init}]}
        if _is_dpopt_record(type(v)):
            return {"object": [type(v).__module__, type(v).__qualname__,
                               {name: node(field) for name, field in _fields(v).items()}]}
        if type(v) is tuple:
            return {"tuple": [node(item) for item in v]}
        if type(v) is list:
            return [node(item) for item in v]
        if type(v) is dict and all(isinstance(k, str) for k in v):
            return {"dict": {k: node(item) for k, item in v.items()}}
        raise CodecError(f"a checkpoint cannot hold a value of type {type(v).__module__}.{type(v).__qualname__}")

    return node(value), tensors


def decode(data: JsonValue, tensors: dict[str, Tensor]) -> Any:
    """The value :func:`encode` encoded as ``data`` with ``tensors``; :class:`CodecError` on
    anything it would not have written."""
    try:
        return _node(data, tensors)
    except TypeError as err:  # a constructor given fields it does not have
        raise CodecError(str(err)) from None


def _node(d: JsonValue, tensors: dict[str, Tensor]) -> Any:
    """One node of :func:`decode` (a function of the module, not a recursive closure: a closure that
    calls itself is a reference cycle, which would keep ``tensors`` alive until the garbage collector
    runs: gigabytes for cached features read one after another)."""
    if d is None or isinstance(d, (bool, int, float, str)):
        return d
    if isinstance(d, list):
        return [_node(item, tensors) for item in d]
    if not (isinstance(d, dict) and len(d) == 1):
        raise CodecError(f"unexpected node {str(d)[:80]}")
    (tag, body), = d.items()
    if tag == "float" and isinstance(body, str) and body in _NON_FINITE:
        return _NON_FINITE[body]
    if tag == "tuple" and isinstance(body, list):
        return tuple(_node(item, tensors) for item in body)
    if tag == "dict" and isinstance(body, dict):
        return {k: _node(item, tensors) for k, item in body.items()}
    if tag == "tensor" and isinstance(body, str) and body in tensors:
        return tensors[body]
    if tag == "event" and (parts := _shaped(body, 2)) is not None:
        (name,), fields = parts
        return _event_class(name)(**{k: _node(item, tensors) for k, item in fields.items()})
    if tag == "object" and (parts := _shaped(body, 3)) is not None:
        (module, name), fields = parts
        return _dpopt_class(module, name)(**{k: _node(item, tensors) for k, item in fields.items()})
    raise CodecError(f"unexpected node {str(d)[:80]}")


def _shaped(body: JsonValue, length: int) -> tuple[list[str], dict[str, JsonValue]] | None:
    """The strings and the fields of ``[str, ..., {fields}]`` of ``length`` items (None if not so shaped)."""
    if not (isinstance(body, list) and len(body) == length and isinstance(fields := body[-1], dict)):
        return None
    names = [s for s in body[:-1] if isinstance(s, str)]
    return (names, fields) if len(names) == length - 1 else None


def _is_dpopt_record(cls: type) -> bool:
    """A NamedTuple or dataclass defined in a dpopt module."""
    in_dpopt = cls.__module__ == "dpopt" or cls.__module__.startswith("dpopt.")
    named_tuple = issubclass(cls, tuple) and hasattr(cls, "_fields")
    return in_dpopt and (named_tuple or dataclasses.is_dataclass(cls))


def _fields(v: object) -> dict[str, object]:
    """A NamedTuple's fields, or a dataclass's constructor fields (of a :func:`_is_dpopt_record`)."""
    if isinstance(v, tuple):
        return dict(zip(getattr(v, "_fields"), v))  # a NamedTuple's, as its _asdict()
    assert dataclasses.is_dataclass(v) and not isinstance(v, type)
    return {f.name: getattr(v, f.name) for f in dataclasses.fields(v) if f.init}


def _dpopt_class(module: str, name: str) -> type:
    """The dpopt NamedTuple or dataclass ``module.name``: ``module`` is imported if it is one of
    dpopt's own (an algorithm's module is imported on first use, and a checkpoint may be read
    before it is); no other module is ever imported."""
    if (module == "dpopt" or module.startswith("dpopt.")) and module not in sys.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise CodecError(f"{module}.{name}: no such dpopt module") from None
    cls = getattr(sys.modules.get(module), name, None) if "." not in name else None
    if not (isinstance(cls, type) and cls.__module__ == module and cls.__qualname__ == name and _is_dpopt_record(cls)):
        raise CodecError(f"{module}.{name} is not a dpopt NamedTuple or dataclass")
    return cls


def _event_class(name: str) -> type:
    """dp_accounting's event class ``name``."""
    cls = vars(dp_event).get(name)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent) and cls.__module__ == dp_event.__name__):
        raise CodecError(f"{name} is not a dp_accounting event")
    return cls
