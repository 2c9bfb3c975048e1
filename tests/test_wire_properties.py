"""Property tests of every decoder: whatever arrives, the result is a fully valid message or a WireError.

``tests/test_wire.py`` pins individual rules with hand-written cases; here hypothesis generates the
input instead: arbitrary frame lists, and valid messages of every kind with exactly one random
mutation applied (a flipped byte, a dropped/duplicated/truncated/extended/swapped frame, a header
field replaced by a random msgpack value, a non-finite reward, an out-of-range action, a changed
dtype or shape string, ...). For each decoder the property is the same:

* it returns a message that re-validates and satisfies every invariant the decoder promises
  (checked here independently of ``wire.py``'s own checks: continuous actions within the spec's
  bounds, a weights fingerprint flat and bounded, ...), or
* it raises ``WireError``; any other exception fails the test.

Valid messages also round-trip through ``dump``/``load`` bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from zmqrl.spec import ALLOWED_DTYPES, MAX_NDIM, SampleSpec
from zmqrl.transport.wire import (
    ACTION_BOUND_TOLERANCE,
    MAX_EPISODES,
    MAX_FINGERPRINT_ENTRIES,
    MAX_FINGERPRINT_LIST,
    MAX_STRING,
    HeartbeatMsg,
    Message,
    SamplesMsg,
    StopMsg,
    WeightsMsg,
    WireError,
    dump,
    load,
    load_samples,
    load_weights,
    validate_samples,
)
from zmqrl.types import BATCH_FIELDS, EpisodeStat, TransitionBatch, Weights

Frames = list[bytes]
Reference = dict[str, tuple[tuple[int, ...], str]]

PROPERTY = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROUND_TRIP = settings(PROPERTY, max_examples=200)

CARTPOLE = SampleSpec(
    obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2
)
# Atari's (4, 84, 84) stacked uint8 frames, shrunk so examples stay fast.
ATARI_ISH = SampleSpec(
    obs_shape=(4, 6, 5), obs_dtype="uint8", action_shape=(), action_dtype="int64", num_actions=6, max_batch=8
)
# Continuous actions without bounds: the action column is float and must only be finite.
CONTINUOUS = SampleSpec(obs_shape=(3,), obs_dtype="float32", action_shape=(2,), action_dtype="float32")
# Continuous actions with per-dimension bounds (one of them half-open), as sample_spec builds from a Box.
BOUNDED = SampleSpec(
    obs_shape=(3,),
    obs_dtype="float32",
    action_shape=(3,),
    action_dtype="float32",
    action_low=(-2.0, 0.0, -math.inf),
    action_high=(2.0, 1.0, 10.0),
)
SPECS = (CARTPOLE, ATARI_ISH, CONTINUOUS, BOUNDED)

INT64_MAX = 2**63 - 1
UINT = st.integers(0, INT64_MAX)
# Frame positions of the sample columns (frame 0 is the header).
FRAME_OF = {name: i + 1 for i, name in enumerate(BATCH_FIELDS)}

# ---------------------------------------------------------------------------------------------
# Strategies: random msgpack values and valid messages of every kind
# ---------------------------------------------------------------------------------------------

MSGPACK_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),  # NaN and infinities included
    st.text(max_size=12),
    st.binary(max_size=12),
)
MSGPACK_VALUES = st.recursive(
    MSGPACK_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def packed(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def finite(dtype: str) -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, allow_infinity=False, width=32 if dtype == "float32" else 64)


def elements_of(dtype: str) -> st.SearchStrategy[Any]:
    """Every value an array of ``dtype`` may legally carry (floats: any finite value)."""
    if dtype.startswith("float"):
        return finite(dtype)
    if dtype == "bool":
        return st.booleans()
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


@st.composite
def sample_messages(draw: st.DrawFn, spec: SampleSpec) -> SamplesMsg:
    """A samples message that satisfies ``spec`` in every respect, edge values included."""
    n = draw(st.integers(1, min(6, spec.max_batch)))

    def column(dtype: str, shape: tuple[int, ...], elements: st.SearchStrategy[Any]) -> np.ndarray:
        return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))

    obs_shape = (n, *spec.obs_shape)
    if spec.num_actions is not None:
        action = column(spec.action_dtype, (n, *spec.action_shape), st.integers(0, spec.num_actions - 1))
    elif spec.action_low is not None and spec.action_high is not None:  # each dimension in its own bounds
        dims = [
            column("float32", (n,), in_bounds(lo, hi))
            for lo, hi in zip(bounds(spec.action_low), bounds(spec.action_high), strict=True)
        ]
        action = np.stack(dims, axis=1).reshape(n, *spec.action_shape)
    else:
        action = column(spec.action_dtype, (n, *spec.action_shape), finite(spec.action_dtype))
    reward_limit = float(np.float32(spec.max_abs_reward))  # exact in float32 for the specs drawn
    batch = TransitionBatch(
        obs=column(spec.obs_dtype, obs_shape, observations(spec)),
        action=action,
        reward=column("float32", (n,), st.floats(-reward_limit, reward_limit, width=32)),
        next_obs=column(spec.obs_dtype, obs_shape, observations(spec)),
        discount=column("float32", (n,), st.floats(0.0, spec.max_discount, width=32)),
    )
    returns = st.floats(-spec.max_abs_reward, spec.max_abs_reward)  # within the limit x any length
    episodes = draw(st.lists(st.builds(EpisodeStat, returns, UINT), max_size=3))
    return SamplesMsg(draw(UINT), draw(UINT), draw(UINT), batch, episodes)


def observations(spec: SampleSpec) -> st.SearchStrategy[Any]:
    """Every value an observation of ``spec`` may carry: its dtype's, within the spec's limits
    (the widest of them, for specs whose components differ: the draws here have one limit)."""
    limits = spec.obs_limits()
    if limits is None:
        return elements_of(spec.obs_dtype)
    low, high = (x.item() for x in (limits[0].min(), limits[1].max()))
    if spec.obs_dtype.startswith("float"):
        return st.floats(low, high, width=32 if spec.obs_dtype == "float32" else 64)
    return st.integers(int(low), int(high))


def bounds(value: float | tuple[float, ...] | None) -> tuple[float, ...]:
    assert value is not None
    return value if isinstance(value, tuple) else (value,)


def in_bounds(lo: float, hi: float) -> st.SearchStrategy[float]:
    """float32 values in [lo, hi], the bounds themselves included (an infinite side: any finite)."""
    return st.floats(
        None if math.isinf(lo) else lo,
        None if math.isinf(hi) else hi,
        allow_nan=False,
        allow_infinity=False,
        width=32,
    )


FINGERPRINT_SCALARS = st.one_of(
    st.text(max_size=MAX_STRING), st.integers(-(2**63), INT64_MAX), finite("float64"), st.booleans()
)
FINGERPRINTS = st.dictionaries(
    st.text(max_size=24),
    st.one_of(FINGERPRINT_SCALARS, st.lists(FINGERPRINT_SCALARS, max_size=MAX_FINGERPRINT_LIST)),
    max_size=8,
)


@st.composite
def weights_messages(draw: st.DrawFn) -> WeightsMsg:
    """A weights message with 0..4 arrays of any allowed dtype and small shapes (0-d and empty too)."""
    names = draw(st.lists(st.text(max_size=MAX_STRING), unique=True, max_size=4))
    arrays: dict[str, np.ndarray] = {}
    for name in names:
        dtype = draw(st.sampled_from(sorted(ALLOWED_DTYPES)))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
        arrays[name] = draw(hnp.arrays(np.dtype(dtype), shape, elements=elements_of(dtype)))
    fingerprint = draw(st.one_of(st.none(), FINGERPRINTS))
    return WeightsMsg(Weights(draw(UINT), arrays), agent=draw(st.text(max_size=16)), fingerprint=fingerprint)


NUMBERS = st.one_of(st.integers(-(2**63), INT64_MAX), finite("float64"))
SHORT_TEXT = st.text(max_size=24)
HEARTBEATS = st.builds(
    HeartbeatMsg,
    role=SHORT_TEXT,
    id=UINT,
    pid=UINT,
    time=finite("float64"),
    state=SHORT_TEXT,
    counters=st.dictionaries(SHORT_TEXT, NUMBERS, max_size=5),
    info=st.dictionaries(SHORT_TEXT, SHORT_TEXT, max_size=5),
)
STOPS = st.builds(StopMsg, reason=st.text(max_size=MAX_STRING))


def frames_of(msg: Message) -> Frames:
    """What a receiver gets: every frame of ``dump(msg)`` copied into its own bytes object."""
    return [bytes(f) for f in dump(msg)]


def reference_of(msg: WeightsMsg) -> Reference:
    return {name: (arr.shape, arr.dtype.name) for name, arr in msg.weights.arrays.items()}


# ---------------------------------------------------------------------------------------------
# Independent checks of what a decoder may return
# ---------------------------------------------------------------------------------------------


def assert_uint(value: Any, what: str) -> None:
    assert type(value) is int and 0 <= value <= INT64_MAX, f"{what} = {value!r}"


def assert_string(value: Any, what: str) -> None:
    assert type(value) is str and len(value) <= MAX_STRING, f"{what} = {value!r}"


def assert_number(value: Any, what: str) -> None:
    assert type(value) in (int, float) and math.isfinite(value), f"{what} = {value!r}"


def assert_array_content_legal(arr: np.ndarray, what: str) -> None:
    """What every array on the wire must satisfy once content-checked: an allowed dtype, a legal
    rank, finite floats, and bools stored as 0 or 1."""
    assert isinstance(arr, np.ndarray), what
    assert arr.dtype.name in ALLOWED_DTYPES and arr.ndim <= MAX_NDIM, f"{what}: {arr.dtype} {arr.shape}"
    if arr.dtype.kind == "f":
        assert np.isfinite(arr).all(), f"{what} has a non-finite value"
    if arr.dtype.kind == "b":
        assert arr.size == 0 or arr.view(np.uint8).max() <= 1, f"{what} has a bool byte > 1"


def assert_same_message(a: Message, b: Message) -> None:
    """Equal kind, header fields and arrays (dtype, shape and every byte)."""
    assert type(a) is type(b)
    if isinstance(a, SamplesMsg):
        assert isinstance(b, SamplesMsg)
        assert (a.actor_id, a.seq, a.weights_version) == (b.actor_id, b.seq, b.weights_version)
        assert [tuple(e) for e in a.episodes] == [tuple(e) for e in b.episodes]
        for name in BATCH_FIELDS:
            assert_same_array(getattr(a.batch, name), getattr(b.batch, name), name)
    elif isinstance(a, WeightsMsg):
        assert isinstance(b, WeightsMsg)
        assert (a.weights.version, a.agent) == (b.weights.version, b.agent)
        assert same_fingerprint(a.fingerprint, b.fingerprint), f"{a.fingerprint} != {b.fingerprint}"
        assert list(a.weights.arrays) == list(b.weights.arrays), "names or their order changed"
        for name, arr in a.weights.arrays.items():
            assert_same_array(arr, b.weights.arrays[name], name)
    else:
        assert a == b
        if isinstance(a, HeartbeatMsg):  # 3 and 3.0 compare equal; the wire must keep them apart
            assert isinstance(b, HeartbeatMsg)
            assert {k: type(v) for k, v in a.counters.items()} == {k: type(v) for k, v in b.counters.items()}


def same_fingerprint(a: Any, b: Any) -> bool:
    """Equal keys, values and value types (True is not 1, 3 is not 3.0 on the wire)."""
    if a is None or b is None:
        return a is b

    def typed(v: Any) -> Any:
        return [typed(x) for x in v] if isinstance(v, list) else (type(v), v)

    return {k: typed(v) for k, v in a.items()} == {k: typed(v) for k, v in b.items()}


def assert_same_array(x: Any, y: Any, what: str) -> None:
    x, y = np.asarray(x), np.asarray(y)
    assert (x.dtype, x.shape) == (y.dtype, y.shape), f"{what}: {x.dtype} {x.shape} != {y.dtype} {y.shape}"
    assert x.tobytes() == y.tobytes(), f"{what}: contents differ"


def assert_revalidates(msg: Message) -> None:
    """The message passes the sender's own header validation and survives another round trip."""
    again = load(frames_of(msg))
    assert_same_message(msg, again)


