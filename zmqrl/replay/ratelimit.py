"""Replay-ratio limiting for the learner: keep "samples trained on" per "transition inserted" near a target.

Without a limiter the learner's two threads run free: a fast learner with few actors re-samples the
same transitions many times (overfitting a stale buffer), and a slow learner with many actors lets
most transitions expire unseen. Like Reverb's ``SampleToInsertRatio``, ``RateLimiter`` makes the
faster side wait so that, counted since the limiter started,

    sampled ≈ (inserted - min_size) * samples_per_insert

i.e. no training before ``min_size`` transitions exist, and afterwards ``samples_per_insert`` (SPI)
sampled transitions per inserted one, give or take ``tolerance`` inserted transitions.

Quantities (all in *sampled-transition* units; ``spi = samples_per_insert``)::

    C     = min_size * spi                     centre offset: sampling starts only at min_size
    E     = tolerance * spi                    error buffer: allowed distance from the ideal line
    slack = (inserted - min_size) * spi - sampled  = (inserted * spi - sampled) - C

``slack > 0``: the data is ahead of the learner; ``slack < 0``: the learner is ahead of the data.

Admission rules (``n`` = rows to sample, ``m`` = rows to insert):

* sample n  iff  ``inserted >= min_size``  and  (``slack - n >= -E``  or  ``slack >= 0``)
* insert m  iff  ``slack + m * spi <= E``  or  ``slack <= 0``

The first alternative of each rule is the plain window: after the operation the learner is at most
``tolerance`` inserts ahead of the data (sampling), or the data at most ``tolerance`` inserts ahead
of the learner (inserting). The second alternative, a check of the state *before* the operation,
only matters for a batch bigger than the whole error buffer (``n > E`` or ``m * spi > E``): such a
batch can never fit the window, so it is admitted once its side is not already ahead. Equivalently,
the window on each side widens to ``max(E, batch)``, so the overshoot is bounded by one batch.

No deadlock (whatever n, m, spi, tolerance, min_size, and from any state, including one set by
``reset``). Suppose a sampler of batch n is blocked. Then either

* ``inserted < min_size``: ``(inserted - min_size)`` is a negative integer, so its product with
  ``spi > 0`` is negative, and subtracting ``sampled >= 0`` keeps it so; ``slack <= 0`` and any
  insert is admitted; or
* ``slack < 0`` (the sample rule's second alternative failed): then ``slack <= 0`` and any insert
  is admitted.

Symmetrically, a blocked inserter means ``slack > 0``, so ``slack >= 0``; if also
``inserted >= min_size`` every sample is admitted, and if not, ``slack <= 0`` (above) contradicts
``slack > 0``. So at every instant at least one side may proceed, and it proceeds towards the
other's admission: inserts only raise ``slack``, samples only lower it. The argument holds in
floating point too: ``slack`` is computed once per check and compared with 0 by both rules, and for
any float ``slack >= 0 or slack <= 0`` is true (``slack`` is never NaN: the counts are integers and
``spi`` is finite). What the limiter cannot prevent is a side that simply stops (actors paused): the
other side then waits, which is why every wait takes a timeout and returns False rather than hang.

Concurrency: the check in ``await_*`` and the count in ``inserted``/``sampled`` are separate calls,
so the limiter is exact with one thread per side (the learner's ingest thread and its training
loop): the other side's operations in between only move ``slack`` in the admitted side's favour.
Several threads on one side may overshoot by their concurrent batches.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Final

# Keys of ``stats``; also the names the learner logs them under.
STAT_INSERTED: Final = "inserted"
STAT_SAMPLED: Final = "sampled"
STAT_RATIO: Final = "ratio"
STAT_INSERT_BLOCKED: Final = "insert_blocked_seconds"
STAT_SAMPLE_BLOCKED: Final = "sample_blocked_seconds"

# The smallest legal tolerance: a window of zero inserts would admit only batches that fit exactly.
MIN_TOLERANCE: Final = 1

Clock = Callable[[], float]


def _check_count(name: str, value: int) -> int:
    """Batch sizes and counters are non-negative integers; a float would break the exact
    integer part of the no-deadlock argument, so reject it rather than round silently."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _check_timeout(timeout: float) -> float:
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be finite and >= 0, got {timeout!r}")
    return float(timeout)


