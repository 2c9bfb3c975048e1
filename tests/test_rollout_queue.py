"""The on-policy learner's rollout queue: first in first out, bounded, all or nothing, no deadlock."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from zmqrl.replay.rollout_queue import (
    QueueLimiter,
    RolloutQueue,
    merge_rows,
    message_rows,
    queue_rows,
    split_rows,
)
from zmqrl.types import RolloutBatch, TransitionBatch

T = 4


def rollouts(rows: int, first: int = 0, truncate_at: tuple[tuple[int, int], ...] = ()) -> RolloutBatch:
    """``rows`` rollouts whose every value says which rollout it belongs to (``first``, ``first+1``...),
    truncated at the given (row, step) pairs, each with a final observation naming both."""
    ids = np.arange(first, first + rows, dtype=np.float32)
    truncated = np.zeros((rows, T), bool)
    for r, t in truncate_at:
        truncated[r, t] = True
    final = [[first + r, t] for r, t in sorted(truncate_at)]
    return RolloutBatch(
        obs=np.repeat(ids[:, None, None], T + 1, axis=1) * np.ones((1, 1, 2), np.float32),
        action=np.zeros((rows, T), np.int64),
        reward=np.repeat(ids[:, None], T, axis=1),
        terminated=np.zeros((rows, T), bool),
        truncated=truncated,
        logp=np.full((rows, T), -0.5, np.float32),
        final_obs=np.array(final, np.float32).reshape(len(final), 2),
    )


def test_sizes_come_from_the_batch_and_the_queue_and_a_message_always_fits_below_a_batch() -> None:
    assert queue_rows(batch_size=32, rollout_length=T, queue_steps=None) == (8, 16)
    assert queue_rows(batch_size=32, rollout_length=T, queue_steps=40) == (8, 10)
    assert message_rows(8, 16) == 9
    with pytest.raises(ValueError, match=r"multiple of actor\.rollout_length"):
        queue_rows(batch_size=30, rollout_length=T, queue_steps=None)
    with pytest.raises(ValueError, match=r"at least agent\.batch_size"):
        queue_rows(batch_size=32, rollout_length=T, queue_steps=16)
    # Whatever the queue holds while a trainer still waits for a batch (fewer than 8 rows), a
    # message of message_rows rows fits: neither side can wait on the other forever.
    queue = RolloutQueue(capacity_rows=16, batch_rows=8, rollout_length=T)
    limiter = QueueLimiter(queue)
    for held in range(8):
        assert not limiter.can_sample(32)
        assert limiter.can_insert(9 * T), held
        queue.add(rollouts(1, first=held))


def test_rollouts_leave_in_arrival_order_each_once_with_their_own_truncation_observations() -> None:
    queue = RolloutQueue(capacity_rows=8, batch_rows=2, rollout_length=T)
    queue.add(rollouts(3, first=0, truncate_at=((0, 1), (2, 0), (2, 3))))
    queue.add(rollouts(1, first=3, truncate_at=((0, 2),)))
    assert len(queue) == 4 * T and queue.total_added == 4 * T

    first = queue.sample(2 * T, updates=0).batch
    second = queue.sample(2 * T, updates=1).batch
    assert isinstance(first, RolloutBatch) and isinstance(second, RolloutBatch)
    assert first.reward[:, 0].tolist() == [0, 1] and second.reward[:, 0].tolist() == [2, 3]
    # final_obs stays in row-major order of the truncated flags, whichever messages rows came in.
    assert first.final_obs.tolist() == [[0, 1]]
    assert second.final_obs.tolist() == [[2, 0], [2, 3], [3, 2]]
    assert len(queue) == 0 and queue.nbytes == 0
    with pytest.raises(ValueError, match="asked for"):
        queue.sample(2 * T, updates=2)


def test_an_add_that_does_not_fit_queues_nothing() -> None:
    queue = RolloutQueue(capacity_rows=4, batch_rows=2, rollout_length=T)
    queue.add(rollouts(3))
    with pytest.raises(ValueError, match="do not fit"):
        queue.add(rollouts(2, first=3))
    assert len(queue) == 3 * T
    with pytest.raises(TypeError, match="RolloutBatch"):
        queue.add(TransitionBatch(*(np.zeros((1, 1)) for _ in range(5))))
    with pytest.raises(ValueError, match="steps"):
        queue.add(rollouts(1)._replace(reward=np.zeros((1, T + 1), np.float32)))


def test_split_and_merge_are_inverse() -> None:
    batch = rollouts(3, truncate_at=((1, 0), (1, 2)))
    merged = merge_rows(split_rows(batch))
    for column, original in zip(merged, batch, strict=True):
        np.testing.assert_array_equal(column, original)


def test_a_full_queue_holds_the_inserter_until_the_trainer_takes_a_batch() -> None:
    queue = RolloutQueue(capacity_rows=4, batch_rows=2, rollout_length=T)
    limiter = QueueLimiter(queue)
    queue.add(rollouts(4))
    limiter.inserted(4 * T)
    assert not limiter.await_insert(T, timeout=0.0)
    admitted = threading.Event()

    def insert() -> None:
        if limiter.await_insert(T, timeout=30.0):
            admitted.set()

    inserter = threading.Thread(target=insert)
    inserter.start()
    assert not admitted.is_set()
    assert limiter.await_sample(2 * T, timeout=0.0)
    queue.sample(2 * T, updates=0)
    limiter.sampled(2 * T)  # wakes the inserter: there is room now
    inserter.join(timeout=30)
    assert admitted.is_set()
    assert limiter.stats["inserted"] == 4 * T and limiter.stats["sampled"] == 2 * T


def test_closing_releases_every_waiter_with_a_refusal() -> None:
    queue = RolloutQueue(capacity_rows=2, batch_rows=2, rollout_length=T)
    limiter = QueueLimiter(queue)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(limiter.await_sample(2 * T, timeout=30.0)))
    waiter.start()
    limiter.close()
    waiter.join(timeout=30)
    assert results == [False]
    assert not limiter.await_insert(T, timeout=0.0), "nothing is added once the run is ending"


def test_ingest_queues_fresh_rollouts_and_counts_stale_ones_without_queueing_them() -> None:
    from zmqrl.learner.ingest import Ingest, LearnerCounters
    from zmqrl.spec import SampleSpec
    from zmqrl.transport.wire import SamplesMsg

    spec = SampleSpec((2,), "float32", (), "int64", num_actions=2, max_batch=9, rollout_length=T)
    queue = RolloutQueue(capacity_rows=16, batch_rows=8, rollout_length=T)
    limiter = QueueLimiter(queue)
    counters = LearnerCounters()
    ingest = Ingest(
        queue,
        limiter,
        counters,
        spec=spec,
        published_version=lambda: 10,
        min_replay_size=32,
        max_policy_lag=3,
    )

    def msg(seq: int, version: int) -> SamplesMsg:
        return SamplesMsg(actor_id=0, seq=seq, weights_version=version, batch=rollouts(2), episodes=[])

    assert ingest.accept(msg(0, version=8))  # lag 2: queued
    assert ingest.accept(msg(1, version=5))  # lag 5 > 3: dropped, counted
    assert len(queue) == 2 * T and counters.samples == 2 * T
    assert counters.stale_batches == 1 and counters.stale_samples == 2 * T
    assert not ingest.replay_ready.is_set()  # a batch is 8 rollouts; 2 are queued
    for seq in range(2, 5):
        ingest.accept(msg(seq, version=10))
    assert ingest.replay_ready.is_set() and limiter.can_sample(32)