def assert_structurally_valid(msg: Message) -> None:
    """What plain ``load`` promises: well-typed header fields and aligned sample columns."""
    assert isinstance(msg, SamplesMsg | WeightsMsg | HeartbeatMsg | StopMsg)
    if isinstance(msg, SamplesMsg):
        for what in ("actor_id", "seq", "weights_version"):
            assert_uint(getattr(msg, what), what)
        assert len(msg.episodes) <= MAX_EPISODES
        for ret, length in msg.episodes:
            assert_number(ret, "episode return")
            assert_uint(length, "episode length")
        columns = [getattr(msg.batch, name) for name in BATCH_FIELDS]
        assert all(isinstance(c, np.ndarray) and c.ndim >= 1 for c in columns)
        assert len({c.shape[0] for c in columns}) == 1, "columns have different row counts"
        for col in (msg.batch.reward, msg.batch.discount):
            assert col.dtype == np.float32 and col.ndim == 1
    elif isinstance(msg, WeightsMsg):
        assert_uint(msg.weights.version, "version")
        assert_string(msg.agent, "agent")
        if msg.fingerprint is not None:
            assert_flat_fingerprint(msg.fingerprint)
    elif isinstance(msg, HeartbeatMsg):
        assert_string(msg.role, "role")
        assert_string(msg.state, "state")
        assert_uint(msg.id, "id")
        assert_uint(msg.pid, "pid")
        assert_number(msg.time, "time")
        for k, v in msg.counters.items():
            assert_string(k, "counter name")
            assert_number(v, f"counter {k!r}")
        for k, v in msg.info.items():
            assert_string(k, "info key")
            assert_string(v, f"info {k!r}")
    else:
        assert_string(msg.reason, "reason")
    for name, arr in arrays_of(msg).items():
        assert_string(name, "array name")
        assert arr.dtype.name in ALLOWED_DTYPES and arr.ndim <= MAX_NDIM
    assert_revalidates(msg)


