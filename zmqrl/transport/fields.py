"""The wire's limits, and the field checks that hold every foreign value to them.

Shared by the decoder (:mod:`zmqrl.transport.decoding`, :mod:`~zmqrl.transport.layouts`,
:mod:`~zmqrl.transport.header`) and the encoder (:mod:`zmqrl.transport.wire`), so both read a
header the same way. Every check raises :class:`~zmqrl.transport.messages.WireError`
through :func:`fail`, with a short reason that never quotes more than a bounded piece of the foreign
value (:func:`short`).
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np

from zmqrl.spec import ALLOWED_DTYPES
from zmqrl.transport.messages import WireError

# --------------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------------

# Largest header frame accepted, checked before msgpack sees it, so a hostile peer cannot make
# the receiver parse megabytes of metadata. 4096 episode records fit comfortably inside it.
MAX_HEADER_BYTES = 64 * 1024

# Most array frames one message may carry (samples use 5; weights one per parameter tensor).
MAX_ARRAYS = 64


# Longest string (in characters) accepted anywhere in a header: names, roles, reasons, info values.
MAX_STRING = 256

# Most finished-episode records one samples message may carry.
MAX_EPISODES = 4096

# Most entries in a heartbeat's "counters" or "info" map. Not part of the brief's list but needed
# to bound msgpack's map allocation; the header size limit would bound it anyway.
MAX_MAP_ENTRIES = 256

# Largest total size of all array frames of one message (the sum of their byte lengths). Also
# bounds every single dimension, so shape arithmetic stays in small integers.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Integers in headers must fit a signed 64-bit integer, so every language can hold them natively.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Little-endian dtype for each allowed name: decoding always interprets bytes as little-endian,
# whatever the host's byte order ("|" for single-byte types, "<" otherwise).
LE_DTYPES: dict[str, np.dtype[Any]] = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}

# Options for msgpack.unpackb. The max_*_len limits make msgpack refuse oversized containers
# before allocating them; a string may take up to 4 UTF-8 bytes per character; the header must
# not contain binary blobs or extension types at all (ext objects are rejected by the hook).
UNPACK_LIMITS: dict[str, Any] = {
    "raw": False,
    "strict_map_key": True,
    "use_list": True,
    "max_str_len": 4 * MAX_STRING,
    "max_bin_len": 0,
    "max_array_len": MAX_EPISODES + 1,  # one over: the episodes check names what is wrong
    "max_map_len": MAX_MAP_ENTRIES,
    "max_ext_len": 0,
}


# --------------------------------------------------------------------------------------------
# Field checks (all raise WireError with a short reason)
# --------------------------------------------------------------------------------------------


def fail(reason: str) -> NoReturn:
    """Raise the wire's one error type; every check in the wire modules ends up here."""
    raise WireError(reason)


def short(value: Any) -> str:
    """A bounded description of a foreign value for error messages (never a huge or nested repr)."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
    elif isinstance(value, (str, bytes)):
        text = repr(value[:40])
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def int_field(value: Any, what: str, minimum: int = 0) -> int:
    """A real msgpack integer (bool rejected: True would otherwise pass as 1) within int64."""
    if type(value) is not int:
        fail(f"{what} must be an integer, got {short(value)}")
    if value < minimum or value > INT64_MAX:
        fail(f"{what} out of range: {value}")
    return value


def float_field(value: Any, what: str) -> float:
    """A finite number; integers are accepted because other encoders may shrink 3.0 to 3."""
    if type(value) is float:
        if not math.isfinite(value):
            fail(f"{what} must be finite, got {value}")
        return value
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return float(value)
    fail(f"{what} must be a finite number, got {short(value)}")


def str_field(value: Any, what: str) -> str:
    if type(value) is not str:
        fail(f"{what} must be a string, got {short(value)}")
    if len(value) > MAX_STRING:
        fail(f"{what} longer than {MAX_STRING} characters")
    return value


def reject_ext(code: int, data: bytes) -> NoReturn:
    """msgpack ext_hook: extension types have no meaning in this protocol."""
    raise WireError(f"msgpack extension type {code} not allowed")


# --------------------------------------------------------------------------------------------
# Values bound for a header (the encoder's side: numpy scalars become builtins, bools are refused)
# --------------------------------------------------------------------------------------------


def py_int(value: Any, what: str) -> int:
    """Python int from an int or numpy integer (msgpack cannot pack numpy scalars); no bools."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        fail(f"{what} must be an integer, got {short(value)}")
    return int(value)


def py_number(value: Any, what: str) -> int | float:
    """Python int or float from a builtin or numpy number, keeping ints as ints; no bools."""
    if isinstance(value, (bool, np.bool_)):
        fail(f"{what} must be a number, got a bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    fail(f"{what} must be a number, got {short(value)}")
