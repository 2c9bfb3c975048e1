"""The header fields of the wire's other kinds (weights, heartbeat, stop), and key-set checks.

What :func:`zmqrl.transport.decoding.parse_header` runs for a message that is not experience:
the exact key set of its kind, and every field typed and bounded (a weights message's fingerprint
map included). Samples and rollouts are the decoder's own, start to end. The limits and field
checks (each raising :class:`~zmqrl.transport.messages.WireError` with a short reason) are in
:mod:`zmqrl.transport.fields`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zmqrl.transport.fields import INT64_MIN, fail, float_field, int_field, short, str_field
from zmqrl.transport.messages import (
    KIND_HEARTBEAT,
    KIND_STOP,
    KIND_WEIGHTS,
    Fingerprint,
    FingerprintScalar,
)

# Exact key set of each kind's header. Unknown keys are rejected rather than ignored: a typo in
# another language's encoder should fail at once, and additions go with a PROTO_VERSION bump.
# (Samples and rollouts: zmqrl.transport.decoding.SAMPLES_KEYS.)
_COMMON_KEYS = ("proto", "kind", "arrays")
HEADER_KEYS: dict[str, frozenset[str]] = {
    KIND_WEIGHTS: frozenset((*_COMMON_KEYS, "version", "agent")),
    KIND_HEARTBEAT: frozenset((*_COMMON_KEYS, "role", "id", "pid", "time", "state", "counters", "info")),
    KIND_STOP: frozenset((*_COMMON_KEYS, "reason")),
}
# Keys a header may carry in addition to its exact set. Each was added without a PROTO_VERSION bump
# because a message without it means exactly what it meant before (as the optional priority array).
OPTIONAL_KEYS: dict[str, frozenset[str]] = {
    # The learner's run fingerprint (zmqrl/transport/fingerprint.py), and its env-step count at publish time.
    KIND_WEIGHTS: frozenset(("fingerprint", "env_steps")),
}

# Bounds of the optional weights "fingerprint" map: a flat map of the settings actor and learner
# must share. Small on purpose: it is compared key by key on every actor, and named in errors.
MAX_FINGERPRINT_ENTRIES = 64
MAX_FINGERPRINT_LIST = 64  # longest list value (an observation shape, per-dimension action bounds)
# The exact keys of an array descriptor (zmqrl.transport.layouts checks the rest).
DESCRIPTOR_KEYS = frozenset(("name", "dtype", "shape"))


# --------------------------------------------------------------------------------------------
# Header keys and fingerprints
# --------------------------------------------------------------------------------------------


def check_keys(
    header: dict[Any, Any], expected: frozenset[str], what: str, optional: frozenset[str] | None = None
) -> None:
    """``header``'s keys are ``expected`` (and any of ``optional``), else a reason naming both."""
    keys = header.keys() - (optional or frozenset())
    if keys != expected:
        missing = sorted(expected - keys)
        extra = sorted(short(k) for k in keys - expected)
        fail(f"{what}: missing keys {missing}, unexpected keys {extra}")


def _fingerprint_scalar(value: Any, what: str) -> FingerprintScalar:
    if type(value) is bool:
        return value
    if type(value) is str:
        return str_field(value, what)
    if type(value) is int:
        return int_field(value, what, minimum=INT64_MIN)
    if type(value) is float:
        return float_field(value, what)
    fail(f"{what} must be a string, number or bool, got {short(value)}")


def _signature(fingerprint: dict[Any, Any]) -> tuple[Any, ...]:
    """The exact types of a fingerprint's values (of a list's items too), in order."""
    return tuple(tuple(map(type, v)) if type(v) is list else type(v) for v in fingerprint.values())


# The last fingerprint that passed, with its signature. A run's learner sends one fingerprint with
# every weights message, and checking it from scratch costs each side of every publish again. A
# map equal to it whose values have the same exact types is as valid: equal strings have equal
# lengths, equal ints the same range, equal floats are finite (NaN equals nothing).
_KNOWN_FINGERPRINT: tuple[dict[Any, Any], tuple[Any, ...]] | None = None


def parse_fingerprint(value: Any) -> Fingerprint:
    """A flat map of short strings to scalars or short lists of scalars; nothing nested."""
    global _KNOWN_FINGERPRINT
    if type(value) is not dict:
        fail(f"'fingerprint' must be a map, got {short(value)}")
    known = _KNOWN_FINGERPRINT
    if known is not None and value == known[0] and _signature(value) == known[1]:
        return value
    if len(value) > MAX_FINGERPRINT_ENTRIES:
        fail(f"fingerprint has {len(value)} entries > {MAX_FINGERPRINT_ENTRIES}")
    out: Fingerprint = {}
    for key, item in value.items():
        name = str_field(key, "fingerprint key")
        if type(item) is list:
            if len(item) > MAX_FINGERPRINT_LIST:
                fail(f"fingerprint {name!r} has {len(item)} items > {MAX_FINGERPRINT_LIST}")
            out[name] = [_fingerprint_scalar(x, f"fingerprint {name!r} item") for x in item]
        else:
            out[name] = _fingerprint_scalar(item, f"fingerprint {name!r}")
    _KNOWN_FINGERPRINT = (out, _signature(out))
    return out


def check_fields(kind: str, header: dict[str, Any], array_names: Sequence[str]) -> None:
    """The fields of a weights, heartbeat or stop header (its key set already checked)."""
    if kind == KIND_WEIGHTS:
        int_field(header["version"], "version")
        str_field(header["agent"], "agent")
        if "fingerprint" in header:
            parse_fingerprint(header["fingerprint"])
        if "env_steps" in header:
            int_field(header["env_steps"], "env_steps")
        if len(set(array_names)) != len(array_names):
            fail("weights array names are not unique")
    elif kind == KIND_HEARTBEAT:
        if array_names:
            fail("heartbeat must not carry arrays")
        for key in ("role", "state"):
            str_field(header[key], key)
        int_field(header["id"], "id")
        int_field(header["pid"], "pid")
        float_field(header["time"], "time")
        counters = header["counters"]
        if type(counters) is not dict:
            fail(f"'counters' must be a map, got {short(counters)}")
        for k, v in counters.items():
            str_field(k, "counter name")
            if type(v) is int:
                int_field(v, f"counter {k!r}", minimum=INT64_MIN)
            else:
                float_field(v, f"counter {k!r}")
        info = header["info"]
        if type(info) is not dict:
            fail(f"'info' must be a map, got {short(info)}")
        for k, v in info.items():
            str_field(k, "info key")
            str_field(v, f"info {k!r}")
    else:  # KIND_STOP
        if array_names:
            fail("stop must not carry arrays")
        str_field(header["reason"], "reason")
