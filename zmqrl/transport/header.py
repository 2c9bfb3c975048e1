"""Structural decoding of wire headers: key sets, array descriptors, episodes, fingerprints.

What :func:`zmqrl.transport.wire.load` runs on every message before any array is viewed: the header
map is well-formed, every field is typed and bounded, the descriptors say exactly how many bytes
each array frame must have, and a samples or rollouts message names its columns in the protocol's
order, with aligned shapes. It never looks at array contents (that is
:mod:`zmqrl.transport.validation`). The encoder runs the same :func:`parse_header` on what it is
about to send, so sender and receiver cannot disagree.

The limits and the field checks it applies (each raising :class:`~zmqrl.transport.messages.WireError`
with a short reason) are in :mod:`zmqrl.transport.fields`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from zmqrl.spec import ALLOWED_DTYPES, MAX_NDIM
from zmqrl.transport.fields import (
    INT64_MIN,
    LE_DTYPES,
    MAX_ARRAYS,
    MAX_EPISODES,
    MAX_MESSAGE_BYTES,
    fail,
    float_field,
    int_field,
    short,
    str_field,
)
from zmqrl.transport.messages import (
    KIND_HEARTBEAT,
    KIND_ROLLOUTS,
    KIND_SAMPLES,
    KIND_STOP,
    KIND_WEIGHTS,
    PRIORITY_FIELD,
    PROTO_VERSION,
    Fingerprint,
    FingerprintScalar,
)
from zmqrl.types import BATCH_FIELDS, ROLLOUT_FIELDS, EpisodeStat

# Exact key set of each kind's header. Unknown keys are rejected rather than ignored: a typo in
# another language's encoder should fail at once, and additions go with a PROTO_VERSION bump.
_COMMON_KEYS = ("proto", "kind", "arrays")
_SAMPLES_KEYS = frozenset((*_COMMON_KEYS, "actor_id", "seq", "weights_version", "episodes"))
_HEADER_KEYS: dict[str, frozenset[str]] = {
    KIND_SAMPLES: _SAMPLES_KEYS,
    KIND_ROLLOUTS: _SAMPLES_KEYS,  # the same fields: only the experience in the arrays differs
    KIND_WEIGHTS: frozenset((*_COMMON_KEYS, "version", "agent")),
    KIND_HEARTBEAT: frozenset((*_COMMON_KEYS, "role", "id", "pid", "time", "state", "counters", "info")),
    KIND_STOP: frozenset((*_COMMON_KEYS, "reason")),
}
# Keys a header may carry in addition to its exact set. Each was added without a PROTO_VERSION bump
# because a message without it means exactly what it meant before (as the optional priority array).
_OPTIONAL_KEYS: dict[str, frozenset[str]] = {
    # The learner's run fingerprint (zmqrl/transport/fingerprint.py), and its env-step count at publish time.
    KIND_WEIGHTS: frozenset(("fingerprint", "env_steps")),
}

# Bounds of the optional weights "fingerprint" map: a flat map of the settings actor and learner
# must share. Small on purpose: it is compared key by key on every actor, and named in errors.
MAX_FINGERPRINT_ENTRIES = 64
MAX_FINGERPRINT_LIST = 64  # longest list value (an observation shape, per-dimension action bounds)
_DESCRIPTOR_KEYS = frozenset(("name", "dtype", "shape"))


class ArrayDesc(NamedTuple):
    """One validated array descriptor from a header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


# --------------------------------------------------------------------------------------------
# Header keys and fingerprints
# --------------------------------------------------------------------------------------------


def _keys(
    header: dict[Any, Any], expected: frozenset[str], what: str, optional: frozenset[str] = frozenset()
) -> None:
    keys = header.keys() - optional
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
# every weights message, and checking it from scratch was ~8 us on each side of every publish. A
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


# --------------------------------------------------------------------------------------------
# Header parsing (shared by dump, which validates what it is about to send, and load)
# --------------------------------------------------------------------------------------------


# Validated descriptor lists by their (name, dtype, shape) contents. A peer sends the same few
# layouts over and over (one per batch size), and checking one from scratch cost ~45 µs of the
# learner's ~130 µs per CartPole message. Bounded: a hostile peer varying shapes only fills it,
# after which its layouts are checked from scratch as before.
_LAYOUTS: dict[tuple[tuple[str, str, tuple[int, ...]], ...], list[ArrayDesc]] = {}
_MAX_LAYOUTS = 512
# ids of the cached lists (never freed, so an id is never reused), and per kind those that passed
# its column check (_COLUMN_CHECKS). Cached lists are shared: callers only read them.
_CACHED: set[int] = set()
_CHECKED_LAYOUTS: dict[str, set[int]] = {KIND_SAMPLES: set(), KIND_ROLLOUTS: set()}


