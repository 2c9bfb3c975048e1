"""Rollouts on the wire (issue 25 item 2): the ``"rollouts"`` kind round-trips, every structural
and content rule refuses what breaks it with a WireError naming the problem, a run takes only the
kind it trains on, and the samples channel merges and delivers rollouts as it does transitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.conftest import wait_until
from zmqrl.spec import SampleSpec
from zmqrl.transport import array_checks, decoding, sockets
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.sample_channel import SAMPLES_MAX_FRAMES, SampleGroup, SampleReceiver, SampleSender
from zmqrl.transport.wire import (
    KIND_ROLLOUTS,
    SamplesMsg,
    WireError,
    dump,
    load,
    load_samples,
    validate_content,
    validate_samples,
)
from zmqrl.types import BATCH_FIELDS, ROLLOUT_FIELDS, EpisodeStat, RolloutBatch, TransitionBatch

T = 8  # steps per rollout in these tests' runs
DISCRETE = SampleSpec((4,), "float32", (), "int64", num_actions=2, max_batch=16, rollout_length=T)
CONTINUOUS = SampleSpec(
    (3,), "float32", (2,), "float32", action_low=-1.0, action_high=1.0, max_batch=16, rollout_length=T
)
PIXELS = SampleSpec((6, 5, 2), "uint8", (), "int64", num_actions=6, max_batch=16, rollout_length=T)
TRANSITIONS = dataclasses.replace(DISCRETE, rollout_length=None)  # the same env, an off-policy run
# A step's place in a batch: (row, step).
Step = tuple[int, int]
# Two truncations in one row and one in another, out of row-major order on purpose.
CUTS: tuple[Step, ...] = ((2, 5), (0, 7), (2, 1))
ENDS: tuple[Step, ...] = ((1, 3), (0, 2))  # terminations


def make_rollouts(
    spec: SampleSpec,
    rows: int = 3,
    cuts: tuple[Step, ...] = CUTS,
    ends: tuple[Step, ...] = ENDS,
    seed: int = 0,
) -> RolloutBatch:
    """A batch that satisfies ``spec``: final_obs row k is ``1000 + k`` everywhere, so the k-th
    truncated step (row-major) is recognisable by its final observation."""
    rng = np.random.default_rng(seed)
    steps = spec.rollout_length or 1
    if spec.obs_dtype == "uint8":
        obs = rng.integers(0, 256, (rows, steps + 1, *spec.obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((rows, steps + 1, *spec.obs_shape)).astype(spec.obs_dtype)
    if spec.num_actions is not None:
        action = rng.integers(0, spec.num_actions, (rows, steps), dtype=np.int64)
        logp = np.log(rng.uniform(0.05, 1.0, (rows, steps))).astype(np.float32)
    else:
        action = rng.uniform(-1, 1, (rows, steps, *spec.action_shape)).astype(np.float32)
        logp = rng.uniform(-5.0, 3.0, (rows, steps)).astype(np.float32)  # a density's log may be > 0
    terminated = np.zeros((rows, steps), bool)
    truncated = np.zeros((rows, steps), bool)
    for r, t in ends:
        terminated[r, t] = True
    for r, t in cuts:
        truncated[r, t] = True
    k = int(truncated.sum())
    final_obs = np.empty((k, *spec.obs_shape), spec.obs_dtype)
    for i in range(k):
        final_obs[i] = 100 + i if spec.obs_dtype == "uint8" else 1000 + i
    reward = rng.standard_normal((rows, steps)).astype(np.float32)
    return RolloutBatch(obs, action, reward, terminated, truncated, logp, final_obs)


def transitions(n: int = 2) -> TransitionBatch:
    """A valid batch of ``n`` transitions for TRANSITIONS (the same env, off-policy)."""
    obs = np.zeros((n, 4), np.float32)
    return TransitionBatch(obs, np.zeros(n, np.int64), np.zeros(n, np.float32), obs, np.ones(n, np.float32))


def message(batch: RolloutBatch | TransitionBatch, seq: int = 41) -> SamplesMsg:
    return SamplesMsg(3, seq, 7, batch, [EpisodeStat(21.5, 22), EpisodeStat(-3.0, 9)])


def frames_of(msg: SamplesMsg) -> list[bytes]:
    return [bytes(f) for f in dump(msg)]


def header_of(frames: list[bytes]) -> dict[str, Any]:
    return msgpack.unpackb(frames[0])


def raw_frames(kind: str, columns: list[tuple[str, np.ndarray]]) -> list[bytes]:
    """A message as a foreign encoder might send it: nothing on the way checks the header."""
    header = {"proto": 1, "kind": kind, "actor_id": 3, "seq": 41, "weights_version": 7, "episodes": []}
    header["arrays"] = [{"name": n, "dtype": a.dtype.name, "shape": list(a.shape)} for n, a in columns]
    return [msgpack.packb(header), *(np.ascontiguousarray(a).tobytes() for _, a in columns)]


def columns_of(batch: RolloutBatch) -> list[tuple[str, np.ndarray]]:
    return list(zip(ROLLOUT_FIELDS, batch[:7], strict=True))


def refused(frames: list[bytes], spec: SampleSpec, match: str) -> None:
    """Both receiving paths refuse ``frames`` naming the problem: the whole check, and the learner's
    split one (layout per message, contents over the group's merged rows: here a group of one)."""
    with pytest.raises(WireError, match=match):
        load_samples(frames, spec)
    with pytest.raises(WireError, match=match):
        msg = load_samples(frames, spec, contents=False)
        validate_content(msg.batch, msg.priorities, spec)


def assert_same_batch(a: RolloutBatch, b: RolloutBatch) -> None:
    assert type(a) is type(b)
    for name, x, y in zip(ROLLOUT_FIELDS, a[:7], b[:7], strict=True):
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        assert x.tobytes() == y.tobytes(), name


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS, PIXELS], ids=["discrete", "continuous", "uint8-obs"])
@pytest.mark.parametrize("cuts", [CUTS, ()], ids=["K=3", "K=0"])
def test_rollouts_round_trip_every_column_exactly(spec: SampleSpec, cuts: tuple[Step, ...]) -> None:
    sent = message(make_rollouts(spec, cuts=cuts))
    frames = frames_of(sent)
    got = load_samples(frames, spec)
    assert isinstance(got.batch, RolloutBatch) and got.priorities is None
    assert_same_batch(sent.batch, got.batch)
    assert (got.actor_id, got.seq, got.weights_version, got.episodes) == (3, 41, 7, sent.episodes)
    assert got.batch.final_obs.shape == (len(cuts), *spec.obs_shape)
    assert frames_of(got) == frames  # decoded and encoded again, byte for byte