class RateLimiter:
    """Blocks the inserting or the sampling side so that sampled/inserted tracks ``samples_per_insert``.

    Protocol for each side: ``if limiter.await_insert(m, timeout): replay.add(...);
    limiter.inserted(m)`` (and the same with ``await_sample``/``sampled``). A False return means
    the timeout passed; the caller does its housekeeping (heartbeats, stop flags) and asks again.
    """

    def __init__(
        self, samples_per_insert: float, tolerance: int, min_size: int, clock: Clock = time.monotonic
    ) -> None:
        if not (math.isfinite(samples_per_insert) and samples_per_insert > 0):
            raise ValueError(f"samples_per_insert must be finite and > 0, got {samples_per_insert!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < MIN_TOLERANCE:
            raise ValueError(f"tolerance must be an int >= {MIN_TOLERANCE}, got {tolerance!r}")
        self._spi = float(samples_per_insert)
        self._tolerance = tolerance
        self._min_size = _check_count("min_size", min_size)
        self._error_buffer = tolerance * self._spi
        self._clock = clock
        self._cond = threading.Condition()
        self._inserted = 0
        self._sampled = 0
        self._closed = False
        # Finished waits are summed here; waits in progress are kept by start time so that `stats`,
        # read by a heartbeat while a side is stuck, already shows the time it has been stuck.
        self._blocked_total = {STAT_INSERT_BLOCKED: 0.0, STAT_SAMPLE_BLOCKED: 0.0}
        self._waiting: dict[int, tuple[str, float]] = {}
        self._wait_ids = itertools.count()

    @property
    def samples_per_insert(self) -> float:
        return self._spi

    @property
    def tolerance(self) -> int:
        return self._tolerance

    @property
    def min_size(self) -> int:
        return self._min_size

    # ------------------------------------------------------------------ admission (lock held)
    def _slack(self) -> float:
        """Data ahead of the learner, in sampled-transition units, relative to the ideal line."""
        return (self._inserted - self._min_size) * self._spi - self._sampled

    def _can_insert(self, m: int) -> bool:
        slack = self._slack()
        return slack <= 0 or slack + m * self._spi <= self._error_buffer

    def _can_sample(self, n: int) -> bool:
        if self._inserted < self._min_size:
            return False
        slack = self._slack()
        return slack >= 0 or slack - n >= -self._error_buffer

    # ------------------------------------------------------------------ public API
    def can_insert(self, n: int) -> bool:
        """Whether ``await_insert(n, 0)`` would return True now (never waits, records nothing)."""
        _check_count("n", n)
        with self._cond:
            return self._closed or self._can_insert(n)

    def can_sample(self, n: int) -> bool:
        """Whether ``await_sample(n, 0)`` would return True now (never waits, records nothing)."""
        _check_count("n", n)
        with self._cond:
            return self._closed or self._can_sample(n)

    def await_insert(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``n`` rows may be inserted.

        True: insert them now, then call ``inserted(n)``. False: timed out (the learner is too far
        behind); nothing changed, ask again after housekeeping."""
        _check_count("n", n)
        return self._await(lambda: self._can_insert(n), STAT_INSERT_BLOCKED, _check_timeout(timeout))

    def await_sample(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``n`` rows may be sampled.

        True: sample them now, then call ``sampled(n)``. False: timed out (too few inserts since
        the last sample, or fewer than ``min_size`` so far); ask again after housekeeping."""
        _check_count("n", n)
        return self._await(lambda: self._can_sample(n), STAT_SAMPLE_BLOCKED, _check_timeout(timeout))

    def _await(self, admitted: Callable[[], bool], stat: str, timeout: float) -> bool:
        with self._cond:
            if self._closed or admitted():
                return True  # the common case costs one lock round trip and no clock reads
            if timeout == 0:
                return False
            start = self._clock()
            deadline = start + timeout
            wait_id = next(self._wait_ids)
            self._waiting[wait_id] = (stat, start)
            try:
                while True:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                    if self._closed or admitted():
                        return True
            finally:
                del self._waiting[wait_id]
                self._blocked_total[stat] += self._clock() - start

    def record_wait(self, stat: str, seconds: float) -> None:
        """Count ``seconds`` a side waited outside ``await_*`` (``STAT_SAMPLE_BLOCKED``: a training
        loop that waited for data elsewhere, on its intake; ``STAT_INSERT_BLOCKED``: a group held
        because the ratio refused it), in the same totals its waits inside are counted in."""
        with self._cond:
            self._blocked_total[stat] += max(0.0, seconds)

    def inserted(self, n: int) -> None:
        """Record ``n`` rows inserted into replay; wakes a sampler that was waiting for data."""
        _check_count("n", n)
        with self._cond:
            self._inserted += n
            self._cond.notify_all()

    def sampled(self, n: int) -> None:
        """Record ``n`` rows sampled for training; wakes an inserter that was waiting for the learner."""
        _check_count("n", n)
        with self._cond:
            self._sampled += n
            self._cond.notify_all()

    def reset(self, inserted: int = 0, sampled: int = 0) -> None:
        """Start counting afresh from the given counts, waking every waiter to re-check.

        For a learner resumed with a restored replay that already holds ``>= min_size`` rows,
        ``reset(inserted=min_size)`` puts it exactly on the ideal line: it may sample at once, and
        actors may insert too. Passing the checkpoint's counts instead keeps the long-run ratio (a
        side that was ahead then waits for the other). No values can deadlock (module docstring).
        Blocked-time totals are kept: they measure the process, not the counting epoch."""
        _check_count("inserted", inserted)
        _check_count("sampled", sampled)
        with self._cond:
            self._inserted = inserted
            self._sampled = sampled
            self._cond.notify_all()

    def close(self) -> None:
        """Release every waiter for good: from now on both awaits return True at once.

        Used at shutdown so neither thread sits out a timeout before noticing its stop flag."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def stats(self) -> dict[str, float]:
        """Counts since start (or ``reset``), their ratio (NaN before any insert), and seconds spent
        waiting in each ``await_*`` (timed-out waits and waits still in progress included)."""
        with self._cond:
            blocked = dict(self._blocked_total)
            if self._waiting:
                now = self._clock()
                for stat, start in self._waiting.values():
                    blocked[stat] += now - start
            return count_stats(self._inserted, self._sampled, blocked)

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self._spi}, tolerance={self._tolerance}, "
            f"min_size={self._min_size})"
        )


class NoLimit:
    """The same interface as ``RateLimiter`` but never waits, so the learner has one code path.

    It still counts, so the achieved ratio is logged even when nothing enforces it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inserted = 0
        self._sampled = 0
        self._closed = False

    def can_insert(self, n: int) -> bool:
        return True

    def can_sample(self, n: int) -> bool:
        return True

    def await_insert(self, n: int, timeout: float) -> bool:
        return True

    def await_sample(self, n: int, timeout: float) -> bool:
        return True

    def record_wait(self, stat: str, seconds: float) -> None:
        """Nothing to count: without a ratio neither side ever waits on the limiter."""

    def inserted(self, n: int) -> None:
        _check_count("n", n)
        with self._lock:
            self._inserted += n

    def sampled(self, n: int) -> None:
        _check_count("n", n)
        with self._lock:
            self._sampled += n

    def reset(self, inserted: int = 0, sampled: int = 0) -> None:
        _check_count("inserted", inserted)
        _check_count("sampled", sampled)
        with self._lock:
            self._inserted = inserted
            self._sampled = sampled

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stats(self) -> dict[str, float]:
        with self._lock:
            return count_stats(
                self._inserted, self._sampled, {STAT_INSERT_BLOCKED: 0.0, STAT_SAMPLE_BLOCKED: 0.0}
            )

    def __repr__(self) -> str:
        return "NoLimit()"


def count_stats(inserted: int, sampled: int, blocked: dict[str, float]) -> dict[str, float]:
    """A limiter's ``stats``: its counts, their ratio (NaN before any insert) and ``blocked``, the
    seconds each side waited."""
    return {
        STAT_INSERTED: float(inserted),
        STAT_SAMPLED: float(sampled),
        STAT_RATIO: sampled / inserted if inserted else math.nan,
        **blocked,
    }


def make_rate_limiter(
    samples_per_insert: float | None, tolerance: int, min_size: int
) -> RateLimiter | NoLimit:
    """``NoLimit`` when no ratio is configured (None), else a ``RateLimiter`` with the real clock."""
    if samples_per_insert is None:
        return NoLimit()
    return RateLimiter(samples_per_insert, tolerance, min_size)