def assert_flat_fingerprint(fingerprint: Any) -> None:
    """At most MAX_FINGERPRINT_ENTRIES string keys; values scalars or short lists of scalars."""
    assert type(fingerprint) is dict and len(fingerprint) <= MAX_FINGERPRINT_ENTRIES
    for key, value in fingerprint.items():
        assert_string(key, "fingerprint key")
        items = value if type(value) is list else [value]
        assert len(items) <= MAX_FINGERPRINT_LIST, f"fingerprint {key!r} list too long"
        for item in items:
            if type(item) is str:
                assert_string(item, f"fingerprint {key!r}")
            elif type(item) is not bool:
                assert_number(item, f"fingerprint {key!r}")


def arrays_of(msg: Message) -> dict[str, np.ndarray]:
    if isinstance(msg, SamplesMsg):
        return dict(zip(BATCH_FIELDS, msg.batch, strict=True))
    if isinstance(msg, WeightsMsg):
        return dict(msg.weights.arrays)
    return {}


def assert_satisfies_spec(msg: SamplesMsg, spec: SampleSpec) -> None:
    """Every invariant a learner relies on before a batch may enter replay."""
    assert_structurally_valid(msg)
    b = msg.batch
    n = b.reward.shape[0]
    assert 1 <= n <= spec.max_batch
    for name, shape, dtype in (
        ("obs", (n, *spec.obs_shape), spec.obs_dtype),
        ("action", (n, *spec.action_shape), spec.action_dtype),
        ("reward", (n,), "float32"),
        ("next_obs", (n, *spec.obs_shape), spec.obs_dtype),
        ("discount", (n,), "float32"),
    ):
        col = getattr(b, name)
        assert (col.shape, col.dtype.name) == (shape, dtype), f"{name}: {col.dtype} {col.shape}"
        assert_array_content_legal(col, name)
    assert ((b.discount >= 0.0) & (b.discount <= 1.0)).all(), "discount outside [0, 1]"
    if spec.num_actions is not None:
        assert ((b.action >= 0) & (b.action < spec.num_actions)).all(), "action out of range"
    if spec.action_low is not None and spec.action_high is not None:
        low = np.array(bounds(spec.action_low)).reshape(spec.action_shape)
        high = np.array(bounds(spec.action_high)).reshape(spec.action_shape)
        assert (b.action >= low - ACTION_BOUND_TOLERANCE * np.maximum(1, abs(low))).all(), "action < low"
        assert (b.action <= high + ACTION_BOUND_TOLERANCE * np.maximum(1, abs(high))).all(), "action > high"
    validate_samples(msg, spec)  # and wire.py's own validator agrees