def test_rollouts_header_has_the_samples_keys_and_the_seven_columns_in_order() -> None:
    frames = frames_of(message(make_rollouts(DISCRETE)))
    header = header_of(frames)
    samples_header = header_of(frames_of(message(transitions())))
    assert header["kind"] == KIND_ROLLOUTS == "rollouts"
    assert header.keys() == samples_header.keys()
    assert [d["name"] for d in header["arrays"]] == list(ROLLOUT_FIELDS)
    assert [d["shape"] for d in header["arrays"]] == [
        [3, T + 1, 4],
        [3, T],
        [3, T],
        [3, T],
        [3, T],
        [3, T],
        [3, 4],
    ]
    assert [d["dtype"] for d in header["arrays"]][2:6] == ["float32", "bool", "bool", "float32"]
    assert len(frames) == 1 + len(ROLLOUT_FIELDS) <= SAMPLES_MAX_FRAMES


def test_plain_load_decodes_rollouts_without_a_spec() -> None:
    got = load(frames_of(message(make_rollouts(CONTINUOUS))))
    assert isinstance(got, SamplesMsg) and isinstance(got.batch, RolloutBatch)


def test_dump_refuses_priorities_on_rollouts() -> None:
    msg = message(make_rollouts(DISCRETE))
    msg.priorities = np.ones(3, np.float32)
    with pytest.raises(WireError, match="rollouts carry no priorities"):
        dump(msg)
    with pytest.raises(WireError, match="rollouts carry no priority array"):
        validate_samples(msg, DISCRETE)


# ---------------------------------------------------------------------------------------------
# Structure: what the header alone says is wrong (no spec needed)
# ---------------------------------------------------------------------------------------------

Columns = list[tuple[str, np.ndarray]]


def _set(name: str, value: Callable[[np.ndarray], np.ndarray]) -> Callable[[Columns], Columns]:
    return lambda cols: [(n, value(a) if n == name else a) for n, a in cols]


def _swap(i: int, j: int) -> Callable[[Columns], Columns]:
    def edit(cols: Columns) -> Columns:
        cols = list(cols)
        cols[i], cols[j] = cols[j], cols[i]
        return cols

    return edit


