"""The zmqrl wire format: pure encode/decode of the six message kinds, no sockets.

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
  byte, kind-specific header fields typed and bounded, sample and rollout columns named and aligned.
  It never scans array contents.
* :func:`load_samples` / :func:`load_weights` add *content* checks (finite floats, discount range,
  action range, shapes against the run's spec or the receiver's network). Receivers of data
  should always use these; plain :func:`load` is for heartbeats and control.

Experience travels as one of three kinds, each decoded to a :class:`SamplesMsg`: ``"samples"``
(n-step transitions, a ``TransitionBatch``), ``"rollouts"`` (fixed-length on-policy rollouts, a
``RolloutBatch``) and ``"sequences"`` (R2D2's windows with their core state, a ``SequenceBatch``);
:func:`dump` picks the kind from the batch's type, and :func:`load_samples` refuses those the run's
spec does not train on.

Where the pieces live: the message dataclasses, version and kinds in :mod:`zmqrl.transport.messages`,
limits and field checks in :mod:`zmqrl.transport.fields`; the decoder (frames, headers, and samples
and rollouts from their frames to checked rows) in :mod:`zmqrl.transport.decoding`, what it checks
once per layout in :mod:`zmqrl.transport.layouts`, the other kinds' header fields in
:mod:`zmqrl.transport.header`, a weights message's contents in :mod:`zmqrl.transport.array_checks`.
This module encodes messages, decodes the other kinds and re-exports what users need, so ``from
zmqrl.transport import wire`` stays the one import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from zmqrl.spec import ALLOWED_DTYPES
from zmqrl.transport.array_checks import validate_weights
from zmqrl.transport.decoding import (
    ACTION_BOUND_TOLERANCE,
    load_samples,
    parse_episodes,
    parse_header,
    unframe,
    validate_content,
    validate_per_message,
    validate_samples,
    validate_structure,
)
from zmqrl.transport.fields import (
    LE_DTYPES,
    MAX_ARRAYS,
    MAX_EPISODES,
    MAX_HEADER_BYTES,
    MAX_MAP_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_STRING,
    fail,
    py_int,
    py_number,
)
from zmqrl.transport.header import MAX_FINGERPRINT_ENTRIES, MAX_FINGERPRINT_LIST
from zmqrl.transport.messages import (
    KIND_HEARTBEAT,
    KIND_ROLLOUTS,
    KIND_SAMPLES,
    KIND_SEQUENCES,
    KIND_STOP,
    KIND_WEIGHTS,
    PRIORITY_FIELD,
    PROTO_VERSION,
    Fingerprint,
    FingerprintScalar,
    FingerprintValue,
    HeartbeatMsg,
    Message,
    SamplesMsg,
    StopMsg,
    WeightsMsg,
    WireError,
)
from zmqrl.transport.record_columns import split
from zmqrl.types import (
    BATCH_FIELDS,
    CORE_STATE_FIELD,
    ROLLOUT_FIELDS,
    SEQUENCE_FIELDS,
    Batch,
    RolloutBatch,
    SequenceBatch,
    TransitionBatch,
    Weights,
)

# The public names of the wire format, wherever they are defined.
__all__ = [
    "ACTION_BOUND_TOLERANCE",
    "KIND_HEARTBEAT",
    "KIND_ROLLOUTS",
    "KIND_SAMPLES",
    "KIND_SEQUENCES",
    "KIND_STOP",
    "KIND_WEIGHTS",
    "MAX_ARRAYS",
    "MAX_EPISODES",
    "MAX_FINGERPRINT_ENTRIES",
    "MAX_FINGERPRINT_LIST",
    "MAX_HEADER_BYTES",
    "MAX_MAP_ENTRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_STRING",
    "PRIORITY_FIELD",
    "PROTO_VERSION",
    "Fingerprint",
    "FingerprintScalar",
    "FingerprintValue",
    "HeartbeatMsg",
    "Message",
    "SamplesMsg",
    "StopMsg",
    "WeightsMsg",
    "WireError",
    "dump",
    "load",
    "load_samples",
    "load_weights",
    "validate_content",
    "validate_per_message",
    "validate_samples",
    "validate_structure",
    "validate_weights",
]


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


# Fingerprint values of these exact types go to msgpack as they are.
_BUILTIN_SCALARS = frozenset((str, int, float, bool))


def _dump_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """Builtin scalars (numpy scalars converted, tuples as lists) for msgpack; validated by dump.

    Runs on every publish: values that are builtin scalars already (all of ``run_fingerprint``'s)
    are passed on after one type test."""
    return {k: v if type(v) in _BUILTIN_SCALARS else _dump_value(v) for k, v in fingerprint.items()}


def _dump_value(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_dump_scalar(x) for x in v]
    return _dump_scalar(v)


def _dump_scalar(v: Any) -> Any:
    if type(v) not in _BUILTIN_SCALARS and isinstance(v, (np.bool_, np.integer, np.floating)):
        return v.item()
    return v


# An allowed dtype -> its wire name and little-endian dtype (``dtype.name`` is a Python-level
# property of numpy's, paid per array of every message sent; a process meets a handful of dtypes).
_FRAME_DTYPES: dict[np.dtype[Any], tuple[str, np.dtype[Any]]] = {}


def _array_frame(name: str, value: Any) -> tuple[dict[str, Any], memoryview]:
    """Descriptor plus a zero-copy byte view of ``value`` as little-endian C order.

    Copies only when the array is not already little-endian and C-contiguous. The returned view
    aliases the caller's array, so it must not be mutated until ZeroMQ has sent the frame.
    """
    arr = np.asarray(value)
    known = _FRAME_DTYPES.get(arr.dtype)
    if known is None:
        dtype = arr.dtype.name
        if dtype not in ALLOWED_DTYPES:
            fail(f"array {name!r}: dtype {dtype} not allowed (allowed: {sorted(ALLOWED_DTYPES)})")
        known = _FRAME_DTYPES[arr.dtype] = (dtype, LE_DTYPES[dtype])
    dtype, le = known
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
        rollouts = isinstance(msg.batch, RolloutBatch)
        sequences = isinstance(msg.batch, SequenceBatch)
        header["kind"] = KIND_SEQUENCES if sequences else KIND_ROLLOUTS if rollouts else KIND_SAMPLES
        header["actor_id"] = py_int(msg.actor_id, "actor_id")
        header["seq"] = py_int(msg.seq, "seq")
        header["weights_version"] = py_int(msg.weights_version, "weights_version")
        episodes = []
        for ep in msg.episodes:
            ret, length = ep
            episodes.append([float(py_number(ret, "episode return")), py_int(length, "episode length")])
        header["episodes"] = episodes
        fields = SEQUENCE_FIELDS if sequences else ROLLOUT_FIELDS if rollouts else BATCH_FIELDS
        arrays = [part for name in fields for part in split(name, getattr(msg.batch, name))]
        state = msg.batch.core_state if isinstance(msg.batch, RolloutBatch) else None
        if state is not None:  # a recurrent run's: after the columns
            arrays.append((CORE_STATE_FIELD, state))
        if msg.priorities is not None:
            if rollouts or sequences:
                fail(f"{header['kind']} carry no priorities")
            arrays.append((PRIORITY_FIELD, msg.priorities))
    elif isinstance(msg, WeightsMsg):
        header["kind"] = KIND_WEIGHTS
        header["version"] = py_int(msg.weights.version, "version")
        header["agent"] = msg.agent
        if msg.fingerprint is not None:
            header["fingerprint"] = _dump_fingerprint(msg.fingerprint)
        if msg.env_steps is not None:
            header["env_steps"] = py_int(msg.env_steps, "env_steps")
        arrays = list(msg.weights.arrays.items())
    elif isinstance(msg, HeartbeatMsg):
        header["kind"] = KIND_HEARTBEAT
        header.update(role=msg.role, state=msg.state, info=dict(msg.info))
        header["id"] = py_int(msg.id, "id")
        header["pid"] = py_int(msg.pid, "pid")
        header["time"] = float(py_number(msg.time, "time"))
        header["counters"] = {k: py_number(v, f"counter {k!r}") for k, v in msg.counters.items()}
        arrays = []
    elif isinstance(msg, StopMsg):
        header["kind"] = KIND_STOP
        header["reason"] = msg.reason
        arrays = []
    else:
        fail(f"cannot encode {type(msg).__name__}")
    frames: list[bytes | memoryview] = []
    descs = []
    for name, value in arrays:
        desc, frame = _array_frame(name, value)
        descs.append(desc)
        frames.append(frame)
    header["arrays"] = descs
    parse_header(header)
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        fail(f"header is {len(packed)} bytes > {MAX_HEADER_BYTES}")
    return [packed, *frames]


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def _load(frames: Sequence[Any]) -> Message:
    header, kind, descs, arrays = unframe(frames)
    if kind in (KIND_SAMPLES, KIND_ROLLOUTS, KIND_SEQUENCES):
        transitions = kind == KIND_SAMPLES  # parse_header checked the column names of each
        batch: Batch = (
            TransitionBatch(*arrays[:5])
            if transitions
            else SequenceBatch(*arrays)
            if kind == KIND_SEQUENCES
            else RolloutBatch(*arrays)
        )
        return SamplesMsg(
            actor_id=header["actor_id"],
            seq=header["seq"],
            weights_version=header["weights_version"],
            batch=batch,
            episodes=parse_episodes(header["episodes"]),
            priorities=arrays[5] if transitions and len(arrays) > 5 else None,
        )
    if kind == KIND_WEIGHTS:
        named = {d.name: a for d, a in zip(descs, arrays, strict=True)}
        # parse_header has checked the map with parse_fingerprint, whose result holds the very
        # same keys and values: parsing it a second time per message bought nothing.
        return WeightsMsg(
            weights=Weights(header["version"], named),
            agent=header["agent"],
            fingerprint=header.get("fingerprint"),
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


def _kind_of(msg: Message) -> str:
    if isinstance(msg, SamplesMsg):
        if isinstance(msg.batch, SequenceBatch):
            return KIND_SEQUENCES
        return KIND_ROLLOUTS if isinstance(msg.batch, RolloutBatch) else KIND_SAMPLES
    return {WeightsMsg: KIND_WEIGHTS, HeartbeatMsg: KIND_HEARTBEAT}.get(type(msg), KIND_STOP)


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
        fail(f"expected a weights message, got {_kind_of(msg)}")
    validate_weights(msg, reference)
    return msg