def assert_valid_weights(msg: WeightsMsg, reference: Reference | None) -> None:
    assert_structurally_valid(msg)
    arrays = msg.weights.arrays
    for name, arr in arrays.items():
        assert_array_content_legal(arr, f"weights {name!r}")
    if reference is not None:
        assert set(arrays) == set(reference)
        for name, (shape, dtype) in reference.items():
            assert (arrays[name].shape, arrays[name].dtype.name) == (shape, dtype), name


def decoders(
    references: list[Reference],
) -> list[tuple[str, Callable[[Frames], Message], Callable[..., None]]]:
    """Every decoder, each with the check its successful result must pass."""
    out: list[tuple[str, Callable[[Frames], Message], Callable[..., None]]] = [
        ("load", load, assert_structurally_valid),
        ("load_weights()", load_weights, lambda m: assert_valid_weights(m, None)),
    ]
    for spec in SPECS:
        out.append(
            (f"load_samples({spec.obs_shape})", lambda f, s=spec: load_samples(f, s), _spec_check(spec))
        )
    for ref in references:
        out.append(
            (
                "load_weights(reference)",
                lambda f, r=ref: load_weights(f, r),
                lambda m, r=ref: assert_valid_weights(m, r),
            )
        )
    return out


def _spec_check(spec: SampleSpec) -> Callable[[SamplesMsg], None]:
    return lambda msg: assert_satisfies_spec(msg, spec)


