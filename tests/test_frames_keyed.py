"""``replay.share_frames`` for Dict observations: each image key's planes stored once, in a pool
of its own, every other key stored densely in the row, and whole records coming back out.

A Dict observation here is an Atari-like frame stack under ``frames`` beside a small ``state``
vector. The keyed buffer must sample exactly what a dense buffer of the same seed samples, hold
each distinct plane once, free what overwritten rows no longer use, stay all-or-nothing across
its pools, and size itself (``replay_footprint``) by what each key costs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from zmqrl.config_sections import ReplayConfig
from zmqrl.errors import EnvError
from zmqrl.replay import factory, frame_pool, make_replay, replay_footprint
from zmqrl.replay.frames import SharedFramesPrioritizedReplay, SharedFramesReplay
from zmqrl.replay.memory import MemoryBudget, ReplayMemoryError
from zmqrl.spec import SampleSpec
from zmqrl.types import ObsEntry, TransitionBatch

STACK, SIDE, N_STEP = 4, 10, 3
FRAMES = ObsEntry("frames", (STACK, SIDE, SIDE), "uint8", 0.0, 255.0)
STATE = ObsEntry("state", (3,), "float32", -1.0, 1.0)
MINIMAP = ObsEntry("minimap", (2, 6, 6), "uint8", 0.0, 255.0)


def keyed_spec(*entries: ObsEntry) -> SampleSpec:
    return SampleSpec(
        obs_shape=(),
        obs_dtype="record",
        obs_entries=entries or (FRAMES, STATE),
        action_shape=(),
        action_dtype="int64",
        num_actions=4,
    )


SPEC = keyed_spec()
Shared = SharedFramesReplay | SharedFramesPrioritizedReplay


def build(
    capacity: int, *, share_frames: bool = True, prioritized: bool = False, spec: SampleSpec = SPEC
) -> Any:
    cfg = ReplayConfig(capacity=capacity, share_frames=share_frames, prioritized=prioritized)
    return make_replay(cfg, spec, seed=0)


def game(seed: int, batches: int, rows: int = 16, spec: SampleSpec = SPEC) -> list[TransitionBatch]:
    """n-step transitions whose image keys stack their last frames, as Atari's do: consecutive
    observations share all but one plane, obs and next_obs overlap; ``state`` is new every step."""
    rng = np.random.default_rng(seed)
    total = batches * rows + N_STEP
    obs = np.zeros(total, spec.obs_np_dtype)
    for entry in spec.obs_entries:
        if len(entry.shape) == 3:
            planes = entry.shape[0]
            film = rng.integers(0, 256, (total + planes, *entry.shape[1:]), dtype=np.uint8)
            obs[entry.key] = np.stack([film[t : t + planes] for t in range(total)])
        else:
            obs[entry.key] = rng.uniform(-1, 1, (total, *entry.shape))
    out = []
    for b in range(batches):
        t = np.arange(b * rows, (b + 1) * rows)
        action = rng.integers(0, 4, rows)
        reward = rng.normal(size=rows).astype(np.float32)
        out.append(TransitionBatch(obs[t], action, reward, obs[t + N_STEP], np.full(rows, 0.97, np.float32)))
    return out


def noise(rng: np.random.Generator, rows: int) -> TransitionBatch:
    """Transitions whose every plane differs from every other: the pools' worst case."""
    obs, nxt = np.zeros(rows, SPEC.obs_np_dtype), np.zeros(rows, SPEC.obs_np_dtype)
    for records in (obs, nxt):
        records["frames"] = rng.integers(0, 256, records["frames"].shape)
        records["state"] = rng.uniform(-1, 1, records["state"].shape)
    return TransitionBatch(
        obs, rng.integers(0, 4, rows), np.zeros(rows, np.float32), nxt, np.ones(rows, np.float32)
    )


