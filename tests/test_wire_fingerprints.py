"""A fingerprint equal to the last one that passed is taken without a second check only when its
values have the same exact types: an equal value of another type may be invalid."""

from __future__ import annotations

import pytest

from zmqrl.transport.header import parse_fingerprint
from zmqrl.transport.messages import WireError


def test_an_equal_fingerprint_of_other_types_is_checked_again() -> None:
    parse_fingerprint({"steps": 9.223372036854776e18, "shape": [4.0]})
    assert parse_fingerprint({"steps": 9.223372036854776e18, "shape": [4.0]}) == {
        "steps": 2.0**63,
        "shape": [4.0],
    }
    with pytest.raises(WireError, match="out of range"):
        parse_fingerprint({"steps": 2**63, "shape": [4.0]})  # equal as a number, beyond int64
    parse_fingerprint({"steps": 9.223372036854776e18, "shape": [4.0]})
    with pytest.raises(WireError, match="out of range"):
        parse_fingerprint({"steps": 9.223372036854776e18, "shape": [2**64]})  # never equal: checked
    with pytest.raises(WireError, match="must be finite"):
        parse_fingerprint({"steps": float("nan"), "shape": [4.0]})
