"""The zmqrl wire format: pure encode/decode of the four message kinds, no sockets.

Every message is one ZeroMQ multipart message. Frame 0 is a msgpack map (the *header*) that says
what the message is and describes its arrays; frames 1..k are the arrays' raw bytes
(little-endian, C order), one frame per array, in the order the header's ``"arrays"`` list names
them. Keeping array bytes out of msgpack lets the sender hand numpy buffers to ZeroMQ without
copying and lets the receiver view them with ``np.frombuffer`` without copying either.

Why the decoders are so strict: the learner accepts data from any process that can reach its
socket, and a single malformed batch (a NaN reward, an out-of-range action, a lying frame length)
would silently poison replay or crash the learner far from the cause. So every decoder checks
everything it can and raises exactly one exception type, :class:`WireError`, for anything wrong,
which the receiving loop counts, logs (rate-limited) and drops. Pickle is never used: unpickling
foreign bytes is code execution.

Two levels of checking, split so the hot path pays only for what it needs:

* :func:`load` checks *structure*: header well-formed, frames match their descriptors byte for
  byte, kind-specific header fields typed and bounded, sample columns named and aligned. It never
  scans array contents.
* :func:`load_samples` / :func:`load_weights` add *content* checks (finite floats, discount range,
  action range, shapes against the run's spec or the receiver's network). Receivers of data
  should always use these; plain :func:`load` is for heartbeats and control.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import msgpack
import numpy as np

from zmqrl.spec import ALLOWED_DTYPES, MAX_NDIM, SampleSpec
from zmqrl.types import BATCH_FIELDS, EpisodeStat, TransitionBatch, Weights

# --------------------------------------------------------------------------------------------
# Protocol constants
# --------------------------------------------------------------------------------------------

# Bumped on any incompatible header or framing change; receivers reject every other value, so
# mixed-version deployments fail loudly instead of misreading each other.
PROTO_VERSION = 1

# Values of the header's "kind" field.
KIND_SAMPLES = "samples"  # actor -> learner: a batch of n-step transitions plus finished episodes
KIND_WEIGHTS = "weights"  # learner -> actors: a versioned snapshot of the acting network
KIND_HEARTBEAT = "heartbeat"  # any role -> supervisor: liveness, counters, bound endpoints
KIND_STOP = "stop"  # supervisor -> everyone: shut down cleanly


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
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# Little-endian dtype for each allowed name: decoding always interprets bytes as little-endian,
# whatever the host's byte order ("|" for single-byte types, "<" otherwise).
_LE_DTYPES: dict[str, np.dtype[Any]] = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}

# Name of the optional sixth samples array: the actor's initial replay priorities.
PRIORITY_FIELD = "priority"

# Exact key set of each kind's header. Unknown keys are rejected rather than ignored: a typo in
# another language's encoder should fail at once, and additions go with a PROTO_VERSION bump.
_COMMON_KEYS = ("proto", "kind", "arrays")
_HEADER_KEYS: dict[str, frozenset[str]] = {
    KIND_SAMPLES: frozenset((*_COMMON_KEYS, "actor_id", "seq", "weights_version", "episodes")),
    KIND_WEIGHTS: frozenset((*_COMMON_KEYS, "version", "agent")),
    KIND_HEARTBEAT: frozenset((*_COMMON_KEYS, "role", "id", "pid", "time", "state", "counters", "info")),
    KIND_STOP: frozenset((*_COMMON_KEYS, "reason")),
}
# Keys a header may carry in addition to its exact set. Each was added without a PROTO_VERSION bump
# because a message without it means exactly what it meant before (as the optional priority array).
_OPTIONAL_KEYS: dict[str, frozenset[str]] = {
    # The learner's run fingerprint (zmqrl/fingerprint.py), and its env-step count at publish time.
    KIND_WEIGHTS: frozenset(("fingerprint", "env_steps")),
}

# Bounds of the optional weights "fingerprint" map: a flat map of the settings actor and learner
# must share. Small on purpose: it is compared key by key on every actor, and named in errors.
MAX_FINGERPRINT_ENTRIES = 64
MAX_FINGERPRINT_LIST = 64  # longest list value (an observation shape, per-dimension action bounds)

# Continuous actions may exceed the spec's bounds by this much, relative to the bound's magnitude
# (at least 1): float32 rounding in an actor's rescaling of a squashed policy output (low + (y + 1)
# * (high - low) / 2) lands a few ulps outside a bound; anything further out is a bug or hostile.
ACTION_BOUND_TOLERANCE = 1e-5
_DESCRIPTOR_KEYS = frozenset(("name", "dtype", "shape"))

# Options for msgpack.unpackb. The max_*_len limits make msgpack refuse oversized containers
# before allocating them; a string may take up to 4 UTF-8 bytes per character; the header must
# not contain binary blobs or extension types at all (ext objects are rejected by the hook).
_UNPACK_LIMITS: dict[str, Any] = {
    "raw": False,
    "strict_map_key": True,
    "use_list": True,
    "max_str_len": 4 * MAX_STRING,
    "max_bin_len": 0,
    "max_array_len": MAX_EPISODES,
    "max_map_len": MAX_MAP_ENTRIES,
    "max_ext_len": 0,
}


class WireError(ValueError):
    """The one error type every decoder raises for any malformed/foreign message."""


# A fingerprint value: a scalar, or a short flat list of scalars (shapes, per-dimension bounds).
FingerprintScalar = str | int | float | bool
FingerprintValue = FingerprintScalar | list[FingerprintScalar]
Fingerprint = dict[str, FingerprintValue]


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@dataclass
class SamplesMsg:
    """Actor -> learner: transitions collected under ``weights_version`` plus finished episodes.

    ``seq`` counts this actor's messages from 0 so the learner can spot gaps (drops) per actor.
    """

    actor_id: int
    seq: int
    weights_version: int
    batch: TransitionBatch
    episodes: list[EpisodeStat]
    # Optional initial replay priorities (B,) float32 >= 0, computed by the actor (Ape-X); sent as a
    # sixth array frame named "priority". None: the learner gives new rows its maximum priority.
    priorities: np.ndarray | None = None


@dataclass
class WeightsMsg:
    """Learner -> actors: the acting network's parameters; ``agent`` guards against a mismatch."""

    weights: Weights
    agent: str  # agent kind, e.g. "dqn"
    # The learner's run fingerprint (settings its actors must share: env, spaces, network, n-step,
    # gamma), so a mismatched actor can refuse itself. None: an older learner that sends none.
    fingerprint: Fingerprint | None = None
    # Transitions the learner had received when it published this snapshot: lets an evaluator put
    # its results on the same x-axis (env steps) as the learner's. None: not sent.
    env_steps: int | None = None