def assert_same_records(a: TransitionBatch, b: TransitionBatch) -> None:
    """Equal column by column, and records key by key (their padding bytes are no one's values)."""
    for name, x, y in zip(TransitionBatch._fields, a, b, strict=True):
        assert x.dtype == y.dtype, name
        for key in x.dtype.names or (None,):
            np.testing.assert_array_equal(
                x if key is None else x[key], y if key is None else y[key], f"{name}.{key}"
            )


def drawn(buf: Any, rows: int, updates: int = 0) -> TransitionBatch:
    """``rows`` transitions ``buf`` samples (after ``updates`` updates)."""
    batch = buf.sample(rows, updates).batch
    assert isinstance(batch, TransitionBatch)
    return batch


def concat(batches: list[TransitionBatch]) -> TransitionBatch:
    return TransitionBatch(*(np.concatenate(cols) for cols in zip(*batches, strict=True)))


def last(batch: TransitionBatch, rows: int) -> TransitionBatch:
    return TransitionBatch(*(col[-rows:] for col in batch))


def distinct_planes(batch: TransitionBatch, key: str = "frames") -> int:
    """Distinct planes of ``key`` in the batch's observations (obs and next_obs)."""
    stacks = np.concatenate([batch.obs[key], batch.next_obs[key]])
    return len(np.unique(stacks.reshape(-1, stacks[0, 0].size), axis=0))


# ------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("capacity", [40, 256])
def test_samples_and_snapshots_are_the_records_a_dense_buffer_gives(capacity: int) -> None:
    dense, shared = build(capacity, share_frames=False), build(capacity)
    assert isinstance(shared, SharedFramesReplay)
    batches = game(0, batches=12)  # 192 rows: the small buffer wraps several times
    for batch in batches:
        dense.add(batch)
        shared.add(batch)
        assert_same_records(drawn(dense, 32), drawn(shared, 32))
    added = concat(batches)
    assert_same_records(shared.snapshot(), last(added, capacity))  # oldest first, each key as added
    assert_same_records(shared.snapshot(max_rows=5), last(added, 5))


def test_each_distinct_plane_is_stored_once_far_below_dense_memory() -> None:
    dense, shared = build(64, share_frames=False), build(64)
    batches = game(1, batches=4)  # exactly fills the buffer
    for batch in batches:
        dense.add(batch)
        shared.add(batch)
    assert list(shared.pools) == ["frames"]  # one pool, for the one image key
    assert shared.live_planes == shared.pool.live == distinct_planes(concat(batches))
    assert shared.live_planes < len(shared) + 2 * STACK + N_STEP  # ~1 new plane a row, not 8
    assert shared.live_planes * 6 < len(shared) * 2 * STACK
    assert shared.stats()["live_planes"] == shared.live_planes
    assert shared.nbytes * 3 < dense.nbytes  # the ids and the state vector are most of what is left


def test_prioritized_sampling_matches_the_dense_buffer() -> None:
    dense, shared = build(64, share_frames=False, prioritized=True), build(64, prioritized=True)
    assert isinstance(shared, SharedFramesPrioritizedReplay)
    rng = np.random.default_rng(9)
    for updates, batch in enumerate(game(3, batches=8)):
        priorities = rng.random(batch.size)
        dense.add(batch, priorities)
        shared.add(batch, priorities)
        a, b = dense.sample(16, updates), shared.sample(16, updates)
        assert isinstance(a.batch, TransitionBatch) and isinstance(b.batch, TransitionBatch)
        assert_same_records(a.batch, b.batch)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.importance, b.importance)
        td = rng.random(16)
        dense.update_priorities(a.ids, td)
        shared.update_priorities(b.ids, td)


def test_two_image_keys_keep_a_pool_each() -> None:
    spec = keyed_spec(FRAMES, STATE, MINIMAP)
    dense, shared = build(32, share_frames=False, spec=spec), build(32, spec=spec)
    batches = game(4, batches=2, spec=spec)
    for batch in batches:
        dense.add(batch)
        shared.add(batch)
    assert_same_records(drawn(dense, 32), drawn(shared, 32))
    pools = shared.pools
    assert pools["frames"].live == distinct_planes(concat(batches), "frames")
    assert pools["minimap"].live == distinct_planes(concat(batches), "minimap")
    with pytest.raises(ValueError, match="one frame pool per image key"):
        shared.pool  # noqa: B018 (the property is what is tested)