def _rows(n: int) -> Callable[[Columns], Columns]:
    """Every step column cut to ``n`` rows (obs included), final_obs left empty."""
    return lambda cols: [(name, a[:n] if name != "final_obs" else a[:0]) for name, a in cols]


STRUCTURE: dict[str, tuple[Callable[[Columns], Columns], str]] = {
    "columns out of order": (_swap(2, 5), r"rollouts arrays must be \['obs', 'action', 'reward'"),
    "a column missing": (lambda cols: cols[:-1], "rollouts arrays must be"),
    "a priority column": (
        lambda cols: [*cols, ("priority", np.ones(3, np.float32))],
        "rollouts arrays must be",
    ),
    "no rows (R = 0)": (_rows(0), r"R >= 1 and T >= 1, got \[0, 9, 4\]"),
    "no steps (T = 0)": (
        lambda cols: [(n, a[:, :1] if n == "obs" else a if n == "final_obs" else a[:, :0]) for n, a in cols],
        r"R >= 1 and T >= 1, got \[3, 1, 4\]",
    ),
    "obs without its bootstrap step": (_set("obs", lambda a: a[:, :-1]), r"'action' is \[3, 8\], expected"),
    "obs of one dimension": (_set("obs", lambda a: a.reshape(-1)), r"'obs' must be \[R, T \+ 1, ...\]"),
    "action rows differ": (
        _set("action", lambda a: a[:2]),
        r"'action' is \[2, 8\], expected \[R, T, ...\] = \[3, 8\]",
    ),
    "a step column one step short": (_set("logp", lambda a: a[:, :-1]), r"'logp' is \[3, 7\]"),
    "reward float64": (_set("reward", lambda a: a.astype(np.float64)), "'reward' must be float32 of shape"),
    "reward with a third axis": (_set("reward", lambda a: a[..., None]), "'reward' must be float32 of shape"),
    "logp float64": (_set("logp", lambda a: a.astype(np.float64)), "'logp' must be float32"),
    "terminated uint8": (_set("terminated", lambda a: a.astype(np.uint8)), "'terminated' must be bool"),
    "truncated float32": (_set("truncated", lambda a: a.astype(np.float32)), "'truncated' must be bool"),
    "final_obs of another dtype": (
        _set("final_obs", lambda a: a.astype(np.float64)),
        r"'final_obs' must be float32 \[K, 4\] like obs's rows, got float64",
    ),
    "final_obs rows of another shape": (
        _set("final_obs", lambda a: a[:, :3]),
        r"'final_obs' must be float32 \[K, 4\]",
    ),
    "final_obs without a row axis": (_set("final_obs", lambda a: a[0]), r"'final_obs' must be"),
}


@pytest.mark.parametrize("case", list(STRUCTURE))
def test_a_malformed_rollouts_layout_is_refused_naming_the_problem(case: str) -> None:
    edit, match = STRUCTURE[case]
    frames = raw_frames("rollouts", edit(columns_of(make_rollouts(DISCRETE))))
    with pytest.raises(WireError, match=match):
        load(frames)
    refused(frames, DISCRETE, match)


def test_each_kind_needs_its_own_columns_even_for_a_layout_seen_before() -> None:
    """The layout cache is per kind: seven rollout columns checked under "rollouts" are still not a
    samples message, and the five transition columns are never rollouts."""
    rollout_cols = columns_of(make_rollouts(DISCRETE))
    load(raw_frames("rollouts", rollout_cols))  # checked and cached as a rollouts layout
    with pytest.raises(WireError, match="samples arrays must be"):
        load(raw_frames("samples", rollout_cols))
    transition_cols = list(zip(BATCH_FIELDS, transitions(), strict=True))
    with pytest.raises(WireError, match="rollouts arrays must be"):
        load(raw_frames("rollouts", transition_cols))


# ---------------------------------------------------------------------------------------------
# Contents: what the run's spec says is wrong
# ---------------------------------------------------------------------------------------------


def _batch_edit(**changes: Callable[[np.ndarray], np.ndarray]) -> Callable[[RolloutBatch], RolloutBatch]:
    return lambda b: b._replace(**{name: fn(getattr(b, name).copy()) for name, fn in changes.items()})


def _put(index: Any, value: Any) -> Callable[[np.ndarray], np.ndarray]:
    def edit(a: np.ndarray) -> np.ndarray:
        a[index] = value
        return a

    return edit


def _steps(n: int) -> Callable[[RolloutBatch], RolloutBatch]:
    return lambda b: make_rollouts(dataclasses.replace(DISCRETE, rollout_length=n), cuts=(), ends=())


