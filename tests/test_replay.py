"""Tests for zmqrl.replay.UniformReplay: ring order, capacity, sampling, dtypes, thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from zmqrl.config import ReplayConfig
from zmqrl.core import Replay
from zmqrl.replay import UniformReplay, make_replay
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

OBS_DIM = 3


def make_batch(ids: np.ndarray | list[int] | range, obs_dim: int = OBS_DIM) -> TransitionBatch:
    """A batch whose every column is derived from a unique id, so a row can be checked alone."""
    ids = np.asarray(ids, dtype=np.int64)
    obs = np.repeat(ids[:, None], obs_dim, axis=1).astype(np.float32)
    return TransitionBatch(
        obs=obs,
        action=ids % 2,
        reward=ids.astype(np.float32),
        next_obs=obs + 0.5,
        discount=np.full(len(ids), 0.99, dtype=np.float32),
    )


def make_buffer(capacity: int, seed: int | None = 0, obs_dim: int = OBS_DIM) -> UniformReplay:
    return UniformReplay(capacity, (obs_dim,), np.float32, (), np.int64, seed=seed)


def stored_ids(buf: UniformReplay) -> list[int]:
    """Ids of the stored rows in ring-slot order (peeks at storage: test-only)."""
    obs = buf._rows.columns[0][: len(buf)]
    return [int(v) for v in obs[:, 0]]


def assert_rows_consistent(batch: TransitionBatch) -> None:
    """Every sampled row must be one row as it was added (no mixing of columns or rows)."""
    ids = batch.reward.astype(np.int64)
    np.testing.assert_array_equal(batch.obs, np.repeat(ids[:, None], batch.obs.shape[1], axis=1))
    np.testing.assert_array_equal(batch.next_obs, batch.obs + 0.5)
    np.testing.assert_array_equal(batch.action, ids % 2)


def test_the_factorys_uniform_buffer_satisfies_the_replay_contract() -> None:
    spec = SampleSpec((OBS_DIM,), "float32", (), "int64", num_actions=2)
    buf = make_replay(ReplayConfig(capacity=4), spec, seed=0)
    assert isinstance(buf, Replay)
    assert type(buf) is UniformReplay


def test_fill_then_wrap_overwrites_oldest() -> None:
    buf = make_buffer(5)
    buf.add(make_batch([0, 1, 2]))
    assert len(buf) == 3
    assert stored_ids(buf) == [0, 1, 2]
    buf.add(make_batch([3, 4, 5, 6]))  # wraps: 5 and 6 overwrite 0 and 1
    assert len(buf) == 5
    assert stored_ids(buf) == [5, 6, 2, 3, 4]
    assert buf.total_added == 7


def test_len_capped_at_capacity() -> None:
    buf = make_buffer(10)
    for start in range(0, 100, 7):
        buf.add(make_batch(range(start, start + 7)))
        assert len(buf) == min(10, start + 7)
    assert buf.capacity == 10
    assert buf.total_added == 105


def test_batch_larger_than_capacity_keeps_newest() -> None:
    buf = make_buffer(4)
    buf.add(make_batch([100]))
    buf.add(make_batch(range(10)))
    assert len(buf) == 4
    assert sorted(stored_ids(buf)) == [6, 7, 8, 9]
    assert buf.total_added == 11
    # Next add continues FIFO order: the oldest survivor (6) goes first.
    buf.add(make_batch([42]))
    assert sorted(stored_ids(buf)) == [7, 8, 9, 42]


def test_samples_only_stored_rows() -> None:
    buf = make_buffer(8)
    buf.add(make_batch(range(20)))  # keeps 12..19
    batch = buf.sample(500).batch
    assert batch.size == 500
    assert set(batch.reward.astype(int).tolist()) <= set(range(12, 20))
    assert_rows_consistent(batch)


def test_sample_before_full_uses_only_filled_rows() -> None:
    buf = make_buffer(100)
    buf.add(make_batch([7, 8, 9]))
    ids = set(buf.sample(300).batch.reward.astype(int).tolist())
    assert ids == {7, 8, 9}  # never the zero-filled empty slots


def test_sample_is_roughly_uniform() -> None:
    """Chi-square on slot counts: 20 slots, 20k draws; 19 dof has p=0.001 at ~43.8."""
    k, draws = 20, 20_000
    buf = make_buffer(k, seed=123)
    buf.add(make_batch(range(k)))
    counts = np.bincount(buf.sample(draws).batch.reward.astype(int), minlength=k)
    expected = draws / k
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8


def test_sample_returns_copies() -> None:
    buf = make_buffer(4)
    buf.add(make_batch(range(4)))
    batch = buf.sample(8).batch
    batch.obs[:] = -1
    assert min(stored_ids(buf)) == 0


def test_seed_makes_sampling_reproducible() -> None:
    a, b = make_buffer(50, seed=7), make_buffer(50, seed=7)
    a.add(make_batch(range(50)))
    b.add(make_batch(range(50)))
    np.testing.assert_array_equal(a.sample(32).batch.reward, b.sample(32).batch.reward)


def test_uint8_image_obs_and_continuous_actions_preserved() -> None:
    obs_shape, act_dim, n = (4, 84, 84), 3, 6
    buf = UniformReplay(16, obs_shape, "uint8", (act_dim,), np.float32, seed=0)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, size=(n, *obs_shape), dtype=np.uint8)
    action = rng.standard_normal((n, act_dim)).astype(np.float32)
    batch = TransitionBatch(
        obs=obs,
        action=action,
        reward=np.arange(n, dtype=np.float32),
        next_obs=255 - obs,
        discount=np.ones(n, dtype=np.float32),
    )
    buf.add(batch)
    out = buf.sample(10).batch
    assert out.obs.dtype == np.uint8 and out.obs.shape == (10, *obs_shape)
    assert out.next_obs.dtype == np.uint8 and out.next_obs.shape == (10, *obs_shape)
    assert out.action.dtype == np.float32 and out.action.shape == (10, act_dim)
    assert out.reward.dtype == np.float32 and out.reward.shape == (10,)
    assert out.discount.dtype == np.float32 and out.discount.shape == (10,)
    rows = out.reward.astype(int)
    np.testing.assert_array_equal(out.obs, obs[rows])
    np.testing.assert_array_equal(out.next_obs, 255 - obs[rows])
    np.testing.assert_array_equal(out.action, action[rows])


def test_sample_on_empty_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        make_buffer(4).sample(1)


def test_sample_non_positive_batch_raises() -> None:
    buf = make_buffer(4)
    buf.add(make_batch([1]))
    with pytest.raises(ValueError):
        buf.sample(0)


def test_nbytes_matches_preallocation() -> None:
    cap = 1000
    buf = UniformReplay(cap, (4, 84, 84), np.uint8, (2,), np.float32)
    per_row = 2 * 4 * 84 * 84 * 1 + 2 * 4 + 4 + 4  # obs + next_obs, action, reward, discount
    assert buf.nbytes == cap * per_row


def with_column(batch: TransitionBatch, **columns: np.ndarray) -> TransitionBatch:
    """``batch`` with some columns swapped (``_replace`` trips on TransitionBatch's ``__len__``)."""
    return TransitionBatch(**{**batch._asdict(), **columns})


def test_add_rejects_wrong_shapes() -> None:
    buf = make_buffer(4)
    good = make_batch([1, 2])
    with pytest.raises(ValueError, match="obs"):
        buf.add(with_column(good, obs=np.zeros((2, OBS_DIM + 1), np.float32)))
    with pytest.raises(ValueError, match="action"):
        buf.add(with_column(good, action=np.zeros((3,), np.int64)))
    with pytest.raises(ValueError, match="reward"):
        buf.add(with_column(good, reward=np.zeros((2, 1), np.float32)))
    with pytest.raises(ValueError, match="dtype"):
        buf.add(with_column(good, action=np.zeros((2,), np.float32)))
    assert len(buf) == 0


def test_add_empty_batch_is_noop() -> None:
    buf = make_buffer(4)
    buf.add(make_batch([]))
    assert len(buf) == 0 and buf.total_added == 0


def test_concurrent_add_and_sample_never_tear_rows() -> None:
    """A writer wraps a small ring many times while a reader samples; no row may be half-written.

    Wide obs rows make each column copy long enough that a missing lock would be caught mixing
    one add's obs with another add's next_obs/reward.
    """
    obs_dim, cap, rounds = 256, 64, 400
    buf = make_buffer(cap, obs_dim=obs_dim)
    buf.add(make_batch(range(cap), obs_dim=obs_dim))
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            for r in range(1, rounds + 1):
                buf.add(make_batch(range(r * 50, r * 50 + 50), obs_dim=obs_dim))
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)
        finally:
            stop.set()

    def reader() -> None:
        try:
            while not stop.is_set():
                assert_rows_consistent(buf.sample(64).batch)
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors, errors[0]
    assert buf.total_added == cap + rounds * 50
