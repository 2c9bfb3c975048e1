"""JSON that strict parsers accept: a value not measured is ``null``, never ``NaN``.

Python's ``json`` writes NaN and infinities as bare ``NaN`` / ``Infinity``, which ``jq``,
JavaScript and Go reject. Every file and line zmqrl writes as JSON (stats, eval history, the
roles' final line) goes through ``dumps``, which maps non-finite floats to None and then refuses
to write one (``allow_nan=False``), so a new NaN path fails loudly in tests rather than in a
user's script.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (numpy floats included) replaced by None, recursively."""
    if isinstance(value, dict):
        return {str(k): finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float) or hasattr(value, "__float__"):
        number = float(value)
        return number if math.isfinite(number) else None
    return str(value)


def dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def loads_strict(text: str) -> Any:
    """``json.loads`` that raises on NaN / Infinity, as strict parsers do (for tests and readers)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)