# case -> (spec, edit of a valid batch of 3 rows, the reason's pattern)
CONTENT: dict[str, tuple[SampleSpec, Callable[[RolloutBatch], RolloutBatch], str]] = {
    "T other than the run's": (
        DISCRETE,
        _steps(6),
        r"rollouts of 6 steps, this run's have 8 \(actor.rollout_length\)",
    ),
    "more rows than max_batch": (
        dataclasses.replace(DISCRETE, max_batch=2),
        lambda b: b,
        r"3 rollouts outside \[1, 2\]",
    ),
    "obs of another dtype": (
        DISCRETE,
        _batch_edit(obs=lambda a: a.astype(np.float64), final_obs=lambda a: a.astype(np.float64)),
        "obs is float64",
    ),
    "obs rows of another shape": (
        DISCRETE,
        _batch_edit(obs=lambda a: a[..., :3], final_obs=lambda a: a[:, :3]),
        r"obs is float32 \(3, 9, 3\), expected float32 \(3, 9, 4\)",
    ),
    "discrete action as floats": (
        DISCRETE,
        _batch_edit(action=lambda a: a.astype(np.float32)),
        "action is float32",
    ),
    "continuous action without its axis": (
        CONTINUOUS,
        _batch_edit(action=lambda a: a[..., 0]),
        "action is float32",
    ),
    "a final_obs row too many": (
        DISCRETE,
        _batch_edit(final_obs=lambda a: np.concatenate([a, a[:1]])),
        "final_obs has 4 rows, but 3 steps are truncated",
    ),
    "a final_obs row too few": (
        DISCRETE,
        _batch_edit(final_obs=lambda a: a[:2]),
        "final_obs has 2 rows, but 3",
    ),
    "a step both terminated and truncated": (
        DISCRETE,
        _batch_edit(terminated=_put((2, 5), True)),
        "both terminated and truncated",
    ),
    "discrete action too large": (DISCRETE, _batch_edit(action=_put((1, 4), 2)), r"action outside \[0, 2\)"),
    "discrete action negative": (DISCRETE, _batch_edit(action=_put((0, 0), -1)), r"action outside \[0, 2\)"),
    "continuous action past its bound": (
        CONTINUOUS,
        _batch_edit(action=_put((2, 7, 1), 1.01)),
        "continuous action outside the action space's bounds",
    ),
    "continuous action NaN": (CONTINUOUS, _batch_edit(action=_put((0, 3, 0), np.nan)), "action contains NaN"),
    "reward NaN": (DISCRETE, _batch_edit(reward=_put((1, 1), np.nan)), "reward outside"),
    "reward infinite": (DISCRETE, _batch_edit(reward=_put((1, 1), -np.inf)), "reward outside"),
    "reward past max_abs_reward": (
        DISCRETE,
        _batch_edit(reward=_put((0, 6), 2e6)),
        r"reward outside \[-1e\+06, 1e\+06\] \(transport.max_abs_reward, per step\)",
    ),
    "logp NaN": (DISCRETE, _batch_edit(logp=_put((0, 1), np.nan)), "logp outside"),
    "logp infinite": (CONTINUOUS, _batch_edit(logp=_put((0, 1), -np.inf)), "logp outside"),
    "discrete logp above 0": (
        DISCRETE,
        _batch_edit(logp=_put((2, 2), 0.01)),
        r"logp outside \[-1e\+06, 0.001\]",
    ),
    "discrete logp hugely negative": (DISCRETE, _batch_edit(logp=_put((2, 2), -2e6)), "logp outside"),
    "continuous logp past its bound": (
        CONTINUOUS,
        _batch_edit(logp=_put((1, 0), 3e38)),
        r"logp outside \[-1e\+06, 1e\+06\]",
    ),
    "obs NaN": (DISCRETE, _batch_edit(obs=_put((1, T, 2), np.nan)), "obs component 2 is nan"),
    "obs past max_abs_obs": (DISCRETE, _batch_edit(obs=_put((2, 0, 0), 1e7)), "obs component 0 is 1e"),
    "final_obs NaN": (DISCRETE, _batch_edit(final_obs=_put((1, 3), np.nan)), "final_obs component 3 is nan"),
    "final_obs past max_abs_obs": (
        DISCRETE,
        _batch_edit(final_obs=_put((0, 1), -1e9)),
        "final_obs component 1",
    ),
    "obs past a declared bound": (
        dataclasses.replace(DISCRETE, obs_low=(-5.0, -1e6, -5.0, -1e6), obs_high=(5.0, 1e6, 5.0, 1e6)),
        _batch_edit(obs=_put((0, 4, 2), 5.5)),
        r"obs component 2 is 5.5, outside \[-5",
    ),
    "final_obs past a declared bound": (
        dataclasses.replace(DISCRETE, obs_low=-2000.0, obs_high=2000.0),
        _batch_edit(final_obs=_put((2, 0), 2500.0)),
        "final_obs component 0 is 2500",
    ),
}