@dataclass
class HeartbeatMsg:
    """Any role -> supervisor: proof of life plus enough state to show progress and endpoints."""

    role: str
    id: int
    pid: int
    time: float  # sender's wall clock (time.time()), seconds
    state: str  # "starting" | "running" | "finished" | "stopping" (any short string accepted)
    counters: dict[str, float | int]
    info: dict[str, str]  # e.g. bound endpoints


@dataclass
class StopMsg:
    """Supervisor -> everyone: stop; ``reason`` is for logs only."""

    reason: str


Message = SamplesMsg | WeightsMsg | HeartbeatMsg | StopMsg


class _Desc(NamedTuple):
    """One validated array descriptor from a header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


# --------------------------------------------------------------------------------------------
# Small checkers (all raise WireError with a short reason)
# --------------------------------------------------------------------------------------------


def _fail(reason: str) -> NoReturn:
    raise WireError(reason)


def _short(value: Any) -> str:
    """A bounded description of a foreign value for error messages (never a huge or nested repr)."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
    elif isinstance(value, (str, bytes)):
        text = repr(value[:40])
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any, what: str, minimum: int = 0) -> int:
    """A real msgpack integer (bool rejected: True would otherwise pass as 1) within int64."""
    if type(value) is not int:
        _fail(f"{what} must be an integer, got {_short(value)}")
    if value < minimum or value > _INT64_MAX:
        _fail(f"{what} out of range: {value}")
    return value