def decode_everywhere(frames: Any, references: list[Reference] | None = None) -> int:
    """Run every decoder on ``frames``: each must raise WireError or return a message that passes
    that decoder's check. Returns how many decoders accepted the frames."""
    accepted = 0
    for name, decode, check in decoders(references or []):
        try:
            msg = decode(frames)
        except WireError:
            continue
        try:
            check(msg)
        except AssertionError as exc:
            raise AssertionError(f"{name} accepted an invalid message: {exc}") from exc
        accepted += 1
    return accepted


# ---------------------------------------------------------------------------------------------
# Mutations: exactly one change to a valid message's frames
# ---------------------------------------------------------------------------------------------

DTYPE_STRINGS = [*sorted(ALLOWED_DTYPES), "float16", "int8", "uint64", "<f4", "object", "", "f"]


def edit_header(frames: Frames, edit: Callable[[dict[str, Any]], None]) -> Frames:
    header = msgpack.unpackb(frames[0])
    edit(header)
    return [packed(header), *frames[1:]]


def edit_column(frames: Frames, name: str, edit: Callable[[np.ndarray], None]) -> Frames:
    """Rewrite the bytes of one sample column in place (the header is left as it was)."""
    header = msgpack.unpackb(frames[0])
    desc = header["arrays"][FRAME_OF[name] - 1]
    arr = np.frombuffer(frames[FRAME_OF[name]], dtype=np.dtype(desc["dtype"]).newbyteorder("<")).copy()
    edit(arr)
    out = list(frames)
    out[FRAME_OF[name]] = arr.tobytes()
    return out