def _layout_key(arrays: list[Any]) -> tuple[tuple[str, str, tuple[int, ...]], ...] | None:
    """The cache key of a descriptor list, or None when it is not plainly well-typed (then the
    full check runs, and reports what is wrong). Exact types only: ``True`` or ``64.0`` equal 1
    and 64 as keys, but are not valid dimensions."""
    key = []
    for d in arrays:
        if type(d) is not dict or len(d) != 3:
            return None
        name, dtype, shape = d.get("name"), d.get("dtype"), d.get("shape")
        if type(name) is not str or type(dtype) is not str or type(shape) is not list:
            return None
        for dim in shape:
            if type(dim) is not int:
                return None
        key.append((name, dtype, tuple(shape)))
    return tuple(key)


def is_known_layout(descs: list[ArrayDesc]) -> bool:
    """Whether ``descs`` is a cached layout (the same object for every message of that layout)."""
    return id(descs) in _CACHED


def _descriptors(arrays: Any) -> list[ArrayDesc]:
    """Validate the "arrays" list and compute each array's exact byte length (a layout seen
    before is looked up, not checked again: same contents, same result)."""
    if type(arrays) is not list:
        fail(f"'arrays' must be a list, got {short(arrays)}")
    key = _layout_key(arrays) if len(arrays) <= MAX_ARRAYS else None
    if key is not None:
        known = _LAYOUTS.get(key)
        if known is not None:
            return known
    out = _check_descriptors(arrays)
    if key is not None and len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[key] = out
        _CACHED.add(id(out))
    return out


def _check_descriptors(arrays: Any) -> list[ArrayDesc]:
    if type(arrays) is not list:
        fail(f"'arrays' must be a list, got {short(arrays)}")
    if len(arrays) > MAX_ARRAYS:
        fail(f"too many arrays: {len(arrays)} > {MAX_ARRAYS}")
    out: list[ArrayDesc] = []
    total = 0
    for i, d in enumerate(arrays):
        if type(d) is not dict:
            fail(f"array descriptor {i} must be a map, got {short(d)}")
        _keys(d, _DESCRIPTOR_KEYS, f"array descriptor {i}")
        name = str_field(d["name"], f"array {i} name")
        dtype = d["dtype"]
        if type(dtype) is not str or dtype not in ALLOWED_DTYPES:
            fail(f"array {name!r}: dtype {short(dtype)} not allowed")
        shape = d["shape"]
        if type(shape) is not list:
            fail(f"array {name!r}: shape must be a list, got {short(shape)}")
        if len(shape) > MAX_NDIM:
            fail(f"array {name!r}: {len(shape)} dimensions > {MAX_NDIM}")
        # Python ints cannot overflow, and each dim is capped, so this product stays small.
        nbytes = LE_DTYPES[dtype].itemsize
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= MAX_MESSAGE_BYTES:
                fail(f"array {name!r}: bad dimension {short(dim)}")
            nbytes *= dim
        total += nbytes
        if total > MAX_MESSAGE_BYTES:
            fail(f"arrays larger than {MAX_MESSAGE_BYTES} bytes in total")
        out.append(ArrayDesc(name, dtype, tuple(shape), nbytes))
    return out


def parse_episodes(value: Any) -> list[EpisodeStat]:
    """A samples header's "episodes": a bounded list of [finite return, length >= 0] records."""
    if type(value) is not list:
        fail(f"'episodes' must be a list, got {short(value)}")
    if len(value) > MAX_EPISODES:
        fail(f"too many episodes: {len(value)} > {MAX_EPISODES}")
    out: list[EpisodeStat] = []
    for rec in value:
        if type(rec) is not list or len(rec) != 2:
            fail(f"episode record must be [return, length], got {short(rec)}")
        out.append(EpisodeStat(float_field(rec[0], "episode return"), int_field(rec[1], "episode length")))
    return out