def _float(value: Any, what: str) -> float:
    """A finite number; integers are accepted because other encoders may shrink 3.0 to 3."""
    if type(value) is float:
        if not math.isfinite(value):
            _fail(f"{what} must be finite, got {value}")
        return value
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return float(value)
    _fail(f"{what} must be a finite number, got {_short(value)}")


def _str(value: Any, what: str) -> str:
    if type(value) is not str:
        _fail(f"{what} must be a string, got {_short(value)}")
    if len(value) > MAX_STRING:
        _fail(f"{what} longer than {MAX_STRING} characters")
    return value


def _keys(
    header: dict[Any, Any], expected: frozenset[str], what: str, optional: frozenset[str] = frozenset()
) -> None:
    keys = header.keys() - optional
    if keys != expected:
        missing = sorted(expected - keys)
        extra = sorted(_short(k) for k in keys - expected)
        _fail(f"{what}: missing keys {missing}, unexpected keys {extra}")


def _fingerprint_scalar(value: Any, what: str) -> FingerprintScalar:
    if type(value) is bool:
        return value
    if type(value) is str:
        return _str(value, what)
    if type(value) is int:
        return _int(value, what, minimum=_INT64_MIN)
    if type(value) is float:
        return _float(value, what)
    _fail(f"{what} must be a string, number or bool, got {_short(value)}")


def _fingerprint(value: Any) -> Fingerprint:
    """A flat map of short strings to scalars or short lists of scalars; nothing nested."""
    if type(value) is not dict:
        _fail(f"'fingerprint' must be a map, got {_short(value)}")
    if len(value) > MAX_FINGERPRINT_ENTRIES:
        _fail(f"fingerprint has {len(value)} entries > {MAX_FINGERPRINT_ENTRIES}")
    out: Fingerprint = {}
    for key, item in value.items():
        name = _str(key, "fingerprint key")
        if type(item) is list:
            if len(item) > MAX_FINGERPRINT_LIST:
                _fail(f"fingerprint {name!r} has {len(item)} items > {MAX_FINGERPRINT_LIST}")
            out[name] = [_fingerprint_scalar(x, f"fingerprint {name!r} item") for x in item]
        else:
            out[name] = _fingerprint_scalar(item, f"fingerprint {name!r}")
    return out


def _reject_ext(code: int, data: bytes) -> NoReturn:
    """msgpack ext_hook: extension types have no meaning in this protocol."""
    raise WireError(f"msgpack extension type {code} not allowed")


# --------------------------------------------------------------------------------------------
# Header parsing (shared by dump, which validates what it is about to send, and load)
# --------------------------------------------------------------------------------------------


def _descriptors(arrays: Any) -> list[_Desc]:
    """Validate the "arrays" list and compute each array's exact byte length."""
    if type(arrays) is not list:
        _fail(f"'arrays' must be a list, got {_short(arrays)}")
    if len(arrays) > MAX_ARRAYS:
        _fail(f"too many arrays: {len(arrays)} > {MAX_ARRAYS}")
    out: list[_Desc] = []
    total = 0
    for i, d in enumerate(arrays):
        if type(d) is not dict:
            _fail(f"array descriptor {i} must be a map, got {_short(d)}")
        _keys(d, _DESCRIPTOR_KEYS, f"array descriptor {i}")
        name = _str(d["name"], f"array {i} name")
        dtype = d["dtype"]
        if type(dtype) is not str or dtype not in ALLOWED_DTYPES:
            _fail(f"array {name!r}: dtype {_short(dtype)} not allowed")
        shape = d["shape"]
        if type(shape) is not list:
            _fail(f"array {name!r}: shape must be a list, got {_short(shape)}")
        if len(shape) > MAX_NDIM:
            _fail(f"array {name!r}: {len(shape)} dimensions > {MAX_NDIM}")
        # Python ints cannot overflow, and each dim is capped, so this product stays small.
        nbytes = _LE_DTYPES[dtype].itemsize
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= MAX_MESSAGE_BYTES:
                _fail(f"array {name!r}: bad dimension {_short(dim)}")
            nbytes *= dim
        total += nbytes
        if total > MAX_MESSAGE_BYTES:
            _fail(f"arrays larger than {MAX_MESSAGE_BYTES} bytes in total")
        out.append(_Desc(name, dtype, tuple(shape), nbytes))
    return out


