"""Behaviour of the wire format: what round-trips, and everything a receiver must refuse."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmqrl.spec import SampleSpec
from zmqrl.transport import array_checks, decoding, header, layouts, messages, wire
from zmqrl.transport.wire import (
    MAX_EPISODES,
    MAX_HEADER_BYTES,
    PROTO_VERSION,
    HeartbeatMsg,
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

Frames = list[Any]

CARTPOLE = SampleSpec(
    obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2
)
CONTINUOUS = SampleSpec(obs_shape=(3,), obs_dtype="float32", action_shape=(2,), action_dtype="float32")
PIXELS = SampleSpec(
    obs_shape=(8, 8, 3), obs_dtype="uint8", action_shape=(), action_dtype="int64", num_actions=6
)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def make_batch(spec: SampleSpec, n: int = 16, seed: int = 0) -> TransitionBatch:
    """A random batch that satisfies ``spec``."""
    rng = np.random.default_rng(seed)

    def obs() -> np.ndarray:
        shape = (n, *spec.obs_shape)
        if spec.obs_dtype == "uint8":
            return rng.integers(0, 256, shape, dtype=np.uint8)
        return rng.standard_normal(shape).astype(spec.obs_dtype)

    if spec.num_actions is not None:
        action = rng.integers(0, spec.num_actions, (n, *spec.action_shape), dtype=np.int64)
    else:
        action = rng.uniform(-1, 1, (n, *spec.action_shape)).astype(spec.action_dtype)
    reward = rng.standard_normal(n).astype(np.float32)
    discount = np.where(rng.random(n) < 0.1, 0.0, 0.99**3).astype(np.float32)
    return TransitionBatch(obs(), action, reward, obs(), discount)


def make_samples(spec: SampleSpec = CARTPOLE, n: int = 16, **batch_overrides: np.ndarray) -> SamplesMsg:
    batch = make_batch(spec, n)._replace(**batch_overrides)
    return SamplesMsg(
        actor_id=3,
        seq=41,
        weights_version=7,
        batch=batch,
        episodes=[EpisodeStat(21.5, 22), EpisodeStat(-3.0, 9)],
    )


def as_bytes(frames: Frames) -> list[bytes]:
    """What a receiver sees: every frame copied into its own bytes object."""
    return [bytes(f) for f in frames]


def header_of(frames: Frames) -> dict[str, Any]:
    return msgpack.unpackb(bytes(frames[0]))


def with_header(frames: Frames, edit: Callable[[dict[str, Any]], None]) -> list[bytes]:
    """Re-encode ``frames`` after applying ``edit`` to the decoded header."""
    header = header_of(frames)
    edit(header)
    return [msgpack.packb(header), *as_bytes(frames[1:])]


def samples_frames(spec: SampleSpec = CARTPOLE, **overrides: np.ndarray) -> list[bytes]:
    return as_bytes(dump(make_samples(spec, **overrides)))


def assert_batches_equal(a: TransitionBatch, b: TransitionBatch) -> None:
    for name in BATCH_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def heartbeat() -> HeartbeatMsg:
    return HeartbeatMsg(
        role="actor",
        id=2,
        pid=12345,
        time=1.7e9,
        state="running",
        counters={"env_steps": 1000, "sps": 812.5},
        info={"samples": "tcp://127.0.0.1:5555"},
    )


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [CARTPOLE, CONTINUOUS, PIXELS], ids=["discrete", "continuous", "uint8-obs"])
def test_samples_round_trip_keeps_every_column_dtype_and_shape(spec: SampleSpec) -> None:
    sent = make_samples(spec)
    got = load_samples(as_bytes(dump(sent)), spec)
    assert (got.actor_id, got.seq, got.weights_version) == (3, 41, 7)
    assert got.episodes == sent.episodes
    assert all(isinstance(e, EpisodeStat) for e in got.episodes)
    assert isinstance(got.batch, TransitionBatch)
    assert_batches_equal(got.batch, sent.batch)


def test_samples_header_is_documented_layout() -> None:
    header = header_of(dump(make_samples(n=4)))
    assert header["proto"] == PROTO_VERSION
    assert header["kind"] == "samples"
    assert header["episodes"] == [[21.5, 22], [-3.0, 9]]
    assert [d["name"] for d in header["arrays"]] == list(BATCH_FIELDS)
    assert header["arrays"][0] == {"name": "obs", "dtype": "float32", "shape": [4, 4]}
    assert header["arrays"][1] == {"name": "action", "dtype": "int64", "shape": [4]}


def test_weights_round_trip_keeps_names_order_and_dtypes() -> None:
    arrays = {
        "q.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "q.0.bias": np.zeros(3, dtype=np.float64),
        "steps": np.array(5, dtype=np.int64),  # 0-d
        "mask": np.array([True, False]),
    }
    got = load(as_bytes(dump(WeightsMsg(Weights(9, arrays), agent="dqn"))))
    assert isinstance(got, WeightsMsg)
    assert got.agent == "dqn" and got.weights.version == 9
    assert list(got.weights.arrays) == list(arrays)
    for name, arr in arrays.items():
        assert got.weights.arrays[name].dtype == arr.dtype
        np.testing.assert_array_equal(got.weights.arrays[name], arr)


def test_load_weights_accepts_matching_reference() -> None:
    arrays = {"w": np.ones((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    reference = {"w": ((2, 3), "float32"), "b": ((2,), "float32")}
    got = load_weights(as_bytes(dump(WeightsMsg(Weights(1, arrays), "dqn"))), reference)
    assert got.weights.version == 1


def test_heartbeat_and_stop_round_trip_as_single_frames() -> None:
    frames = dump(heartbeat())
    assert len(frames) == 1
    assert load(as_bytes(frames)) == heartbeat()
    frames = dump(StopMsg("max_updates reached"))
    assert len(frames) == 1
    assert load(as_bytes(frames)) == StopMsg("max_updates reached")


def test_heartbeat_counters_accept_numpy_scalars() -> None:
    msg = heartbeat()
    msg.counters = {"loss": np.float32(0.5), "updates": np.int64(3)}
    got = load(dump(msg))
    assert isinstance(got, HeartbeatMsg)
    assert got.counters == {"loss": 0.5, "updates": 3}
    assert type(got.counters["updates"]) is int


def test_dump_is_zero_copy_for_contiguous_little_endian_arrays() -> None:
    msg = make_samples()
    frames = dump(msg)
    assert all(isinstance(f, memoryview) for f in frames[1:])
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), msg.batch.obs)


def test_dump_converts_big_endian_and_non_contiguous_arrays() -> None:
    obs = np.asfortranarray(np.arange(32, dtype=">f4").reshape(16, 2))
    spec = SampleSpec((2,), "float32", (), "int64", num_actions=2)
    sent = make_samples(spec, obs=obs, next_obs=obs[::-1])
    got = load_samples(as_bytes(dump(sent)), spec)
    np.testing.assert_array_equal(got.batch.obs, obs)
    np.testing.assert_array_equal(got.batch.next_obs, obs[::-1])
    assert got.batch.obs.dtype == np.dtype("<f4")


def test_load_accepts_any_buffer_type_including_zmq_frames() -> None:
    zmq = pytest.importorskip("zmq")
    frames = as_bytes(dump(make_samples()))
    for convert in (
        memoryview,
        bytearray,
        lambda b: np.frombuffer(b, np.uint8),
        lambda b: zmq.Frame(b).buffer,
    ):
        got = load_samples([convert(f) for f in frames], CARTPOLE)
        assert got.seq == 41


def test_max_episodes_fit_in_the_header() -> None:
    msg = make_samples()
    msg.episodes = [EpisodeStat(-123.456789, 10**6)] * MAX_EPISODES
    assert len(load_samples(dump(msg), CARTPOLE).episodes) == MAX_EPISODES


def test_spec_normalises_dtypes_and_shapes() -> None:
    spec = SampleSpec(obs_shape=[4], obs_dtype=np.float32, action_shape=(), action_dtype=np.int64)  # type: ignore[arg-type]
    assert spec.obs_shape == (4,) and spec.obs_dtype == "float32" and spec.action_dtype == "int64"
    with pytest.raises(ValueError):
        SampleSpec((4,), "float16", (), "int64")


# ---------------------------------------------------------------------------------------------
# Structural rejections (any kind)
# ---------------------------------------------------------------------------------------------


def reject(frames: Any, match: str | None = None) -> None:
    with pytest.raises(WireError, match=match):
        load(frames)


def test_rejects_empty_frame_list() -> None:
    reject([], "empty")


def test_rejects_a_single_buffer_instead_of_a_frame_list() -> None:
    reject(dump(StopMsg("x"))[0], "sequence of frames")


def test_rejects_random_bytes() -> None:
    reject([b"\x92\x01\x02"], "header must be a map")
    reject([b"\xc1garbage"], "not valid msgpack")


def test_rejects_truncated_header() -> None:
    frames = samples_frames()
    reject([frames[0][:-3], *frames[1:]], "not valid msgpack")


def test_rejects_trailing_bytes_after_header() -> None:
    frames = samples_frames()
    reject([frames[0] + b"\x00", *frames[1:]], "not valid msgpack")


def test_rejects_header_that_is_not_a_map() -> None:
    reject([msgpack.packb([1, "samples"])], "header must be a map")


def test_rejects_oversized_header_frame() -> None:
    reject([b"\x80" + b"\x00" * MAX_HEADER_BYTES], "header frame")


def test_rejects_msgpack_ext_type() -> None:
    reject([msgpack.packb({"proto": 1, "kind": "stop", "arrays": [], "reason": msgpack.ExtType(5, b"x")})])
    reject(
        [msgpack.packb({"proto": 1, "kind": "stop", "arrays": [], "reason": msgpack.ExtType(5, b"")})], "ext"
    )


def test_rejects_binary_where_string_expected() -> None:
    reject([msgpack.packb({"proto": 1, "kind": "stop", "arrays": [], "reason": b"bytes"}, use_bin_type=True)])


def test_rejects_deeply_nested_header() -> None:
    reject([b"\x91" * 5000 + b"\x00"])


@pytest.mark.parametrize("proto", [0, 2, "1", True, None, 1.0])
def test_rejects_other_protocol_versions(proto: Any) -> None:
    def edit(h: dict[str, Any]) -> None:
        h["proto"] = proto

    reject(with_header(dump(StopMsg("x")), edit), "unsupported protocol version")


def test_rejects_unknown_kind() -> None:
    reject(with_header(dump(StopMsg("x")), lambda h: h.update(kind="reboot")), "unknown message kind")


def test_rejects_missing_and_unknown_header_keys() -> None:
    reject(with_header(dump(StopMsg("x")), lambda h: h.pop("reason")), "missing keys")
    reject(with_header(dump(StopMsg("x")), lambda h: h.update(extra=1)), "unexpected keys")


def test_rejects_extra_and_missing_frames() -> None:
    frames = samples_frames()
    reject(frames[:-1], "5 arrays but 4")
    reject([*frames, b"\x00"], "5 arrays but 6")
    reject([*as_bytes(dump(StopMsg("x"))), b""], "0 arrays but 1")


@pytest.mark.parametrize("delta", [-1, 1])
def test_rejects_lying_frame_length(delta: int) -> None:
    frames = samples_frames()
    obs = frames[1]
    frames[1] = obs[:delta] if delta < 0 else obs + b"\x00"
    reject(frames, "frame is")


def test_rejects_unknown_dtype() -> None:
    def edit(h: dict[str, Any]) -> None:
        h["arrays"][0]["dtype"] = "float16"

    reject(with_header(samples_frames(), edit), "dtype 'float16' not allowed")


@pytest.mark.parametrize("shape", [[-1, 4], [16, "4"], [16, True], [1] * 9, "16x4", [2**63 - 1, 0]])
def test_rejects_malformed_shapes(shape: Any) -> None:
    def edit(h: dict[str, Any]) -> None:
        h["arrays"][0]["shape"] = shape

    reject(with_header(samples_frames(), edit))


def test_rejects_declared_size_over_message_limit_without_allocating() -> None:
    def edit(h: dict[str, Any]) -> None:
        h["arrays"][0]["shape"] = [2**27, 4]  # 2 GiB of float32

    reject(with_header(samples_frames(), edit), "larger than")


@pytest.mark.parametrize("field", ["actor_id", "seq", "weights_version"])
@pytest.mark.parametrize("value", [True, -1, 2**63, 1.0, "3"])
def test_rejects_bad_integers_in_samples_header(field: str, value: Any) -> None:
    def edit(h: dict[str, Any]) -> None:
        h[field] = value

    reject(with_header(samples_frames(), edit), field)


def test_rejects_wrong_column_order() -> None:
    def edit(h: dict[str, Any]) -> None:
        h["arrays"][0], h["arrays"][3] = h["arrays"][3], h["arrays"][0]
        h["arrays"][0]["name"], h["arrays"][3]["name"] = "next_obs", "obs"

    reject(with_header(samples_frames(), edit), "in that order")


def test_rejects_columns_with_different_row_counts() -> None:
    with pytest.raises(WireError, match="rows"):
        dump(make_samples(discount=np.ones(15, np.float32)))

    def edit(h: dict[str, Any]) -> None:
        h["arrays"][4]["shape"] = [15]

    frames = with_header(samples_frames(), edit)
    frames[5] = frames[5][:-4]
    reject(frames, "rows")


@pytest.mark.parametrize(
    "episodes", [[[1.0]], [[float("nan"), 3]], [[1.0, -1]], [[1.0, True]], [["1", 2]], "x"]
)
def test_rejects_bad_episode_records(episodes: Any) -> None:
    def edit(h: dict[str, Any]) -> None:
        h["episodes"] = episodes

    reject(with_header(samples_frames(), edit), "episode")


def test_rejects_too_many_episodes() -> None:
    def edit(h: dict[str, Any]) -> None:
        h["episodes"] = [[0.0, 1]] * (MAX_EPISODES + 1)

    reject(with_header(samples_frames(), edit), match="too many episodes")


# ---------------------------------------------------------------------------------------------
# Samples content and spec rejections
# ---------------------------------------------------------------------------------------------


def reject_samples(frames: Frames, spec: SampleSpec = CARTPOLE, match: str | None = None) -> None:
    with pytest.raises(WireError, match=match):
        load_samples(frames, spec)


def test_load_samples_rejects_other_kinds() -> None:
    reject_samples(as_bytes(dump(StopMsg("x"))), match="expected a samples message, got stop")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_non_finite_reward(bad: float) -> None:
    reward = np.zeros(16, np.float32)
    reward[5] = bad
    reject_samples(samples_frames(reward=reward), match="reward")


@pytest.mark.parametrize("bad", [1.0001, -0.01, np.nan, np.inf])
def test_rejects_discount_outside_unit_interval(bad: float) -> None:
    discount = np.full(16, 0.9, np.float32)
    discount[-1] = bad
    reject_samples(samples_frames(discount=discount), match="discount")


def test_accepts_discount_at_both_ends() -> None:
    discount = np.array([0.0, 1.0] * 8, np.float32)
    load_samples(samples_frames(discount=discount), CARTPOLE)


@pytest.mark.parametrize("bad", [-1, 2, 2**40])
def test_rejects_out_of_range_discrete_action(bad: int) -> None:
    action = np.zeros(16, np.int64)
    action[3] = bad
    reject_samples(samples_frames(action=action), match="action outside")


@pytest.mark.parametrize("column", ["obs", "next_obs"])
def test_rejects_nan_in_float_observations(column: str) -> None:
    obs = np.zeros((16, 4), np.float32)
    obs[2, 1] = np.nan
    reject_samples(samples_frames(**{column: obs}), match=column)


def test_rejects_nan_in_continuous_action() -> None:
    action = np.zeros((16, 2), np.float32)
    action[0, 0] = np.inf
    reject_samples(samples_frames(CONTINUOUS, action=action), CONTINUOUS, match="action")


def test_rejects_shape_that_does_not_match_spec() -> None:
    obs = np.zeros((16, 5), np.float32)
    reject_samples(samples_frames(obs=obs, next_obs=obs), match=r"obs is float32 \(16, 5\)")


def test_rejects_dtype_that_does_not_match_spec() -> None:
    reject_samples(samples_frames(action=np.zeros(16, np.int32)), match="action is int32")
    reject_samples(samples_frames(), PIXELS, match="obs is float32")


def test_rejects_wrong_reward_dtype_structurally() -> None:
    with pytest.raises(WireError, match="reward"):
        dump(make_samples(reward=np.zeros(16, np.float64)))

    def edit(h: dict[str, Any]) -> None:
        h["arrays"][2]["dtype"] = "int32"

    reject(with_header(samples_frames(), edit), "reward")


def test_rejects_oversized_and_empty_batches() -> None:
    small = SampleSpec((4,), "float32", (), "int64", num_actions=2, max_batch=8)
    reject_samples(samples_frames(), small, match="batch size 16")
    empty = make_samples(n=0)
    reject_samples(as_bytes(dump(empty)), match="batch size 0")


def test_rejects_bool_bytes_other_than_zero_and_one() -> None:
    spec = SampleSpec((3,), "bool", (), "int64", num_actions=2)
    frames = samples_frames(spec, obs=np.ones((16, 3), bool), next_obs=np.ones((16, 3), bool))
    assert load_samples(frames, spec).batch.obs.all()
    frames[1] = b"\x02" + frames[1][1:]
    reject_samples(frames, spec, match="bool")


def test_validate_samples_checks_locally_built_messages_too() -> None:
    msg = make_samples()
    validate_samples(msg, CARTPOLE)
    msg.batch = msg.batch._replace(reward=[0.0] * 16)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="not a numpy array"):
        validate_samples(msg, CARTPOLE)
    with pytest.raises(WireError):
        validate_samples(StopMsg("x"), CARTPOLE)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Weights, heartbeat, stop rejections
# ---------------------------------------------------------------------------------------------


def weights_frames(**arrays: np.ndarray) -> list[bytes]:
    arrays = arrays or {"w": np.ones((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    return as_bytes(dump(WeightsMsg(Weights(4, arrays), "dqn")))


@pytest.mark.parametrize(
    ("reference", "match"),
    [
        ({"w": ((2, 3), "float32")}, "unexpected"),
        ({"w": ((2, 3), "float32"), "b": ((2,), "float32"), "c": ((1,), "float32")}, "missing"),
        ({"w": ((3, 2), "float32"), "b": ((2,), "float32")}, r"expected float32 \(3, 2\)"),
        ({"w": ((2, 3), "float64"), "b": ((2,), "float32")}, "expected float64"),
    ],
)
def test_load_weights_rejects_mismatch_with_reference(reference: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=match):
        load_weights(weights_frames(), reference)


def test_load_weights_rejects_non_finite_parameters() -> None:
    w = np.ones((2, 3), np.float32)
    w[1, 1] = np.nan
    with pytest.raises(WireError, match="NaN"):
        load_weights(weights_frames(w=w))


def test_load_weights_rejects_other_kinds_and_duplicate_names() -> None:
    with pytest.raises(WireError, match="expected a weights message, got samples"):
        load_weights(samples_frames())

    def edit(h: dict[str, Any]) -> None:
        h["arrays"][1]["name"] = "w"

    reject(with_header(weights_frames(), edit), "not unique")


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h.update(role="x" * 257),
        lambda h: h.update(id=True),
        lambda h: h.update(pid=-5),
        lambda h: h.update(time=float("nan")),
        lambda h: h.update(time="now"),
        lambda h: h.update(counters={"loss": float("inf")}),
        lambda h: h.update(counters={"flag": True}),
        lambda h: h.update(counters={"big": 2**64 - 1}),
        lambda h: h.update(counters=[1, 2]),
        lambda h: h.update(info={"port": 5555}),
        lambda h: h.update(arrays=[{"name": "x", "dtype": "uint8", "shape": [0]}]),
    ],
)
def test_rejects_malformed_heartbeats(edit: Callable[[dict[str, Any]], None]) -> None:
    reject(with_header(dump(heartbeat()), edit))


def test_rejects_overlong_stop_reason() -> None:
    reject(with_header(dump(StopMsg("x")), lambda h: h.update(reason="r" * 300)), "reason")


def test_dump_refuses_what_load_would_refuse() -> None:
    with pytest.raises(WireError, match="float16"):
        dump(WeightsMsg(Weights(1, {"w": np.zeros(2, np.float16)}), "dqn"))
    with pytest.raises(WireError):
        dump(StopMsg("x" * 1000))
    with pytest.raises(WireError):
        dump(object())  # type: ignore[arg-type]
    msg = heartbeat()
    msg.counters = {"loss": math.nan}
    with pytest.raises(WireError, match="finite"):
        dump(msg)


# ---------------------------------------------------------------------------------------------
# Properties: foreign input never escapes as anything but WireError
# ---------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_random_frames_decode_or_raise_wire_error(frames: list[bytes]) -> None:
    try:
        msg = load(frames)
    except WireError:
        return
    assert isinstance(msg, SamplesMsg | WeightsMsg | HeartbeatMsg | StopMsg)


_VALID = samples_frames()


@FUZZ
@given(st.integers(0, len(_VALID[0]) - 1), st.integers(0, 255))
def test_mutating_one_header_byte_gives_valid_message_or_wire_error(index: int, byte: int) -> None:
    header = bytearray(_VALID[0])
    header[index] = byte
    frames = [bytes(header), *_VALID[1:]]
    try:
        msg = load_samples(frames, CARTPOLE)
    except WireError:
        return
    validate_samples(msg, CARTPOLE)  # whatever got through is a fully valid samples message


@FUZZ
@given(st.data())
def test_one_corrupted_byte_in_any_frame_of_any_kind_decodes_or_raises_wire_error(
    data: st.DataObject,
) -> None:
    originals = [as_bytes(dump(heartbeat())), as_bytes(dump(StopMsg("bye"))), weights_frames(), _VALID]
    frames = list(data.draw(st.sampled_from(originals)))
    which = data.draw(st.integers(0, len(frames) - 1))
    target = bytearray(frames[which])
    target[data.draw(st.integers(0, len(target) - 1))] = data.draw(st.integers(0, 255))
    frames[which] = bytes(target)
    frames = frames[: data.draw(st.integers(0, len(frames)))]
    for decode in (load, load_weights, lambda f: load_samples(f, CARTPOLE)):
        with contextlib.suppress(WireError):
            decode(frames)


def test_wire_modules_never_import_pickle_or_zmq() -> None:
    for module in (
        wire,
        messages,
        decoding,
        layouts,
        header,
        array_checks,
    ):  # wire.py and the modules it is built from
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        assert "import pickle" not in source and "import zmq" not in source, module.__name__


# ---------------------------------------------------------------------------------------------
# Optional initial priorities (Ape-X): a sixth array named "priority"
# ---------------------------------------------------------------------------------------------


def with_priorities(priorities: np.ndarray, n: int = 16) -> SamplesMsg:
    msg = make_samples(n=n)
    msg.priorities = priorities
    return msg


def test_priorities_round_trip_as_a_sixth_array() -> None:
    pri = np.linspace(0.0, 3.0, 16, dtype=np.float32)
    frames = dump(with_priorities(pri))
    assert [d["name"] for d in header_of(frames)["arrays"]] == [*BATCH_FIELDS, "priority"]
    got = load_samples(as_bytes(frames), CARTPOLE)
    assert got.priorities is not None
    np.testing.assert_array_equal(got.priorities, pri)


def test_samples_without_priorities_decode_to_none() -> None:
    assert load_samples(as_bytes(dump(make_samples())), CARTPOLE).priorities is None


@pytest.mark.parametrize(
    "bad",
    [
        np.full(16, -0.5, np.float32),
        np.full(16, np.nan, np.float32),
        np.full(16, np.inf, np.float32),
        np.ones(16, np.float64),
        np.ones(15, np.float32),
        np.ones((16, 1), np.float32),
    ],
    ids=["negative", "nan", "inf", "float64", "short", "2d"],
)
def test_rejects_bad_priorities(bad: np.ndarray) -> None:
    msg = with_priorities(bad)
    with pytest.raises(WireError):  # the sender's own dump refuses a wrong layout; contents: the receiver
        load_samples(as_bytes(dump(msg)), CARTPOLE)
    with pytest.raises(WireError):
        validate_samples(msg, CARTPOLE)


def test_rejects_priority_in_the_wrong_place() -> None:
    def swap(h: dict[str, Any]) -> None:
        h["arrays"][0]["name"], h["arrays"][5]["name"] = "priority", "obs"

    frames = dump(with_priorities(np.ones(16, np.float32)))
    reject(with_header(frames, swap))


# ---------------------------------------------------------------------------------------------
# Continuous action bounds (docs/protocol.md "Validation and limits")
# ---------------------------------------------------------------------------------------------

# Pendulum-like: dimension 0 in [-2, 2], dimension 1 in [0, 1].
BOUNDED = SampleSpec(
    obs_shape=(3,),
    obs_dtype="float32",
    action_shape=(2,),
    action_dtype="float32",
    action_low=(-2.0, 0.0),
    action_high=(2.0, 1.0),
)


def bounded_frames(action: np.ndarray) -> list[bytes]:
    return samples_frames(BOUNDED, action=np.asarray(action, np.float32).reshape(-1, 2))


@pytest.mark.parametrize(
    "action",
    [[0.0, 0.5], [-2.0, 0.0], [2.0, 1.0], [2.0 + 1e-5, 1.0 + 5e-6], [-2.0 - 1e-5, -5e-6]],
    ids=["inside", "at-low", "at-high", "rounding-above", "rounding-below"],
)
def test_accepts_continuous_actions_within_bounds_and_float_rounding(action: list[float]) -> None:
    msg = load_samples(bounded_frames(np.tile(action, (16, 1))), BOUNDED)
    assert msg.batch.action.shape == (16, 2)


@pytest.mark.parametrize(
    ("row", "value"),
    [((0, 0), 2.001), ((5, 0), -2.5), ((15, 1), 1.0001), ((3, 1), -1e-3), ((7, 0), 3e38)],
)
def test_rejects_continuous_action_outside_bounds(row: tuple[int, int], value: float) -> None:
    action = np.zeros((16, 2), np.float32)
    action[row] = value
    reject_samples(bounded_frames(action), BOUNDED, match="outside the action space's bounds")
    with pytest.raises(WireError):  # the actor's self-check refuses it too
        validate_samples(make_samples(BOUNDED, action=action), BOUNDED)


def test_an_infinite_bound_leaves_the_other_side_checked() -> None:
    half = SampleSpec(
        obs_shape=(3,), obs_dtype="float32", action_shape=(1,), action_dtype="float32",
        action_low=-math.inf, action_high=1.0,
    )  # fmt: skip
    assert load_samples(samples_frames(half, action=np.full((16, 1), -3e38, np.float32)), half)
    reject_samples(samples_frames(half, action=np.full((16, 1), 1.5, np.float32)), half, match="bounds")
    reject_samples(samples_frames(half, action=np.full((16, 1), -np.inf, np.float32)), half, match="action")


def test_unbounded_continuous_spec_still_only_checks_finiteness() -> None:
    assert CONTINUOUS.action_low is None
    load_samples(samples_frames(CONTINUOUS, action=np.full((16, 2), 1e30, np.float32)), CONTINUOUS)


# ---------------------------------------------------------------------------------------------
# The weights fingerprint (optional header field, proto 1)
# ---------------------------------------------------------------------------------------------

FINGERPRINT = {"env.id": "CartPole-v1", "obs.shape": [4], "agent.n_step": 3, "agent.gamma": 0.99, "x": True}


def fingerprinted(fingerprint: Any = FINGERPRINT) -> list[bytes]:
    return as_bytes(dump(WeightsMsg(Weights(4, {"w": np.ones(2, np.float32)}), "dqn", fingerprint)))


def test_fingerprint_round_trips_with_its_types() -> None:
    got = load_weights(fingerprinted())
    assert got.fingerprint == FINGERPRINT
    assert type(got.fingerprint["agent.n_step"]) is int and type(got.fingerprint["x"]) is bool


def test_weights_without_fingerprint_are_the_old_proto_1_message() -> None:
    frames = fingerprinted(None)
    assert "fingerprint" not in header_of(frames)
    assert header_of(frames).keys() == {"proto", "kind", "arrays", "version", "agent"}
    assert load_weights(frames).fingerprint is None


def test_fingerprint_accepts_numpy_scalars_and_tuples_from_the_sender() -> None:
    sent = {"n": np.int64(3), "g": np.float32(0.5), "shape": (np.int64(84), 84), "b": np.bool_(True)}
    got = load_weights(fingerprinted(sent)).fingerprint
    assert got == {"n": 3, "g": 0.5, "shape": [84, 84], "b": True}


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2],
        "cartpole",
        {f"k{i}": 1 for i in range(wire.MAX_FINGERPRINT_ENTRIES + 1)},
        {"k": list(range(wire.MAX_FINGERPRINT_LIST + 1))},
        {"k": [[1, 2]]},
        {"k": {"nested": 1}},
        {"k": None},
        {"k": [None]},
        {"k": math.nan},
        {"k": [math.inf]},
        {"k": "v" * 257},
        {"k" * 257: 1},
        {"k": 2**64 - 1},
    ],
    ids=[
        "list", "string", "too-many-entries", "long-list", "nested-list", "nested-map", "none",
        "none-item", "nan", "inf-item", "long-value", "long-key", "beyond-int64",
    ],
)  # fmt: skip
def test_rejects_hostile_fingerprints(bad: Any) -> None:
    reject(with_header(fingerprinted(), lambda h: h.update(fingerprint=bad)), "fingerprint")


def test_rejects_fingerprint_with_non_string_keys_or_binary_values() -> None:
    header = header_of(fingerprinted())
    for fingerprint in ({1: "x"}, {"k": b"bytes"}):
        header["fingerprint"] = fingerprint
        reject([msgpack.packb(header, use_bin_type=True), *fingerprinted()[1:]])


def test_fingerprint_is_allowed_on_weights_only() -> None:
    reject(with_header(dump(StopMsg("x")), lambda h: h.update(fingerprint={})), "unexpected keys")


def test_dump_refuses_a_fingerprint_load_would_refuse() -> None:
    with pytest.raises(WireError, match="fingerprint"):
        fingerprinted({"k": {"nested": 1}})


def test_weights_may_carry_the_learners_env_steps_and_old_messages_still_load() -> None:
    weights = Weights(3, {"w": np.ones((2, 2), np.float32)})
    loaded = wire.load(wire.dump(WeightsMsg(weights=weights, agent="dqn", env_steps=12_345)))
    assert isinstance(loaded, WeightsMsg) and loaded.env_steps == 12_345
    assert wire.load(wire.dump(WeightsMsg(weights=weights, agent="dqn"))).env_steps is None  # type: ignore[union-attr]
    header, *frames = wire.dump(WeightsMsg(weights=weights, agent="dqn", env_steps=1))
    bad = msgpack.unpackb(bytes(header))
    bad["env_steps"] = -1
    with pytest.raises(WireError, match="env_steps"):
        wire.load([msgpack.packb(bad), *frames])
