"""Reading a snapshot back from JSON or msgpack: each dataclass field is checked against its
annotation, so a peer's bad value fails with ValueError here rather than deep in the renderer."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from zmqrl.strictjson import finite_or_none


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def printable(text: Any, most: int = 160) -> str:
    """``text`` fit for a terminal: a heartbeat's strings may quote a peer's bytes, so anything
    that is not a printable character (an escape sequence's start included) shows as ``?``."""
    text = text if isinstance(text, str) else ""
    return "".join(c if c.isprintable() else "?" for c in text[:most])


def to_plain(value: Any) -> Any:
    """Plain data with every NaN / infinity as None (what strict JSON and msgpack readers accept)."""
    return finite_or_none(value)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{key}: expected a string, got {type(v).__name__}")
    return v


def _int(key: str, v: Any) -> int:
    if _is_number(v) and float(v).is_integer():
        return int(v)
    raise ValueError(f"{key}: expected an integer, got {v!r}")


def _float(key: str, v: Any) -> float:
    """None stands for NaN (``to_dict`` writes a value not measured as None)."""
    if v is None:
        return math.nan
    if _is_number(v):
        return float(v)
    raise ValueError(f"{key}: expected a number, got {type(v).__name__}")


def _optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda key, v: None if v is None else parse(key, v)


def _list(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def read(key: str, v: Any) -> list[Any]:
        if not isinstance(v, list):
            raise ValueError(f"{key}: expected a list, got {type(v).__name__}")
        return [parse(f"{key}[{i}]", item) for i, item in enumerate(v)]

    return read


def _int_map(key: str, v: Any) -> dict[str, int]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{key}: expected a mapping, got {type(v).__name__}")
    return {_str(f"{key} key", k): _int(f"{key}[{k}]", n) for k, n in v.items()}


# Annotation (as the source spells it) -> parser.
PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "str": _str,
    "int": _int,
    "float": _float,
    "str | None": _optional(_str),
    "int | None": _optional(_int),
    "float | None": _optional(_float),
    "list[float]": _list(_float),
    "list[str]": _list(_str),
    "dict[str, int]": _int_map,
}


def from_fields(cls: type, d: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Constructor arguments for dataclass ``cls`` from mapping ``d``: present keys parsed by
    their field's annotation; missing keys left to the field defaults; unknown keys ignored."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{cls.__name__}: expected a mapping, got {type(d).__name__}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                out[f.name] = PARSERS[str(f.type)](f.name, _EMPTY[str(f.type)])
            continue
        out[f.name] = PARSERS[str(f.type)](f.name, d[f.name])
    return out


# The value a required field takes when a peer's snapshot leaves it out.
_EMPTY: dict[str, Any] = {"str": "", "int": 0, "float": None}