def _episodes(value: Any) -> list[EpisodeStat]:
    if type(value) is not list:
        _fail(f"'episodes' must be a list, got {_short(value)}")
    if len(value) > MAX_EPISODES:
        _fail(f"too many episodes: {len(value)} > {MAX_EPISODES}")
    out: list[EpisodeStat] = []
    for rec in value:
        if type(rec) is not list or len(rec) != 2:
            _fail(f"episode record must be [return, length], got {_short(rec)}")
        out.append(EpisodeStat(_float(rec[0], "episode return"), _int(rec[1], "episode length")))
    return out


def _check_sample_columns(descs: list[_Desc]) -> None:
    """The protocol-fixed part of a samples message's layout (the spec-dependent part is later)."""
    names = tuple(d.name for d in descs)
    if names not in (BATCH_FIELDS, (*BATCH_FIELDS, PRIORITY_FIELD)):
        _fail(
            f"samples arrays must be {list(BATCH_FIELDS)} (optionally then {PRIORITY_FIELD!r}) in that order,"
            f" got {[_short(n) for n in names]}"
        )
    lead = None
    for d in descs:
        if not d.shape:
            _fail(f"samples column {d.name!r} has no batch dimension")
        if lead is None:
            lead = d.shape[0]
        elif d.shape[0] != lead:
            _fail(f"samples column {d.name!r} has {d.shape[0]} rows, expected {lead}")
    for d in (descs[2], descs[4], *descs[5:]):  # reward, discount, priority
        if d.dtype != "float32" or len(d.shape) != 1:
            _fail(f"samples column {d.name!r} must be float32 of shape (B,), got {d.dtype} {list(d.shape)}")