@pytest.mark.parametrize("case", list(CONTENT))
def test_rollouts_the_run_cannot_train_on_are_refused_naming_the_problem(case: str) -> None:
    spec, edit, match = CONTENT[case]
    batch = edit(make_rollouts(DISCRETE if spec.num_actions else CONTINUOUS))
    refused(frames_of(message(batch)), spec, match)


def test_an_episode_return_beyond_the_reward_limit_is_refused() -> None:
    msg = message(make_rollouts(DISCRETE))
    msg.episodes = [EpisodeStat(3e6, 2)]
    refused(
        frames_of(msg), DISCRETE, "episode return 3000000.0 beyond transport.max_abs_reward x its length 2"
    )


@pytest.mark.parametrize("column, byte", [("terminated", 2), ("truncated", 255)])
def test_bool_bytes_other_than_0_and_1_are_refused(column: str, byte: int) -> None:
    """np.frombuffer keeps a bool frame's bytes as they came; numpy reads any non-zero byte as True
    (so the count of truncated steps still agrees here), and the content scan refuses it."""
    frames = frames_of(message(make_rollouts(DISCRETE)))
    frame = 1 + ROLLOUT_FIELDS.index(column)
    raw = bytearray(frames[frame])
    step = 2 * T + 5  # (2, 5): truncated already, terminated not
    raw[step] = byte
    frames[frame] = bytes(raw)
    refused(frames, DISCRETE, f"{column} has bool bytes other than 0 and 1")


def test_logp_at_its_documented_limits_is_accepted() -> None:
    discrete = make_rollouts(DISCRETE)._replace(
        logp=np.full((3, T), decoding.DISCRETE_LOGP_SLACK, np.float32)
    )
    load_samples(frames_of(message(discrete)), DISCRETE)
    positive = np.full((3, T), 40.0, np.float32)  # a narrow Gaussian's log-density: positive, legitimately
    positive[0, 0] = -decoding.MAX_ABS_LOGP
    load_samples(frames_of(message(make_rollouts(CONTINUOUS)._replace(logp=positive))), CONTINUOUS)


def test_a_continuous_action_within_the_bound_tolerance_is_accepted() -> None:
    action = np.full((3, T, 2), 1.0 + 0.5 * decoding.ACTION_BOUND_TOLERANCE, np.float32)
    load_samples(frames_of(message(make_rollouts(CONTINUOUS)._replace(action=action))), CONTINUOUS)


def test_the_truncation_count_is_checked_per_message_on_a_layout_seen_before() -> None:
    """The learner skips the layout check for a known layout and scans a group's merged rows: there
    one message's missing final_obs row could hide behind another's extra one, so the count is
    checked for every message on its own."""
    good = make_rollouts(DISCRETE, cuts=((0, 1),))
    load_samples(frames_of(message(good)), DISCRETE, contents=False)  # the layout is now known
    no_cut = good._replace(truncated=np.zeros_like(good.truncated))  # same layout, K = 1, nothing cut
    with pytest.raises(WireError, match="final_obs has 1 rows, but 0 steps are truncated"):
        load_samples(frames_of(message(no_cut)), DISCRETE, contents=False)


def test_a_run_refuses_the_kind_it_does_not_train_on_both_ways() -> None:
    rollouts = frames_of(message(make_rollouts(DISCRETE)))
    samples = frames_of(message(transitions()))
    load_samples(samples, TRANSITIONS)  # the same message, to a run that trains on transitions
    for contents in (True, False):
        with pytest.raises(WireError, match="rollouts refused: this run trains on transitions"):
            load_samples(rollouts, TRANSITIONS, contents=contents)
        with pytest.raises(WireError, match="samples refused: this run trains on rollouts of 8 steps"):
            load_samples(samples, DISCRETE, contents=contents)


# ---------------------------------------------------------------------------------------------
# The samples channel
# ---------------------------------------------------------------------------------------------


