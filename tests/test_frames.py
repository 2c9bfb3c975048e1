"""Shared-frame replay storage: each image plane stored once, rows as plane ids. It must behave
exactly like the dense buffers (same samples for the same seed), and free what it no longer uses."""

from __future__ import annotations

import numpy as np
import pytest

from zmqrl.replay import (
    PrioritizedReplay,
    SharedFramesPrioritizedReplay,
    SharedFramesReplay,
    UniformReplay,
    frame_pool,
)
from zmqrl.replay.frame_pool import FramePool
from zmqrl.types import TransitionBatch

STACK, SIDE, N_STEP = 4, 6, 3
OBS_SHAPE = (STACK, SIDE, SIDE)


def game_batches(seed: int, batches: int, rows: int = 16) -> list[TransitionBatch]:
    """n-step transitions of a fake game whose observations stack its last 4 frames, as Atari's do:
    consecutive rows share all but one plane, and obs/next_obs overlap."""
    rng = np.random.default_rng(seed)
    total = batches * rows
    film = rng.integers(0, 256, (total + STACK + N_STEP, SIDE, SIDE), dtype=np.uint8)
    stacks = np.stack([film[t : t + STACK] for t in range(total + N_STEP)])
    out = []
    for b in range(batches):
        t = np.arange(b * rows, (b + 1) * rows)
        out.append(
            TransitionBatch(
                obs=stacks[t],
                action=rng.integers(0, 6, rows),
                reward=rng.normal(size=rows).astype(np.float32),
                next_obs=stacks[t + N_STEP],
                discount=np.full(rows, 0.97, np.float32),
            )
        )
    return out