def _parse_header(header: Any) -> tuple[str, list[_Desc]]:
    """Validate a decoded header of any kind; return its kind and array descriptors."""
    if type(header) is not dict:
        _fail(f"header must be a map, got {_short(header)}")
    proto = header.get("proto")
    if type(proto) is not int or proto != PROTO_VERSION:
        _fail(f"unsupported protocol version {_short(proto)}")
    kind = header.get("kind")
    if type(kind) is not str or kind not in _HEADER_KEYS:
        _fail(f"unknown message kind {_short(kind)}")
    _keys(header, _HEADER_KEYS[kind], f"{kind} header", _OPTIONAL_KEYS.get(kind, frozenset()))
    descs = _descriptors(header["arrays"])
    if kind == KIND_SAMPLES:
        _int(header["actor_id"], "actor_id")
        _int(header["seq"], "seq")
        _int(header["weights_version"], "weights_version")
        _check_sample_columns(descs)
    elif kind == KIND_WEIGHTS:
        _int(header["version"], "version")
        _str(header["agent"], "agent")
        if "fingerprint" in header:
            _fingerprint(header["fingerprint"])
        if "env_steps" in header:
            _int(header["env_steps"], "env_steps")
        if len({d.name for d in descs}) != len(descs):
            _fail("weights array names are not unique")
    elif kind == KIND_HEARTBEAT:
        if descs:
            _fail("heartbeat must not carry arrays")
        for key in ("role", "state"):
            _str(header[key], key)
        _int(header["id"], "id")
        _int(header["pid"], "pid")
        _float(header["time"], "time")
        counters = header["counters"]
        if type(counters) is not dict:
            _fail(f"'counters' must be a map, got {_short(counters)}")
        for k, v in counters.items():
            _str(k, "counter name")
            if type(v) is int:
                _int(v, f"counter {k!r}", minimum=_INT64_MIN)
            else:
                _float(v, f"counter {k!r}")
        info = header["info"]
        if type(info) is not dict:
            _fail(f"'info' must be a map, got {_short(info)}")
        for k, v in info.items():
            _str(k, "info key")
            _str(v, f"info {k!r}")
    else:  # KIND_STOP
        if descs:
            _fail("stop must not carry arrays")
        _str(header["reason"], "reason")
    return kind, descs


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _py_int(value: Any, what: str) -> int:
    """Python int from an int or numpy integer (msgpack cannot pack numpy scalars); no bools."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        _fail(f"{what} must be an integer, got {_short(value)}")
    return int(value)


def _py_number(value: Any, what: str) -> int | float:
    """Python int or float from a builtin or numpy number, keeping ints as ints; no bools."""
    if isinstance(value, (bool, np.bool_)):
        _fail(f"{what} must be a number, got a bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    _fail(f"{what} must be a number, got {_short(value)}")


def _dump_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """Builtin scalars (numpy scalars converted, tuples as lists) for msgpack; validated by dump."""

    def scalar(v: Any) -> Any:
        if isinstance(v, (np.bool_, np.integer, np.floating)):
            return v.item()
        return v

    return {
        k: [scalar(x) for x in v] if isinstance(v, (list, tuple)) else scalar(v)
        for k, v in fingerprint.items()
    }


def _array_frame(name: str, value: Any) -> tuple[dict[str, Any], memoryview]:
    """Descriptor plus a zero-copy byte view of ``value`` as little-endian C order.

    Copies only when the array is not already little-endian and C-contiguous. The returned view
    aliases the caller's array, so it must not be mutated until ZeroMQ has sent the frame.
    """
    arr = np.asarray(value)
    dtype = arr.dtype.name
    if dtype not in ALLOWED_DTYPES:
        _fail(f"array {name!r}: dtype {dtype} not allowed (allowed: {sorted(ALLOWED_DTYPES)})")
    le = _LE_DTYPES[dtype]
    if arr.dtype != le:
        arr = arr.astype(le)
    if not arr.flags.c_contiguous:  # np.ascontiguousarray would turn a 0-d array into shape (1,)
        arr = np.ascontiguousarray(arr)
    desc = {"name": name, "dtype": dtype, "shape": list(arr.shape)}
    return desc, memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def dump(msg: Message) -> list[bytes | memoryview]:
    """Encode ``msg`` as the frames to pass to ``socket.send_multipart``.

    The header is validated with the same code the receiver runs, so an encoder bug surfaces as
    a WireError at the sender rather than as unexplained drops at the receiver. Array *contents*
    (NaN, ranges) are not checked here; that is the receiver's job.
    """
    arrays: list[tuple[str, Any]]
    header: dict[str, Any] = {"proto": PROTO_VERSION}
    if isinstance(msg, SamplesMsg):
        header["kind"] = KIND_SAMPLES
        header["actor_id"] = _py_int(msg.actor_id, "actor_id")
        header["seq"] = _py_int(msg.seq, "seq")
        header["weights_version"] = _py_int(msg.weights_version, "weights_version")
        episodes = []
        for ep in msg.episodes:
            ret, length = ep
            episodes.append([float(_py_number(ret, "episode return")), _py_int(length, "episode length")])
        header["episodes"] = episodes
        arrays = [(name, getattr(msg.batch, name)) for name in BATCH_FIELDS]
        if msg.priorities is not None:
            arrays.append((PRIORITY_FIELD, msg.priorities))
    elif isinstance(msg, WeightsMsg):
        header["kind"] = KIND_WEIGHTS
        header["version"] = _py_int(msg.weights.version, "version")
        header["agent"] = msg.agent
        if msg.fingerprint is not None:
            header["fingerprint"] = _dump_fingerprint(msg.fingerprint)
        if msg.env_steps is not None:
            header["env_steps"] = _py_int(msg.env_steps, "env_steps")
        arrays = list(msg.weights.arrays.items())
    elif isinstance(msg, HeartbeatMsg):
        header["kind"] = KIND_HEARTBEAT
        header.update(role=msg.role, state=msg.state, info=dict(msg.info))
        header["id"] = _py_int(msg.id, "id")
        header["pid"] = _py_int(msg.pid, "pid")
        header["time"] = float(_py_number(msg.time, "time"))
        header["counters"] = {k: _py_number(v, f"counter {k!r}") for k, v in msg.counters.items()}
        arrays = []
    elif isinstance(msg, StopMsg):
        header["kind"] = KIND_STOP
        header["reason"] = msg.reason
        arrays = []
    else:
        _fail(f"cannot encode {type(msg).__name__}")
    frames: list[bytes | memoryview] = []
    descs = []
    for name, value in arrays:
        desc, frame = _array_frame(name, value)
        descs.append(desc)
        frames.append(frame)
    header["arrays"] = descs
    _parse_header(header)
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        _fail(f"header is {len(packed)} bytes > {MAX_HEADER_BYTES}")
    return [packed, *frames]


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def _as_bytes_view(frame: Any) -> memoryview:
    """A flat unsigned-byte view of any buffer (bytes, memoryview, zmq.Frame, numpy array)."""
    mv = memoryview(frame)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _load(frames: Sequence[Any]) -> Message:
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        _fail("expected a sequence of frames, got a single buffer")
    views = [_as_bytes_view(f) for f in frames]
    if not views:
        _fail("empty message")
    if views[0].nbytes > MAX_HEADER_BYTES:
        _fail(f"header frame is {views[0].nbytes} bytes > {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(views[0], ext_hook=_reject_ext, **_UNPACK_LIMITS)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types (ExtraData, FormatError, ...)
        _fail(f"header is not valid msgpack ({type(exc).__name__})")
    kind, descs = _parse_header(header)
    if len(views) != 1 + len(descs):
        _fail(f"{kind} header describes {len(descs)} arrays but {len(views) - 1} array frames came")
    arrays: list[np.ndarray] = []
    for d, view in zip(descs, views[1:], strict=True):
        if view.nbytes != d.nbytes:
            _fail(f"array {d.name!r}: frame is {view.nbytes} bytes, descriptor says {d.nbytes}")
        arrays.append(np.frombuffer(view, dtype=_LE_DTYPES[d.dtype]).reshape(d.shape))
    if kind == KIND_SAMPLES:
        return SamplesMsg(
            actor_id=header["actor_id"],
            seq=header["seq"],
            weights_version=header["weights_version"],
            batch=TransitionBatch(*arrays[:5]),
            episodes=_episodes(header["episodes"]),
            priorities=arrays[5] if len(arrays) > 5 else None,
        )
    if kind == KIND_WEIGHTS:
        named = {d.name: a for d, a in zip(descs, arrays, strict=True)}
        fingerprint = _fingerprint(header["fingerprint"]) if "fingerprint" in header else None
        return WeightsMsg(
            weights=Weights(header["version"], named),
            agent=header["agent"],
            fingerprint=fingerprint,
            env_steps=header.get("env_steps"),
        )
    if kind == KIND_HEARTBEAT:
        return HeartbeatMsg(
            role=header["role"],
            id=header["id"],
            pid=header["pid"],
            time=float(header["time"]),
            state=header["state"],
            counters=header["counters"],
            info=header["info"],
        )
    return StopMsg(reason=header["reason"])


def load(frames: Sequence[Any]) -> Message:
    """Decode and structurally validate a message of any kind.

    Accepts any objects supporting the buffer protocol as frames. Returned arrays may be
    read-only zero-copy views of the frames (possibly unaligned); consumers that keep or modify
    them must copy. Raises WireError, and only WireError, for anything malformed.
    """
    try:
        return _load(frames)
    except WireError:
        raise
    except Exception as exc:  # belt and braces: no foreign input may raise anything else
        raise WireError(f"malformed message ({type(exc).__name__})") from exc


def _check_finite(arr: np.ndarray, what: str) -> None:
    if not np.isfinite(arr).all():
        _fail(f"{what} contains NaN or infinity")


def _check_bool_bytes(arr: np.ndarray, what: str) -> None:
    """numpy would read any non-zero byte as True; the wire allows only 0 and 1."""
    if arr.size and arr.view(np.uint8).max() > 1:
        _fail(f"{what} has bool bytes other than 0 and 1")


def _check_content(arr: np.ndarray, what: str) -> None:
    kind = arr.dtype.kind
    if kind == "f":
        _check_finite(arr, what)
    elif kind == "b":
        _check_bool_bytes(arr, what)


def _validate_samples(msg: Any, spec: SampleSpec) -> None:
    if not isinstance(msg, SamplesMsg):
        _fail(f"expected a samples message, got {type(msg).__name__}")
    for what in ("actor_id", "seq", "weights_version"):
        _py_int(getattr(msg, what), what)
    cols: list[np.ndarray] = []
    for name in BATCH_FIELDS:
        col = getattr(msg.batch, name, None)
        if not isinstance(col, np.ndarray):
            _fail(f"samples column {name!r} is not a numpy array")
        cols.append(col)
    obs, action, reward, next_obs, discount = cols
    if reward.ndim != 1:
        _fail(f"reward must have shape (B,), got {reward.shape}")
    n = reward.shape[0]
    if not 1 <= n <= spec.max_batch:
        _fail(f"batch size {n} outside [1, {spec.max_batch}]")
    want = (
        ("obs", obs, (n, *spec.obs_shape), spec.obs_dtype),
        ("action", action, (n, *spec.action_shape), spec.action_dtype),
        ("reward", reward, (n,), "float32"),
        ("next_obs", next_obs, (n, *spec.obs_shape), spec.obs_dtype),
        ("discount", discount, (n,), "float32"),
    )
    for name, col, shape, dtype in want:
        if col.shape != shape or col.dtype.name != dtype:
            _fail(f"{name} is {col.dtype.name} {col.shape}, expected {dtype} {shape}")
    _check_finite(reward, "reward")
    # min/max propagate NaN and a NaN comparison is False, so this also rejects NaN and inf.
    if not (discount.min() >= 0.0 and discount.max() <= 1.0):
        _fail("discount outside [0, 1]")
    priorities = getattr(msg, "priorities", None)
    if priorities is not None:
        shaped = isinstance(priorities, np.ndarray) and priorities.shape == (n,)
        if not shaped or priorities.dtype.name != "float32":
            _fail(f"priority must be float32 of shape ({n},)")
        if not (priorities.min() >= 0.0 and priorities.max() < math.inf):
            _fail("priority must be finite and >= 0")
    _check_content(obs, "obs")
    _check_content(next_obs, "next_obs")
    if action.dtype.kind in "iu" and spec.num_actions is not None:
        if not (action.min() >= 0 and action.max() < spec.num_actions):
            _fail(f"action outside [0, {spec.num_actions})")
    else:
        _check_content(action, "action")
        if spec.action_low is not None and spec.action_high is not None:
            _check_action_bounds(action, spec)
    if len(msg.episodes) > MAX_EPISODES:
        _fail(f"too many episodes: {len(msg.episodes)} > {MAX_EPISODES}")
    for ep in msg.episodes:
        ret, length = ep
        if isinstance(ret, (bool, np.bool_)) or not isinstance(ret, (int, float, np.number)):
            _fail(f"episode return must be a number, got {_short(ret)}")
        if not math.isfinite(ret):
            _fail("episode return must be finite")
        if _py_int(length, "episode length") < 0:
            _fail("episode length must be >= 0")


def _check_action_bounds(action: np.ndarray, spec: SampleSpec) -> None:
    """Every row within [low, high] up to ACTION_BOUND_TOLERANCE (actions are already finite).

    The margin scales with each bound's magnitude (at least 1), and an infinite bound stays
    infinite, so one side of a half-bounded dimension is still checked.
    """
    low = np.asarray(spec.action_low, dtype=np.float64).reshape(spec.action_shape)
    high = np.asarray(spec.action_high, dtype=np.float64).reshape(spec.action_shape)
    slack_low = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(low))
    slack_high = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(high))
    if not ((action >= low - slack_low).all() and (action <= high + slack_high).all()):
        _fail("continuous action outside the action space's bounds")


def validate_samples(msg: SamplesMsg, spec: SampleSpec) -> None:
    """Check a samples message against the run's spec, contents included; raise WireError if bad.

    Works on locally built messages too (the actor may self-check before its first send). Float
    checks are vectorised: this runs once per received batch on the learner.
    """
    try:
        _validate_samples(msg, spec)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"invalid samples message ({type(exc).__name__})") from exc


def load_samples(frames: Sequence[Any], spec: SampleSpec) -> SamplesMsg:
    """Decode a message that must be samples and must fit ``spec``; raise WireError otherwise."""
    msg = load(frames)
    if not isinstance(msg, SamplesMsg):
        _fail(f"expected a samples message, got {_kind_of(msg)}")
    validate_samples(msg, spec)
    return msg


def _kind_of(msg: Message) -> str:
    return {SamplesMsg: KIND_SAMPLES, WeightsMsg: KIND_WEIGHTS, HeartbeatMsg: KIND_HEARTBEAT}.get(
        type(msg), KIND_STOP
    )


def _check_weights(msg: WeightsMsg, reference: Mapping[str, tuple[tuple[int, ...], str]] | None) -> None:
    arrays = msg.weights.arrays
    if reference is not None:
        missing = [k for k in reference if k not in arrays]
        extra = [k for k in arrays if k not in reference]
        if missing or extra:
            _fail(f"weights names differ from reference: missing {missing[:8]}, unexpected {extra[:8]}")
        for name, (shape, dtype) in reference.items():
            want_shape = tuple(int(d) for d in shape)
            want_dtype = np.dtype(dtype).name
            arr = arrays[name]
            if arr.shape != want_shape or arr.dtype.name != want_dtype:
                _fail(f"weights {name!r} is {arr.dtype.name} {arr.shape}, expected {want_dtype} {want_shape}")
    for name, arr in arrays.items():
        _check_content(arr, f"weights {name!r}")


def load_weights(
    frames: Sequence[Any], reference: Mapping[str, tuple[tuple[int, ...], str]] | None = None
) -> WeightsMsg:
    """Decode a message that must be weights, with finite float parameters.

    ``reference`` maps parameter name -> (shape, dtype) of the receiver's network; when given,
    names, shapes and dtypes must match exactly, so a learner of another architecture (or a
    stale run on the same port) cannot load garbage into an actor.
    """
    msg = load(frames)
    if not isinstance(msg, WeightsMsg):
        _fail(f"expected a weights message, got {_kind_of(msg)}")
    validate_weights(msg, reference)
    return msg


def validate_weights(
    msg: WeightsMsg, reference: Mapping[str, tuple[tuple[int, ...], str]] | None = None
) -> None:
    """The content half of :func:`load_weights`, for a message already decoded by :func:`load`
    (the actor checks the fingerprint in between, so a mismatched network is named, not dropped)."""
    try:
        _check_weights(msg, reference)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"invalid weights message ({type(exc).__name__})") from exc
