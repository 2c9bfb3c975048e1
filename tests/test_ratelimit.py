"""The replay-ratio limiter: the ratio holds, each side waits and is released, it never deadlocks."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqrl.replay.ratelimit import (
    STAT_INSERT_BLOCKED,
    STAT_INSERTED,
    STAT_RATIO,
    STAT_SAMPLE_BLOCKED,
    STAT_SAMPLED,
    NoLimit,
    RateLimiter,
    make_rate_limiter,
)

# A wait that is expected to time out: long enough to be a real wait, short enough to keep the file fast.
SHORT = 0.02
# A wait that is expected to succeed: generous, so a slow shared machine cannot fail the test.
LONG = 5.0
# A wait that only close() may end while the test looks: far longer than any test waits for it.
FOREVER = 300.0
# Operations each side of a free-running pair completes (each asserting the window) before it stops.
PAIR_OPERATIONS = 300
# Float slack for comparing counts multiplied by a float ratio.
EPS = 1e-6


def slack(lim: RateLimiter) -> float:
    """Data ahead of the learner relative to the ideal line, from the public stats."""
    s = lim.stats
    return (s[STAT_INSERTED] - lim.min_size) * lim.samples_per_insert - s[STAT_SAMPLED]


class FakeClock:
    """A clock the test moves by hand, so blocked-time stats are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``target`` on a daemon thread; its return value lands in the list."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(target()), daemon=True)
    t.start()
    return t, out


def wait_until_waiting(lim: RateLimiter, stat: str) -> None:
    """Spin briefly until a thread is inside an await (its in-progress wait shows in ``stats``)."""
    deadline = time.monotonic() + LONG
    while not lim._waiting:  # the one private peek: "a thread has started waiting"
        assert time.monotonic() < deadline, "thread never started waiting"
        time.sleep(0.001)
    assert any(s == stat for s, _ in lim._waiting.values())


# ---------------------------------------------------------------------------------------- basics


def test_sampler_waits_for_min_size() -> None:
    lim = RateLimiter(samples_per_insert=2.0, tolerance=5, min_size=10)
    assert not lim.await_sample(1, 0)
    lim.inserted(9)
    assert not lim.await_sample(1, SHORT)
    lim.inserted(1)
    assert lim.await_sample(1, 0)
    # On the ideal line at min_size: up to tolerance * spi = 10 samples may run ahead.
    lim.sampled(10)
    assert not lim.await_sample(1, 0)
    lim.inserted(1)  # one insert buys spi = 2 samples
    assert lim.await_sample(2, 0)
    assert not lim.await_sample(3, 0)


def test_inserter_blocked_when_ahead_and_released_by_sampling() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=2, min_size=0)
    assert lim.await_insert(2, 0)
    lim.inserted(2)
    assert not lim.await_insert(1, SHORT)  # would be 3 inserts ahead of the learner
    t, out = start(lambda: lim.await_insert(1, LONG))
    wait_until_waiting(lim, STAT_INSERT_BLOCKED)
    assert lim.await_sample(1, 0)
    lim.sampled(1)
    t.join(LONG)
    assert out == [True]


def test_sampler_blocked_when_ahead_and_released_by_inserting() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=2, min_size=0)
    assert lim.await_sample(2, 0)
    lim.sampled(2)
    assert not lim.await_sample(1, SHORT)  # would be 3 samples ahead of the data
    t, out = start(lambda: lim.await_sample(1, LONG))
    wait_until_waiting(lim, STAT_SAMPLE_BLOCKED)
    lim.inserted(1)
    t.join(LONG)
    assert out == [True]


def test_window_is_tolerance_either_side_with_fractional_ratio() -> None:
    lim = RateLimiter(samples_per_insert=0.5, tolerance=4, min_size=2)
    lim.inserted(2)  # on the line; window is 4 * 0.5 = 2 sampled transitions either side
    assert lim.can_sample(2)
    lim.sampled(1)  # slack -1
    assert lim.can_sample(1) and not lim.can_sample(2)
    lim.inserted(2)  # slack 0
    assert lim.can_insert(4) and lim.can_insert(100)  # slack 0: any insert (see big batches)
    lim.inserted(1)  # slack 0.5
    assert lim.can_insert(3) and not lim.can_insert(4)