def assert_same(a: TransitionBatch, b: TransitionBatch) -> None:
    for name, x, y in zip(TransitionBatch._fields, a, b, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_pool_stores_each_distinct_plane_once_and_frees_unreferenced_ones() -> None:
    pool = FramePool(10, (2, 2))
    a, b = np.zeros((2, 2), np.uint8), np.ones((2, 2), np.uint8)
    ids = pool.intern(np.stack([a, b, a, a]))
    assert ids.tolist() == [0, 1, 0, 0] and pool.live == 2
    pool.release(ids[:3])  # a keeps one reference
    assert pool.live == 1
    np.testing.assert_array_equal(pool.planes[0], a)
    again = pool.intern(np.stack([2 * b]))  # the freed slot is reused before an untouched one
    assert again.tolist() == [1]
    pool.release(np.array([0, 1]))
    assert pool.live == 0


def test_pool_tells_planes_apart_even_if_their_digests_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    class Same:
        def __init__(self, data: object, digest_size: int) -> None:
            pass

        def digest(self) -> bytes:
            return b"x" * 16

    monkeypatch.setattr(frame_pool.hashlib, "blake2b", Same)
    pool = FramePool(4, (2,))
    ids = pool.intern(np.array([[1, 2], [3, 4]], np.uint8))
    assert ids[0] != ids[1]
    np.testing.assert_array_equal(pool.planes[ids], [[1, 2], [3, 4]])


@pytest.mark.parametrize("capacity", [40, 256])
def test_shared_frames_replay_samples_exactly_what_the_dense_buffer_does(capacity: int) -> None:
    dense = UniformReplay(capacity, OBS_SHAPE, np.uint8, (), np.int64, seed=3)
    shared = SharedFramesReplay(capacity, OBS_SHAPE, np.uint8, (), np.int64, seed=3)
    for batch in game_batches(0, batches=12):  # 192 rows: the small buffer wraps several times
        dense.add(batch)
        shared.add(batch)
        assert_same(dense.sample(32).batch, shared.sample(32).batch)
    assert_same(dense.snapshot(), shared.snapshot())
    # Each row adds about one new plane: far below the 8 a dense row holds.
    assert shared.live_planes <= len(shared) + 2 * STACK + N_STEP + 16
    assert shared.live_planes * 6 < len(shared) * 2 * STACK


def test_overwritten_rows_release_their_planes() -> None:
    shared = SharedFramesReplay(32, OBS_SHAPE, np.uint8, (), np.int64, seed=0)
    for batch in game_batches(1, batches=2):
        shared.add(batch)
    for batch in game_batches(2, batches=2):  # a new game replaces every row
        shared.add(batch)
    referenced = np.unique(np.concatenate([shared._rows.columns[0].ravel(), shared._rows.columns[3].ravel()]))
    assert shared.live_planes == referenced.size


def test_shared_frames_prioritized_replay_matches_the_dense_one() -> None:
    dense = PrioritizedReplay(64, OBS_SHAPE, np.uint8, (), np.int64, seed=5)
    shared = SharedFramesPrioritizedReplay(64, OBS_SHAPE, np.uint8, (), np.int64, seed=5)
    rng = np.random.default_rng(9)
    for batch in game_batches(3, batches=8):
        pri = rng.random(batch.size).astype(np.float32)
        dense.add(batch, pri)
        shared.add(batch, pri)
        (a, ids_a, w_a), (b, ids_b, w_b) = (
            dense.sample_prioritized(16, 0.5),
            shared.sample_prioritized(16, 0.5),
        )
        assert_same(a, b)
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(w_a, w_b)
        td = rng.random(16)
        dense.update_priorities(ids_a, td)
        shared.update_priorities(ids_b, td)


def test_shared_frames_need_image_observations() -> None:
    with pytest.raises(ValueError, match="share_frames"):
        SharedFramesReplay(10, (4,), np.float32, (), np.int64)


def pool_state(pool: FramePool) -> tuple[object, ...]:
    return pool._refs.tolist(), list(pool._free), pool._unused, dict(pool._slot_of), pool.live


def test_a_failed_replace_restores_the_pool_exactly() -> None:
    """Slots taken from the free list go back in the same order, untouched ones become untouched,
    whether a later plane or the release of the old ones fails."""
    pool = FramePool(8, (2,))
    kept = pool.intern(np.array([[1, 1], [2, 2], [3, 3], [4, 4]], np.uint8))
    pool.release(kept[1:3])  # two free slots, and four never written
    before = pool_state(pool)
    first = np.array([[1, 1], [5, 5], [6, 6]], np.uint8)  # 1 shared, 2 new
    second = np.array([[7, 7], [5, 5], [8, 8]], np.uint8)  # reuses 5
    with pytest.raises(ValueError, match="more often"):  # the release refuses: kept[3] has one reference
        pool.replace([first, second], kept[[3, 3]])
    assert pool_state(pool) == before
    with pytest.raises(frame_pool.FramePoolFull):  # 7 new planes, 6 slots left
        pool.replace([first, second, np.array([[9, 9], [10, 10], [11, 11]], np.uint8)], kept[:1])
    assert pool_state(pool) == before
    ids = pool.replace([first, second], kept[:1])  # the plane [1, 1] keeps its slot throughout
    assert ids[0][0] == kept[0] and pool.live == 6


def test_a_failing_intern_or_release_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = FramePool(3, (2,))
    ids = pool.intern(np.array([[1, 1], [2, 2]], np.uint8))
    before = pool_state(pool)
    with pytest.raises(frame_pool.FramePoolFull):  # two new planes, one free slot
        pool.intern(np.array([[3, 3], [1, 1], [4, 4]], np.uint8))
    assert pool_state(pool) == before
    with pytest.raises(ValueError, match="more often"):
        pool.release(np.array([ids[0], ids[0]]))
    assert pool_state(pool) == before


def test_replace_all_changes_every_pool_or_none() -> None:
    """One pool per image key of a Dict observation: a failure in the last pool (no room, a refused
    release) leaves the earlier pools, whose planes were already stored, exactly as they were."""
    first, second = FramePool(4, (2,)), FramePool(2, (2,))
    kept = first.intern(np.array([[1, 1], [2, 2]], np.uint8)), second.intern(np.array([[7, 7]], np.uint8))
    before = pool_state(first), pool_state(second)
    new = np.array([[3, 3], [4, 4]], np.uint8)
    with pytest.raises(frame_pool.FramePoolFull):  # two new planes for the one slot left
        frame_pool.replace_all([(first, [new], kept[0]), (second, [new], kept[1])])
    assert (pool_state(first), pool_state(second)) == before
    with pytest.raises(ValueError, match="more often"):
        frame_pool.replace_all([(first, [new], kept[0]), (second, [new[:1]], kept[1][[0, 0]])])
    assert (pool_state(first), pool_state(second)) == before
    ids = frame_pool.replace_all([(first, [new], kept[0]), (second, [new[:1]], kept[1])])
    assert [len(i[0]) for i in ids] == [2, 1] and (first.live, second.live) == (2, 1)


def test_slots_for_covers_a_full_buffer_plus_a_full_batch() -> None:
    assert frame_pool.slots_for(100, 4) == 2 * 4 * (100 + 100)
    assert frame_pool.slots_for(100, 4, max_rows=10) == 2 * 4 * 110
    assert frame_pool.slots_for(100, 4, max_rows=10**6) == frame_pool.slots_for(100, 4)