def test_overwriting_a_full_ring_releases_the_planes_no_row_uses() -> None:
    shared = build(32)
    for batch in game(5, batches=2):
        shared.add(batch)
    second = game(6, batches=2)  # a new game replaces every row
    for batch in second:
        shared.add(batch)
    stored = shared._rows.columns
    referenced = np.unique(np.concatenate([stored[0]["frames"].ravel(), stored[3]["frames"].ravel()]))
    assert shared.live_planes == referenced.size == distinct_planes(concat(second))
    assert_same_records(shared.snapshot(), concat(second))


def test_a_snapshot_restores_into_a_fresh_keyed_buffer() -> None:
    source = build(48, prioritized=True)
    for batch in game(7, batches=4):
        source.add(batch)
    snap = source.snapshot()
    copy = build(48, prioritized=True)
    copy.restore(snap, total_added=source.total_added)
    assert_same_records(copy.snapshot(), snap)
    assert copy.live_planes == source.live_planes and copy.total_added == 64


# ---------------------------------------------------------------------------------- transactions
class InjectedFault(RuntimeError):
    """Raised by a patched step; nothing else raises it."""


def state(buf: Shared) -> dict[str, Any]:
    """What a user could see of the buffer, and every pool's bookkeeping."""
    seen: dict[str, Any] = {
        "len": len(buf),
        "total_added": buf.total_added,
        "snapshot": buf.snapshot(),
        "columns": [c.copy() for c in buf._rows.columns],
        "rng": buf.rng_state(),
    }
    for key, pool in buf.pools.items():
        seen[f"pool {key}"] = (pool._refs.tolist(), list(pool._free), pool._unused, dict(pool._slot_of))
    return seen


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    assert_same_records(a.pop("snapshot"), b.pop("snapshot"))
    for x, y in zip(a.pop("columns"), b.pop("columns"), strict=True):  # plane ids, state, scalars
        for key in x.dtype.names or (None,):
            np.testing.assert_array_equal(x if key is None else x[key], y if key is None else y[key])
    assert a == b


def refuse(*_: Any) -> Any:
    raise InjectedFault("refused")


def digests_failing_after(planes: int) -> Any:
    """A blake2b whose digest of every plane after the first ``planes`` raises."""
    real, calls = frame_pool.hashlib.blake2b, [0]

    def blake2b(data: Any, digest_size: int) -> Any:
        calls[0] += 1
        if calls[0] > planes:
            raise InjectedFault("blake2b")
        return real(data, digest_size=digest_size)

    return blake2b


@contextmanager
def fault(buf: Shared, where: str | int) -> Iterator[None]:
    """``where``: ``"release"``, the release of the overwritten rows' planes refuses; a number,
    the digest of every plane after that many raises (inside the pools' staging)."""
    with pytest.MonkeyPatch.context() as mp:
        if isinstance(where, int):
            mp.setattr(frame_pool.hashlib, "blake2b", digests_failing_after(where))
        else:
            mp.setattr(buf.pool, "check_release", refuse)
        yield


# Where an add of 5 noise rows fails: 7 of its 20 obs planes hashed, or all 20 and 3 next_obs
# planes, or every plane stored and the release of the 3 rows it overwrites refused.
FAULTS: dict[str, str | int] = {"mid_obs": 7, "mid_next_obs": 5 * STACK + 3, "release": "release"}


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("where", list(FAULTS))
def test_an_add_that_fails_part_way_leaves_the_buffer_unchanged(prioritized: bool, where: str) -> None:
    buf, twin = build(8, prioritized=prioritized), build(8, prioritized=prioritized)
    rng = np.random.default_rng(0)
    history, batch = [noise(rng, 6), noise(rng, 5)], noise(rng, 5)  # the batch overwrites 3 rows
    for done in history:
        buf.add(done)
        twin.add(done)
    before = state(buf)
    with fault(buf, FAULTS[where]), pytest.raises(InjectedFault):
        buf.add(batch)
    assert_same_state(state(buf), before)
    buf.add(batch)  # retried, it gives exactly what a buffer that never failed holds
    twin.add(batch)
    assert_same_state(state(buf), state(twin))


