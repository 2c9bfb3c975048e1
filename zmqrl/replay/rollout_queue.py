"""The on-policy learner's store: a bounded first-in, first-out queue of rollouts, each trained on once.

An on-policy agent (APPO, IMPALA) learns from what its actors' recent policies did, so there is no
replay: rollouts wait in arrival order until the trainer takes a batch of them, and are gone after
it. The queue is bounded in env steps; when it is full, ingest waits for room, its socket is not
read, and the actors' sends block (the same backpressure as a replay ratio's, and never unbounded
memory). :class:`RolloutQueue` is the store (``zmqrl.core.Replay``: ``add``, ``sample``, ``len``)
and :class:`QueueLimiter` its limiter (the ``RateLimiter`` interface: ``await_insert`` waits for
room, ``await_sample`` for a batch), so the learner's ingest thread and training loop drive them
as they drive replay and its ratio.

No deadlock: the queue admits any message of at most ``max_message_rows`` rows whenever it holds
less than a batch (``room``), so a trainer waiting for a batch and an inserter waiting for
room cannot both wait; the run's spec caps a message's rows at exactly that (``message_rows``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from zmqrl.core import Sampled
from zmqrl.replay.ratelimit import STAT_INSERT_BLOCKED, STAT_SAMPLE_BLOCKED, count_stats
from zmqrl.spec import DEFAULT_QUEUE_BATCHES, message_rows, queue_rows
from zmqrl.types import Batch, RolloutBatch, TransitionBatch, rollout_columns

__all__ = [
    "DEFAULT_QUEUE_BATCHES",
    "QueueLimiter",
    "RolloutQueue",
    "merge_rows",
    "message_rows",
    "queue_rows",
    "split_rows",
]


class RolloutQueue:
    """Rollouts in arrival order, at most ``capacity_rows`` of them; see the module docstring.

    Rows are kept one rollout each (with their own truncation observations), so a batch is any
    whole number of them whatever messages they came in. ``add`` and ``sample`` are all or
    nothing, under one lock, from the ingest thread and the training loop respectively.
    """

    def __init__(self, capacity_rows: int, batch_rows: int, rollout_length: int) -> None:
        if not 1 <= batch_rows <= capacity_rows:
            raise ValueError(f"need 1 <= batch rows {batch_rows} <= capacity rows {capacity_rows}")
        self._capacity_rows = capacity_rows
        self.rollout_length = rollout_length
        self._rows: deque[RolloutBatch] = deque()
        self._nbytes = 0
        self._total_added = 0  # env steps ever added
        self.cond = threading.Condition()  # guards the rows; QueueLimiter waits on it
        self._cond = self.cond

    # --- the store ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Env steps held (rows x rollout length), the unit of ``agent.batch_size``."""
        with self._cond:
            return len(self._rows) * self.rollout_length

    @property
    def capacity(self) -> int:
        return self._capacity_rows * self.rollout_length

    @property
    def nbytes(self) -> int:
        with self._cond:
            return self._nbytes

    @property
    def total_added(self) -> int:
        return self._total_added

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        """Queue ``batch``'s rollouts (``priorities`` mean nothing here). Call after
        ``await_insert(batch.size)`` admitted it; ValueError (nothing queued) if it does not fit."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"the rollout queue holds RolloutBatch rows, not {type(batch).__name__}")
        if batch.length != self.rollout_length:
            raise ValueError(
                f"rollouts of {batch.length} steps in a queue of {self.rollout_length}-step rows"
            )
        rows = split_rows(batch)  # before the lock: nothing is queued unless all of it is
        with self._cond:
            if len(self._rows) + len(rows) > self._capacity_rows:
                raise ValueError(
                    f"{len(rows)} rollouts do not fit: {len(self._rows)} of {self._capacity_rows} held"
                )
            self._rows.extend(rows)
            self._nbytes += sum(row_nbytes(row) for row in rows)
            self._total_added += batch.size

    def sample(self, batch_size: int, updates: int) -> Sampled:
        """Take the oldest ``batch_size`` env steps of rollouts off the queue (they are not seen
        again). Call after ``await_sample(batch_size)`` admitted it."""
        if batch_size % self.rollout_length:
            raise ValueError(f"batch of {batch_size} steps is not whole {self.rollout_length}-step rollouts")
        n = batch_size // self.rollout_length
        with self._cond:
            if len(self._rows) < n:
                raise ValueError(f"{n} rollouts asked for, {len(self._rows)} queued")
            taken = [self._rows.popleft() for _ in range(n)]
            self._nbytes -= sum(row_nbytes(row) for row in taken)
        return Sampled(merge_rows(taken), importance=None, ids=None, metrics={})

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """No-op: a queue has no priorities."""

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch:
        raise NotImplementedError(
            "the rollout queue is not checkpointed (its rollouts are minutes old at most)"
        )

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        raise NotImplementedError("the rollout queue is not checkpointed")

    def rng_state(self) -> dict[str, object]:
        return {}  # first in, first out: nothing random

    def set_rng_state(self, state: dict[str, object]) -> None:
        """Nothing to restore (see ``rng_state``)."""

    def stats(self) -> dict[str, float | int]:
        with self._cond:
            return {"queue_rollouts": len(self._rows), "queue_capacity_rollouts": self._capacity_rows}

    def __repr__(self) -> str:
        return (
            f"RolloutQueue({len(self._rows)}/{self._capacity_rows} rollouts of {self.rollout_length} steps)"
        )

    # What QueueLimiter waits on (under the queue's lock).

    def room(self, steps: int) -> bool:
        return (len(self._rows) + math.ceil(steps / self.rollout_length)) <= self._capacity_rows

    def ready(self, steps: int) -> bool:
        return len(self._rows) * self.rollout_length >= steps


class QueueLimiter:
    """The ``RateLimiter`` interface over a :class:`RolloutQueue`: inserts wait for room, samples
    for a batch (see the module docstring for why neither can wait forever on the other)."""

    def __init__(self, queue: RolloutQueue) -> None:
        self.queue = queue
        self._cond = queue.cond
        self._inserted = 0  # env steps inserted / sampled, for the stats
        self._sampled = 0
        self._closed = False
        self._blocked = {STAT_INSERT_BLOCKED: 0.0, STAT_SAMPLE_BLOCKED: 0.0}

    def can_insert(self, n: int) -> bool:
        with self._cond:
            return self.queue.room(n)

    def can_sample(self, n: int) -> bool:
        with self._cond:
            return self.queue.ready(n)

    def await_insert(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for room for ``n`` env steps; False when timed out or closed
        (then nothing may be added: the caller checks its stop flag)."""
        return self._await(lambda: self.queue.room(n), STAT_INSERT_BLOCKED, timeout)

    def await_sample(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until ``n`` env steps of rollouts are queued; False when timed
        out or closed."""
        return self._await(lambda: self.queue.ready(n), STAT_SAMPLE_BLOCKED, timeout)

    def _await(self, admitted: Callable[[], bool], stat: str, timeout: float) -> bool:
        with self._cond:
            if self._closed:
                return False
            if admitted():
                return True
            start = time.monotonic()
            try:
                ok = self._cond.wait_for(lambda: self._closed or admitted(), timeout)
                return bool(ok) and not self._closed
            finally:
                self._blocked[stat] += time.monotonic() - start

    def record_wait(self, stat: str, seconds: float) -> None:
        """Count ``seconds`` a side waited outside ``await_*`` (see RateLimiter.record_wait)."""
        with self._cond:
            self._blocked[stat] += max(0.0, seconds)

    def inserted(self, n: int) -> None:
        """Count ``n`` env steps queued and wake a trainer waiting for a batch."""
        with self._cond:
            self._inserted += n
            self._cond.notify_all()

    def sampled(self, n: int) -> None:
        """Count ``n`` env steps taken and wake an inserter waiting for room."""
        with self._cond:
            self._sampled += n
            self._cond.notify_all()

    def reset(self, inserted: int = 0, sampled: int = 0) -> None:
        """Nothing to re-balance: the queue's contents are its only state."""

    def close(self) -> None:
        """Release every waiter for good (each await returns False): the run is ending."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def stats(self) -> dict[str, float]:
        with self._cond:
            return count_stats(self._inserted, self._sampled, dict(self._blocked))

    def __repr__(self) -> str:
        return f"QueueLimiter({self.queue!r})"


def split_rows(batch: RolloutBatch) -> list[RolloutBatch]:
    """One RolloutBatch per row, each with its own truncation observations (``final_obs`` is in
    row-major order of ``truncated``, so row r's are the next ``truncated[r].sum()`` of them).
    Views, not copies: a received message's frames are read-only, and the rows keep them alive."""
    counts = batch.truncated.sum(axis=1)
    ends = np.cumsum(counts)
    starts = ends - counts
    return [
        RolloutBatch(
            batch.obs[r : r + 1],
            batch.action[r : r + 1],
            batch.reward[r : r + 1],
            batch.terminated[r : r + 1],
            batch.truncated[r : r + 1],
            batch.logp[r : r + 1],
            batch.final_obs[int(starts[r]) : int(ends[r])],
            None if batch.core_state is None else batch.core_state[r : r + 1],
        )
        for r in range(batch.rows)
    ]


def merge_rows(rows: list[RolloutBatch]) -> RolloutBatch:
    """Rows back into one batch, in order (``final_obs`` stays row-major: rows are concatenated
    in the same order as their flags)."""
    if len(rows) == 1:
        return rows[0]
    columns = zip(*(rollout_columns(row) for row in rows), strict=True)
    return RolloutBatch(*(np.concatenate(column) for column in columns))


def row_nbytes(row: RolloutBatch) -> int:
    return sum(int(column.nbytes) for column in rollout_columns(row))