def test_big_batches_are_admitted_once_their_side_is_not_ahead() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=2, min_size=0)
    lim.inserted(1)  # slack +1: a batch of 10 cannot fit the window of 2 either way
    assert not lim.can_insert(10)
    assert lim.can_sample(10)  # data is ahead, so the learner may take any batch
    lim.sampled(10)  # slack -9: the learner is far ahead; only inserting is possible
    assert not lim.can_sample(1)
    assert lim.can_insert(50)
    lim.inserted(50)  # slack +41
    assert not lim.can_insert(1)
    assert lim.can_sample(1)


def test_close_releases_waiters_for_good() -> None:
    sampler_side = RateLimiter(samples_per_insert=1.0, tolerance=1, min_size=100)
    inserter_side = RateLimiter(samples_per_insert=1.0, tolerance=1, min_size=0)
    inserter_side.inserted(1)
    # Waits that would outlast the test: only close() can end them before the joins give up.
    ts, out_s = start(lambda: sampler_side.await_sample(1, FOREVER))
    ti, out_i = start(lambda: inserter_side.await_insert(5, FOREVER))
    wait_until_waiting(sampler_side, STAT_SAMPLE_BLOCKED)
    wait_until_waiting(inserter_side, STAT_INSERT_BLOCKED)
    sampler_side.close()
    inserter_side.close()
    ts.join(LONG)
    ti.join(LONG)
    assert out_s == [True] and out_i == [True], "close() must wake the waiters at once"
    for lim in (sampler_side, inserter_side):
        assert lim.closed
        assert lim.await_sample(1_000, LONG) and lim.await_insert(1_000, LONG)


def test_reset_after_learner_restart_unblocks() -> None:
    # A restarted learner builds a fresh limiter: it counts 0 inserts, so it would wait for
    # min_size new transitions although the restored replay already holds them.
    lim = RateLimiter(samples_per_insert=4.0, tolerance=10, min_size=1_000)
    t, out = start(lambda: lim.await_sample(32, LONG))
    wait_until_waiting(lim, STAT_SAMPLE_BLOCKED)
    lim.reset(inserted=lim.min_size)
    t.join(LONG)
    assert out == [True]
    assert lim.can_insert(1)  # on the line: actors are not held back either
    assert lim.stats[STAT_INSERTED] == 1_000 and lim.stats[STAT_SAMPLED] == 0


@pytest.mark.parametrize(("inserted", "sampled"), [(0, 0), (10**6, 0), (0, 10**6), (5, 3), (10**6, 10**9)])
def test_reset_to_any_counts_leaves_one_side_free(inserted: int, sampled: int) -> None:
    lim = RateLimiter(samples_per_insert=2.0, tolerance=3, min_size=50)
    lim.reset(inserted=inserted, sampled=sampled)
    assert lim.can_insert(64) or lim.can_sample(64)


def test_blocked_seconds_count_timed_out_waits() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=1, min_size=1)
    assert lim.stats[STAT_SAMPLE_BLOCKED] == 0.0
    assert not lim.await_sample(1, SHORT)
    assert lim.stats[STAT_SAMPLE_BLOCKED] >= SHORT
    assert lim.stats[STAT_INSERT_BLOCKED] == 0.0
    assert lim.await_sample(1, 0) is False  # timeout 0: an instant check, no waiting recorded
    assert lim.stats[STAT_SAMPLE_BLOCKED] < SHORT * 10


def test_blocked_seconds_grow_during_a_wait_with_fake_clock() -> None:
    clock = FakeClock()
    lim = RateLimiter(samples_per_insert=1.0, tolerance=1, min_size=0, clock=clock)
    lim.inserted(1)
    t, out = start(lambda: lim.await_insert(1, LONG))
    wait_until_waiting(lim, STAT_INSERT_BLOCKED)
    clock.now = 1.5
    assert lim.stats[STAT_INSERT_BLOCKED] == 1.5  # in progress, visible to a heartbeat
    clock.now = 4.0
    assert lim.stats[STAT_INSERT_BLOCKED] == 4.0
    lim.sampled(1)
    t.join(LONG)
    assert out == [True]
    clock.now = 100.0  # finished waits no longer grow
    assert lim.stats[STAT_INSERT_BLOCKED] == 4.0
    assert lim.stats[STAT_SAMPLE_BLOCKED] == 0.0


def test_stats_ratio() -> None:
    lim = RateLimiter(samples_per_insert=2.0, tolerance=5, min_size=0)
    assert math.isnan(lim.stats[STAT_RATIO])
    lim.inserted(4)
    lim.sampled(6)
    assert lim.stats[STAT_RATIO] == 1.5


# ---------------------------------------------------------------------------------------- threads