def test_a_failure_in_the_second_image_key_leaves_the_first_keys_pool_as_it_was() -> None:
    spec = keyed_spec(FRAMES, STATE, MINIMAP)
    buf = build(16, spec=spec)
    first, batch = game(8, batches=2, rows=8, spec=spec)
    buf.add(first)
    before = state(buf)
    with fault(buf, 8 * 2 * STACK + 3), pytest.raises(InjectedFault):  # all of frames, then 3 more
        buf.add(batch)
    assert_same_state(state(buf), before)
    buf.add(batch)
    assert_same_records(buf.snapshot(), concat([first, batch]))


# -------------------------------------------------------------------------------- sizing, refusal
def test_the_footprint_counts_each_key_by_how_it_is_stored() -> None:
    cap, scalars = 100, 8 + 4 + 4  # action, reward, discount
    record = 400 + 12  # frames, state (aligned at 400 already)
    assert replay_footprint(cap, SPEC, prioritized=False) == cap * (scalars + 2 * record)
    # A row keeps 4 plane ids (int64) and state in a record of its own (44 bytes, aligned to 48);
    # the pool, at worst, every plane of the buffer and of one more full add, each with its
    # reference count and digest.
    stored, slots = 48, 2 * STACK * (cap + cap)
    worst = replay_footprint(cap, SPEC, prioritized=False, share_frames=True)
    assert worst == cap * (scalars + 2 * stored) + slots * (100 + 8 + 16)
    typical = replay_footprint(cap, SPEC, prioritized=False, share_frames=True, typical=True)
    assert typical == int(cap * (scalars + 2 * stored + factory.SHARED_PLANES_PER_ROW * 100))
    assert typical * 3 < replay_footprint(cap, SPEC, prioritized=False)


def test_noise_frames_never_hold_more_than_the_footprint_allowed() -> None:
    capacity, max_add = 24, 8
    need = replay_footprint(capacity, SPEC, False, True, max_add_rows=max_add)
    buf = make_replay(ReplayConfig(capacity=capacity, share_frames=True), SPEC, seed=0, max_add_rows=max_add)
    rng = np.random.default_rng(2)
    for rows in [8, 8, 8, 3, 8, 8, 1, 8]:
        buf.add(noise(rng, rows))
    pool = buf.pool  # type: ignore[attr-defined]
    assert pool.high_water == 2 * STACK * (capacity + max_add)  # the transaction's peak
    held = pool.high_water * (100 + 8 + 16) + capacity * (16 + 2 * 48)
    assert held <= need


def test_a_keyed_buffer_that_does_not_fit_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    need = replay_footprint(1000, SPEC, False, True)
    monkeypatch.setattr(factory, "available_memory", lambda: MemoryBudget(need - 1, "cgroup memory.max"))
    caplog.set_level(logging.INFO, logger="zmqrl.replay")
    with pytest.raises(ReplayMemoryError, match=r"replay\.capacity 1000 needs"):
        build(1000)
    assert "each image plane of ['frames'] stored once" in caplog.text
    monkeypatch.setattr(factory, "available_memory", lambda: MemoryBudget(need, "cgroup memory.max"))
    assert build(1000).capacity == 1000


def test_a_dict_without_an_image_key_is_refused_saying_what_to_do() -> None:
    flat = keyed_spec(STATE, ObsEntry("grid", (5, 5), "uint8", 0.0, 1.0))
    with pytest.raises(EnvError, match=r"image keys \(planes, height, width\).*share_frames: false"):
        build(16, spec=flat)