def mutate_structure(data: st.DataObject, frames: Frames) -> Frames:
    """One change that any message kind can suffer, at the level of frames and bytes."""
    frames = list(frames)
    what = data.draw(
        st.sampled_from(["flip", "drop", "duplicate", "truncate", "extend", "swap"]), label="structure"
    )
    i = data.draw(st.integers(0, len(frames) - 1), label="frame")
    if what == "flip" and frames[i]:
        target = bytearray(frames[i])
        target[data.draw(st.integers(0, len(target) - 1), label="at")] ^= data.draw(st.integers(1, 255))
        frames[i] = bytes(target)
    elif what == "drop":
        del frames[i]
    elif what == "duplicate":
        frames.insert(data.draw(st.integers(0, len(frames)), label="to"), frames[i])
    elif what == "truncate" and frames[i]:
        frames[i] = frames[i][: data.draw(st.integers(0, len(frames[i]) - 1), label="keep")]
    elif what == "extend":
        frames[i] += data.draw(st.binary(min_size=1, max_size=16), label="tail")
    elif what == "swap" and len(frames) > 1:
        j = data.draw(st.integers(0, len(frames) - 1).filter(lambda j: j != i), label="with")
        frames[i], frames[j] = frames[j], frames[i]
    return frames


def mutate_header(data: st.DataObject, frames: Frames) -> Frames:
    """One header field (top level or inside an array descriptor) replaced, removed or added."""
    header = msgpack.unpackb(frames[0])
    paths: list[tuple[Any, ...]] = [(k,) for k in header]
    paths += [("arrays", i, k) for i, d in enumerate(header["arrays"]) for k in d]
    path = data.draw(st.sampled_from(paths), label="field")
    what = data.draw(st.sampled_from(["replace", "replace", "delete", "add"]), label="header edit")
    value = data.draw(MSGPACK_VALUES, label="value")

    def edit(h: dict[str, Any]) -> None:
        holder = h if len(path) == 1 else h["arrays"][path[1]]
        key = path[-1]
        if what == "replace":
            holder[key] = value
        elif what == "delete":
            del holder[key]
        else:
            holder[data.draw(st.text(max_size=8).filter(lambda k: k not in holder), label="new key")] = value

    return edit_header(frames, edit)


def mutate_descriptor(data: st.DataObject, frames: Frames) -> Frames:
    """A descriptor's dtype or shape changed (the frames stay as they were)."""
    header = msgpack.unpackb(frames[0])
    if not header["arrays"]:
        return frames
    i = data.draw(st.integers(0, len(header["arrays"]) - 1), label="descriptor")
    shape = list(header["arrays"][i]["shape"])
    choices: list[Any] = [
        ["dtype", data.draw(st.sampled_from(DTYPE_STRINGS), label="dtype")],
        ["shape", [*shape, data.draw(st.integers(0, 3), label="new dim")]],
        ["shape", shape[:-1]],
        ["shape", [-1, *shape]],
        ["shape", [2**28 + 1, *shape[1:]]],
        ["shape", [*shape[:-1], 1.0] if shape else [1.0]],
    ]
    if shape:
        d = data.draw(st.integers(0, len(shape) - 1), label="dim")
        grown = list(shape)
        grown[d] = max(0, grown[d] + data.draw(st.sampled_from([-1, 1, 2]), label="delta"))
        choices.append(["shape", grown])
    key, value = data.draw(st.sampled_from(choices), label="descriptor edit")

    def edit(h: dict[str, Any]) -> None:
        h["arrays"][i][key] = value

    return edit_header(frames, edit)


BAD_FLOATS = [math.nan, math.inf, -math.inf]
BAD_DISCOUNTS = [*BAD_FLOATS, -1e-7, -1.0, 1.0000001, 1.5, 1e30]


def mutate_samples_content(data: st.DataObject, frames: Frames, spec: SampleSpec) -> Frames:
    """One value a learner must never train on, written into a column's bytes."""
    header = msgpack.unpackb(frames[0])
    n = header["arrays"][0]["shape"][0]
    row = data.draw(st.integers(0, n - 1), label="row")
    choices = ["reward", "discount", "action"]
    if spec.obs_dtype.startswith("float"):
        choices += ["obs", "next_obs"]
    column = data.draw(st.sampled_from(choices), label="column")
    if column == "discount":
        bad: Any = data.draw(st.sampled_from(BAD_DISCOUNTS), label="value")
    elif column == "action" and spec.num_actions is not None:
        bad = data.draw(
            st.one_of(st.integers(spec.num_actions, INT64_MAX), st.integers(-(2**63), -1)), label="value"
        )
    else:
        bad = data.draw(st.sampled_from(BAD_FLOATS), label="value")
    per_row = int(np.prod(spec.action_shape)) if column == "action" else 0
    element = data.draw(st.integers(0, max(per_row, 1) - 1), label="element")
    if column == "action" and spec.action_low is not None and data.draw(st.booleans(), label="out of bounds"):
        bad = beyond_bounds(data, bounds(spec.action_low)[element], bounds(spec.action_high)[element])

    def edit(arr: np.ndarray) -> None:
        width = arr.size // n
        at = element if column == "action" else data.draw(st.integers(0, width - 1), label="element")
        arr[row * width + at] = bad

    return edit_column(frames, column, edit)