def run_pair(
    lim: RateLimiter, insert_sizes: list[int], sample_sizes: list[int], check: bool
) -> tuple[int, int]:
    """An inserter and a sampler thread run free until each has completed ``PAIR_OPERATIONS``
    operations (counted, not timed: a loaded machine only makes it slower); each asserts the
    window after every operation it makes (when ``check``). Returns how many each completed."""
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0, 0]
    bound = lim.tolerance * lim.samples_per_insert + EPS

    def side(idx: int, sizes: list[int]) -> None:
        rng = random.Random(idx)
        try:
            while not stop.is_set():
                k = rng.choice(sizes)
                ok = lim.await_insert(k, SHORT) if idx == 0 else lim.await_sample(k, SHORT)
                if not ok:
                    continue
                lim.inserted(k) if idx == 0 else lim.sampled(k)
                done[idx] += 1
                if check and lim.stats[STAT_INSERTED] >= lim.min_size:
                    assert -bound <= slack(lim) <= bound, lim.stats
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=side, args=(i, s), daemon=True)
        for i, s in enumerate((insert_sizes, sample_sizes))
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 2 * LONG
    try:
        while min(done) < PAIR_OPERATIONS and not errors:
            assert time.monotonic() < deadline, f"operations completed {done}: a side is stuck"
            time.sleep(0.005)
    finally:
        stop.set()
    for t in threads:
        t.join(LONG)
        assert not t.is_alive(), "a side hung"
    if errors:
        raise errors[0]
    return done[0], done[1]


@pytest.mark.parametrize(("spi", "tolerance"), [(1.0, 4), (8.0, 2), (0.25, 16)])
def test_ratio_is_enforced_between_free_running_threads(spi: float, tolerance: int) -> None:
    lim = RateLimiter(samples_per_insert=spi, tolerance=tolerance, min_size=20)
    # Batches fit the window, so the exact bound |slack| <= tolerance * spi holds at every check.
    window = tolerance * spi
    sample_sizes = [k for k in (1, 2, 4) if k <= window] or [1]
    insert_sizes = [k for k in (1, 2, 3) if k * spi <= window]
    inserts, samples = run_pair(lim, insert_sizes, sample_sizes, check=True)
    assert inserts >= PAIR_OPERATIONS and samples >= PAIR_OPERATIONS
    s = lim.stats
    assert abs((s[STAT_INSERTED] - lim.min_size) * spi - s[STAT_SAMPLED]) <= window + EPS


def test_no_deadlock_between_threads_with_batches_bigger_than_the_window() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=1, min_size=3)
    inserts, samples = run_pair(lim, [7, 13], [9, 20], check=False)
    assert inserts >= PAIR_OPERATIONS and samples >= PAIR_OPERATIONS


def test_actors_paused_then_resumed() -> None:
    lim = RateLimiter(samples_per_insert=1.0, tolerance=4, min_size=8)
    stop = threading.Event()
    timeouts = [0]
    sampled = [0]

    def learner() -> None:
        while not stop.is_set():
            if lim.await_sample(2, SHORT):
                lim.sampled(2)
                sampled[0] += 2
            else:
                timeouts[0] += 1  # housekeeping happens here; the loop is never stuck

    t = threading.Thread(target=learner, daemon=True)
    t.start()
    for _ in range(20):  # actors running
        if lim.await_insert(1, LONG):
            lim.inserted(1)
    deadline = time.monotonic() + LONG
    while lim.can_sample(2):  # let the learner catch up with what exists
        assert time.monotonic() < deadline
        time.sleep(0.005)
    # Counted from the learner's next timeout on: its last sample may be taken (can_sample is
    # false) but not yet added to `sampled`; a timeout comes in a later round of its loop.
    timeouts_before = timeouts[0]
    while timeouts[0] == timeouts_before:
        assert time.monotonic() < deadline, "the learner's waits never time out"
        time.sleep(0.005)
    before_pause = sampled[0]
    timeouts_before = timeouts[0]
    deadline = time.monotonic() + LONG
    while timeouts[0] - timeouts_before < 3:  # actors paused: the learner times out again and again
        assert time.monotonic() < deadline, "the learner's waits never time out"
        time.sleep(0.005)
    assert sampled[0] == before_pause
    assert t.is_alive()
    for _ in range(20):  # actors resumed
        assert lim.await_insert(1, LONG)
        lim.inserted(1)
    deadline = time.monotonic() + LONG
    while sampled[0] < before_pause + 16:
        assert time.monotonic() < deadline, "learner did not resume"
        time.sleep(0.005)
    stop.set()
    t.join(LONG)
    assert not t.is_alive()


# ---------------------------------------------------------------------------------------- properties


