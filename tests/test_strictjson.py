"""Strict JSON: what zmqrl writes, jq and JavaScript can read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zmqrl.strictjson import dumps, loads_strict


def test_values_not_measured_become_null() -> None:
    text = dumps({"eval_return": math.nan, "best": -math.inf, "x": np.float32(1.5), "h": [{"m": math.inf}]})
    assert loads_strict(text) == {"eval_return": None, "best": None, "x": 1.5, "h": [{"m": None}]}


def test_the_strict_reader_refuses_bare_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        loads_strict('{"eval_return": NaN}')


def test_ints_bools_and_strings_are_kept_as_they_are() -> None:
    assert loads_strict(dumps({"n": 3, "ok": True, "s": "a", "none": None, "np": np.int64(7)})) == {
        "n": 3,
        "ok": True,
        "s": "a",
        "none": None,
        "np": 7.0,
    }