def beyond_bounds(data: st.DataObject, lo: float, hi: float) -> float:
    """A finite float32 just past (or far past) a finite side of [lo, hi], beyond the tolerance."""
    sides = [(b, sign) for b, sign in ((lo, -1.0), (hi, 1.0)) if math.isfinite(b)]
    bound, sign = data.draw(st.sampled_from(sides), label="side")
    margin = 2 * ACTION_BOUND_TOLERANCE * max(1.0, abs(bound))
    return float(np.float32(bound + sign * data.draw(st.sampled_from([margin, 1.0, 1e30]), label="past")))


def mutate_weights_content(data: st.DataObject, frames: Frames) -> Frames:
    """A non-finite parameter, or a bool stored as a byte other than 0 and 1."""
    header = msgpack.unpackb(frames[0])
    targets = [
        i
        for i, d in enumerate(header["arrays"])
        if d["dtype"] in ("float32", "float64", "bool") and len(frames[i + 1])
    ]
    if not targets:
        return frames
    i = data.draw(st.sampled_from(targets), label="array")
    dtype = np.dtype(header["arrays"][i]["dtype"]).newbyteorder("<")
    arr = np.frombuffer(frames[i + 1], dtype=dtype).copy()
    at = data.draw(st.integers(0, arr.size - 1), label="element")
    if dtype.kind == "b":
        arr.view(np.uint8)[at] = data.draw(st.integers(2, 255), label="byte")
    else:
        arr[at] = data.draw(st.sampled_from(BAD_FLOATS), label="value")
    out = list(frames)
    out[i + 1] = arr.tobytes()
    return out


def mutate_any(data: st.DataObject, frames: Frames, content: Callable[[], Frames] | None = None) -> Frames:
    families = ["structure", "header", "descriptor"] + (["content", "content"] if content else [])
    family = data.draw(st.sampled_from(families), label="mutation")
    if family == "structure":
        return mutate_structure(data, frames)
    if family == "header":
        return mutate_header(data, frames)
    if family == "descriptor":
        return mutate_descriptor(data, frames)
    assert content is not None
    return content()


# ---------------------------------------------------------------------------------------------
# (a) Arbitrary frame lists
# ---------------------------------------------------------------------------------------------

HEADER_FIELDS = ["actor_id", "seq", "weights_version", "episodes", "version", "agent", "role", "id", "pid"]
HEADER_FIELDS += ["time", "state", "counters", "info", "reason", "fingerprint"]
DESCRIPTOR_LIKE = st.fixed_dictionaries(
    {
        "name": st.sampled_from([*BATCH_FIELDS, "w", ""]),
        "dtype": st.sampled_from(DTYPE_STRINGS),
        "shape": st.lists(st.integers(-1, 4), max_size=3),
    }
)
HEADER_LIKE = st.builds(
    lambda base, extra: {**extra, **base},
    st.fixed_dictionaries(
        {
            "proto": st.one_of(st.just(1), MSGPACK_SCALARS),
            "kind": st.sampled_from(["samples", "weights", "heartbeat", "stop", "other"]),
            "arrays": st.lists(DESCRIPTOR_LIKE, max_size=5),
        }
    ),
    st.dictionaries(
        st.sampled_from([*HEADER_FIELDS, "extra"]),
        MSGPACK_VALUES,
    ),
)
ANY_FRAME = st.one_of(
    st.binary(max_size=64),
    MSGPACK_VALUES.map(packed),
    HEADER_LIKE.map(packed),
    st.binary(max_size=16).map(bytearray),
    st.binary(max_size=16).map(memoryview),
)