@st.composite
def limiter_walks(draw: st.DrawFn) -> tuple[RateLimiter, list[tuple[int, int, int, int | None]]]:
    spi = draw(st.sampled_from([0.1, 0.25, 1 / 3, 0.5, 1.0, 1.5, 2.0, 4.0, 7.3, 32.0]))
    tolerance = draw(st.integers(1, 20))
    min_size = draw(st.integers(0, 50))
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 200),  # pending insert size
                st.integers(0, 300),  # pending sample size
                st.integers(0, 1),  # preference when both may go
                st.none() | st.integers(0, 1000),  # occasionally a reset
            ),
            min_size=1,
            max_size=60,
        )
    )
    return RateLimiter(spi, tolerance, min_size), steps


@settings(max_examples=300, deadline=None)
@given(limiter_walks())
def test_property_one_side_always_admitted(
    walk: tuple[RateLimiter, list[tuple[int, int, int, int | None]]],
) -> None:
    lim, steps = walk
    window = lim.tolerance * lim.samples_per_insert
    for m, n, prefer_insert, reset_to in steps:
        if reset_to is not None and reset_to % 7 == 0:
            lim.reset(inserted=reset_to, sampled=reset_to * 3 % 1001)
        can_i = lim.await_insert(m, 0)
        can_s = lim.await_sample(n, 0)
        assert can_i or can_s, (lim.stats, m, n)
        before = slack(lim)
        enough = lim.stats[STAT_INSERTED] >= lim.min_size
        # (a), (b): an admitted batch keeps the window after it, or its side was not ahead before
        # (the big-batch rule); a refused one would leave the window and its side is ahead.
        # Tolerant by EPS either way, as spi like 1/3 puts exact boundaries between floats.
        spi = lim.samples_per_insert
        if can_i:
            assert before + m * spi <= window + EPS or before <= EPS
        else:
            assert before + m * spi > window - EPS and before > -EPS
        if can_s:
            assert enough and (before - n >= -window - EPS or before >= -EPS)
        else:
            assert not enough or (before - n < -window + EPS and before < EPS)
        # Hence the overshoot beyond the window is at most one batch, from any state.
        if can_i and (prefer_insert or not can_s):
            lim.inserted(m)
            assert slack(lim) <= max(window, m * spi) + EPS
        else:
            lim.sampled(n)
            assert slack(lim) >= min(-window, -n) - EPS


# ---------------------------------------------------------------------------------------- NoLimit, factory


def test_no_limit_never_blocks() -> None:
    lim = NoLimit()
    t0 = time.monotonic()
    assert lim.await_sample(10**9, LONG)
    assert lim.await_insert(10**9, LONG)
    lim.sampled(100)
    assert lim.await_sample(10**9, LONG)
    assert time.monotonic() - t0 < LONG, "a call waited out its timeout"
    lim.inserted(50)
    s = lim.stats
    assert s[STAT_RATIO] == 2.0 and s[STAT_SAMPLE_BLOCKED] == 0.0 and s[STAT_INSERT_BLOCKED] == 0.0
    lim.reset()
    assert math.isnan(lim.stats[STAT_RATIO])
    lim.close()
    assert lim.closed and lim.await_insert(1, 0)


def test_make_rate_limiter() -> None:
    assert isinstance(make_rate_limiter(None, tolerance=1, min_size=0), NoLimit)
    lim = make_rate_limiter(4.0, tolerance=3, min_size=7)
    assert isinstance(lim, RateLimiter)
    assert (lim.samples_per_insert, lim.tolerance, lim.min_size) == (4.0, 3, 7)


@pytest.mark.parametrize(
    ("spi", "tolerance", "min_size"),
    [(0.0, 1, 0), (-1.0, 1, 0), (math.nan, 1, 0), (math.inf, 1, 0), (1.0, 0, 0), (1.0, 1, -1), (1.0, 1.5, 0)],
)
def test_bad_arguments_rejected(spi: float, tolerance: int, min_size: int) -> None:
    with pytest.raises(ValueError):
        RateLimiter(spi, tolerance, min_size)


def test_bad_sizes_and_timeouts_rejected() -> None:
    lim = RateLimiter(1.0, 1, 0)
    with pytest.raises(ValueError):
        lim.await_insert(-1, 0)
    with pytest.raises(ValueError):
        lim.await_sample(1, -1.0)
    with pytest.raises(ValueError):
        lim.await_sample(1, math.inf)
    with pytest.raises(ValueError):
        lim.inserted(1.5)  # type: ignore[arg-type]