def _check_sample_columns(descs: list[ArrayDesc]) -> None:
    """The protocol-fixed part of a samples message's layout (the spec-dependent part is later)."""
    names = tuple(d.name for d in descs)
    if names not in (BATCH_FIELDS, (*BATCH_FIELDS, PRIORITY_FIELD)):
        fail(
            f"samples arrays must be {list(BATCH_FIELDS)} (optionally then {PRIORITY_FIELD!r}) in that order,"
            f" got {[short(n) for n in names]}"
        )
    lead = None
    for d in descs:
        if not d.shape:
            fail(f"samples column {d.name!r} has no batch dimension")
        if lead is None:
            lead = d.shape[0]
        elif d.shape[0] != lead:
            fail(f"samples column {d.name!r} has {d.shape[0]} rows, expected {lead}")
    for d in (descs[2], descs[4], *descs[5:]):  # reward, discount, priority
        if d.dtype != "float32" or len(d.shape) != 1:
            fail(f"samples column {d.name!r} must be float32 of shape (B,), got {d.dtype} {list(d.shape)}")


def _check_rollout_columns(descs: list[ArrayDesc]) -> None:
    """The protocol-fixed part of a rollouts message's layout: R >= 1 rows of T >= 1 steps, every
    step column (R, T, ...) with obs one step longer, and final_obs rows shaped like obs's. What
    T, R and K must be for the run is the spec's (validation), not the protocol's."""
    names = tuple(d.name for d in descs)
    if names != ROLLOUT_FIELDS:
        fail(f"rollouts arrays must be {list(ROLLOUT_FIELDS)} in that order, got {[short(n) for n in names]}")
    obs, final_obs = descs[0], descs[6]
    if len(obs.shape) < 2 or obs.shape[0] < 1 or obs.shape[1] < 2:
        fail(f"rollouts column 'obs' must be [R, T + 1, ...] with R >= 1 and T >= 1, got {list(obs.shape)}")
    lead = (obs.shape[0], obs.shape[1] - 1)
    for d in descs[1:6]:  # action, reward, terminated, truncated, logp
        if d.shape[:2] != lead:
            want = f"[R, T, ...] = {list(lead)} (obs is [R, T + 1, ...])"
            fail(f"rollouts column {d.name!r} is {list(d.shape)}, expected {want}")
    for d, dtype in zip(descs[2:6], ("float32", "bool", "bool", "float32"), strict=True):
        if d.dtype != dtype or len(d.shape) != 2:
            fail(f"rollouts column {d.name!r} must be {dtype} of shape [R, T], got {d.dtype} {list(d.shape)}")
    if (
        final_obs.dtype != obs.dtype
        or len(final_obs.shape) != len(obs.shape) - 1
        or final_obs.shape[1:] != obs.shape[2:]
    ):
        row = "".join(f", {dim}" for dim in obs.shape[2:])
        got = f"{final_obs.dtype} {list(final_obs.shape)}"
        fail(f"rollouts column 'final_obs' must be {obs.dtype} [K{row}] like obs's rows, got {got}")


# The column check of each kind that carries experience.
_COLUMN_CHECKS = {KIND_SAMPLES: _check_sample_columns, KIND_ROLLOUTS: _check_rollout_columns}


def parse_header(header: Any) -> tuple[str, list[ArrayDesc]]:
    """Validate a decoded header of any kind; return its kind and array descriptors."""
    if type(header) is not dict:
        fail(f"header must be a map, got {short(header)}")
    proto = header.get("proto")
    if type(proto) is not int or proto != PROTO_VERSION:
        fail(f"unsupported protocol version {short(proto)}")
    kind = header.get("kind")
    if type(kind) is not str or kind not in _HEADER_KEYS:
        fail(f"unknown message kind {short(kind)}")
    _keys(header, _HEADER_KEYS[kind], f"{kind} header", _OPTIONAL_KEYS.get(kind, frozenset()))
    descs = _descriptors(header["arrays"])
    if kind in _COLUMN_CHECKS:  # samples, rollouts
        int_field(header["actor_id"], "actor_id")
        int_field(header["seq"], "seq")
        int_field(header["weights_version"], "weights_version")
        checked = _CHECKED_LAYOUTS[kind]
        if id(descs) not in checked:
            _COLUMN_CHECKS[kind](descs)
            if id(descs) in _CACHED:
                checked.add(id(descs))
    elif kind == KIND_WEIGHTS:
        int_field(header["version"], "version")
        str_field(header["agent"], "agent")
        if "fingerprint" in header:
            parse_fingerprint(header["fingerprint"])
        if "env_steps" in header:
            int_field(header["env_steps"], "env_steps")
        if len({d.name for d in descs}) != len(descs):
            fail("weights array names are not unique")
    elif kind == KIND_HEARTBEAT:
        if descs:
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
        if descs:
            fail("stop must not carry arrays")
        str_field(header["reason"], "reason")
    return kind, descs