@PROPERTY
@given(st.lists(ANY_FRAME, max_size=7))
def test_arbitrary_frame_lists_decode_validly_or_raise_wire_error_in_every_decoder(frames: list[Any]) -> None:
    decode_everywhere(frames)


@PROPERTY
@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=8),
        st.binary(max_size=8),
        st.lists(
            st.one_of(st.none(), st.integers(), st.text(max_size=4), st.floats()), min_size=1, max_size=3
        ),
        st.dictionaries(st.text(max_size=4), st.binary(max_size=4), max_size=2),
    )
)
def test_things_that_are_not_frame_lists_raise_wire_error_in_every_decoder(frames: Any) -> None:
    assert decode_everywhere(frames) == 0


# ---------------------------------------------------------------------------------------------
# (b) Valid messages with one mutation
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(st.data())
def test_samples_with_one_mutation_decode_validly_or_raise_wire_error(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(SPECS), label="spec")
    frames = frames_of(data.draw(sample_messages(spec), label="message"))
    mutated = mutate_any(data, frames, lambda: mutate_samples_content(data, frames, spec))
    decode_everywhere(mutated)


@PROPERTY
@given(st.data())
def test_content_a_learner_must_not_train_on_is_always_refused(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(SPECS), label="spec")
    frames = mutate_samples_content(data, frames_of(data.draw(sample_messages(spec), label="message")), spec)
    try:
        load_samples(frames, spec)
    except WireError:
        return
    raise AssertionError("a non-finite reward/obs, bad discount or out-of-range action was accepted")


@PROPERTY
@given(st.data())
def test_weights_with_one_mutation_decode_validly_or_raise_wire_error(data: st.DataObject) -> None:
    msg = data.draw(weights_messages(), label="message")
    frames = frames_of(msg)
    mutated = mutate_any(data, frames, lambda: mutate_weights_content(data, frames))
    decode_everywhere(mutated, [reference_of(msg)])


@PROPERTY
@given(st.data())
def test_heartbeat_and_stop_with_one_mutation_decode_validly_or_raise_wire_error(data: st.DataObject) -> None:
    msg = data.draw(st.one_of(HEARTBEATS, STOPS), label="message")
    decode_everywhere(mutate_any(data, frames_of(msg)))


# ---------------------------------------------------------------------------------------------
# Round trips of valid messages are exact
# ---------------------------------------------------------------------------------------------


@ROUND_TRIP
@given(st.data())
def test_valid_samples_round_trip_exactly_through_every_samples_decoder(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(SPECS), label="spec")
    sent = data.draw(sample_messages(spec), label="message")
    frames = frames_of(sent)
    assert_same_message(sent, load(frames))
    got = load_samples(frames, spec)
    assert_same_message(sent, got)
    assert_satisfies_spec(got, spec)


@ROUND_TRIP
@given(weights_messages())
def test_valid_weights_round_trip_exactly_with_and_without_reference(sent: WeightsMsg) -> None:
    frames = frames_of(sent)
    assert_same_message(sent, load(frames))
    assert_same_message(sent, load_weights(frames))
    got = load_weights(frames, reference_of(sent))
    assert_same_message(sent, got)
    assert_valid_weights(got, reference_of(sent))


@ROUND_TRIP
@given(st.one_of(HEARTBEATS, STOPS))
def test_valid_heartbeats_and_stops_round_trip_exactly(sent: HeartbeatMsg | StopMsg) -> None:
    got = load(frames_of(sent))
    assert_same_message(sent, got)
    assert_structurally_valid(got)


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
def test_zero_dimensional_arrays_keep_their_shape_on_the_wire(dtype: str) -> None:
    # docs/protocol.md "Framing": "A 0-d array has one element" -- and must stay 0-d, or a receiver whose
    # network has a scalar parameter refuses every snapshot (shape () vs (1,)).
    sent = WeightsMsg(Weights(1, {"scalar": np.zeros((), dtype)}), agent="dqn")
    assert msgpack.unpackb(frames_of(sent)[0])["arrays"][0]["shape"] == []
    got = load_weights(frames_of(sent), {"scalar": ((), dtype)})
    assert got.weights.arrays["scalar"].shape == ()