def test_a_group_of_rollouts_concatenates_rows_and_keeps_each_final_obs_with_its_step() -> None:
    cuts = (((0, 3), (1, 0)), (), ((0, 7),))
    batches = [make_rollouts(DISCRETE, rows=2, cuts=c, ends=(), seed=i) for i, c in enumerate(cuts)]
    # Tag each final_obs row with (message, its index there), to find it again after the merge.
    tagged = [b._replace(final_obs=b.final_obs + 10 * i) for i, b in enumerate(batches)]
    group = SampleGroup.of([message(b, seq=i) for i, b in enumerate(tagged)])
    merged = group.batch
    assert isinstance(merged, RolloutBatch) and group.priorities is None
    assert merged.rows == 6 and merged.length == T and group.size == 6 * T
    assert merged.core_state is None  # a feed-forward run's rows carry no state
    for name, col in zip(ROLLOUT_FIELDS, merged[:7], strict=True):
        np.testing.assert_array_equal(col, np.concatenate([getattr(b, name) for b in tagged]), err_msg=name)
    # The k-th truncated step of the merged rows, row-major, owns final_obs row k.
    owners = [divmod(int(i), T) for i in np.flatnonzero(merged.truncated.reshape(-1))]
    expected = {(0, 3): 1000.0, (1, 0): 1001.0, (4, 7): 1020.0}  # (merged row, step): tag
    assert owners == list(expected)
    assert [float(row[0]) for row in merged.final_obs] == list(expected.values())
    validate_content(merged, None, DISCRETE)


def test_a_group_refuses_to_mix_transitions_and_rollouts() -> None:
    samples = message(transitions())
    rollouts = message(make_rollouts(DISCRETE))
    for mixed in ([rollouts, samples], [samples, rollouts]):
        with pytest.raises(ValueError, match="all carry transitions, or all rollouts"):
            SampleGroup.of(mixed)
    assert SampleGroup.of([rollouts]).batch is rollouts.batch  # one message: nothing copied


@pytest.mark.parametrize("zero_copy", [False, True], ids=["copied", "zero-copy"])
def test_rollouts_cross_a_real_socket_pair_and_a_bad_one_is_counted(
    ctx: zmq.Context, zero_copy: bool
) -> None:
    limits = sockets.SocketLimits(samples_hwm=16, linger_ms=0)
    pull, endpoint = sockets.samples_pull(ctx, "tcp://127.0.0.1:0", limits)  # the OS picks the port
    sender = SampleSender(sockets.samples_push(ctx, endpoint, limits), endpoint)
    receiver = SampleReceiver(pull, DISCRETE, BadMessages("samples"), zero_copy=zero_copy)
    assert receiver.limit.max_frames >= 1 + len(ROLLOUT_FIELDS)
    good = [make_rollouts(DISCRETE, seed=i) for i in range(3)]
    nan_reward = good[1]._replace(reward=np.full((3, T), np.nan, np.float32))
    wrong_kind = transitions()
    outgoing = [good[0], nan_reward, good[1], wrong_kind, good[2]]
    if not sender.send(message(outgoing[0], seq=0)):  # held until the connection completes
        wait_until(sender.retry, 10, "a connected learner")
    for seq, batch in enumerate(outgoing[1:], start=1):
        assert sender.send(message(batch, seq=seq))
    delivered: list[SamplesMsg] = []

    def all_read() -> bool:
        group = receiver.recv_group(8)
        if group is not None:
            assert isinstance(group.batch, RolloutBatch)
            delivered.extend(group.messages)
        return len(delivered) + receiver.bad.count == len(outgoing)

    wait_until(all_read, 10, "every message read")
    assert [m.seq for m in delivered] == [0, 2, 4] and receiver.bad.count == 2
    for msg, batch in zip(delivered, good, strict=True):
        assert isinstance(msg.batch, RolloutBatch)
        assert_same_batch(batch, msg.batch)
    sender.close()
    pull.close()


# ---------------------------------------------------------------------------------------------
# The document
# ---------------------------------------------------------------------------------------------


def test_the_protocol_document_describes_the_rollouts_message() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text(encoding="utf-8")
    assert "### `rollouts` (actor → learner)" in text
    for name in ROLLOUT_FIELDS:
        assert f"`{name}`" in text, name
    for limit in ("DISCRETE_LOGP_SLACK", "MAX_ABS_LOGP"):
        value = getattr(decoding, limit)
        assert f"{value:g}" in text, limit


def test_array_checks_never_import_pickle_or_zmq() -> None:
    source = Path(array_checks.__file__ or "").read_text(encoding="utf-8")
    assert "import pickle" not in source and "import zmq" not in source
