"""Prioritized replay's bounds (zmqrl/replay/priorities.py): whatever priorities a peer's rows are
given, by the peer itself or by the learner measuring them, they take a bounded share of draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.test_prioritized_replay import LOOSE_BOUNDS, make_batch, make_per
from zmqrl.replay import DEFAULT_MAX_DRAW_RATIO, DEFAULT_MAX_PRIORITY, PriorityBounds

# The poison a peer's rows carry: what they claim (actor priorities) and what the learner measures
# on them (a reward near the largest float32 gives a TD error of about it).
HUGE = 3e38


def poisoned_share(poisoned: int, normal: int, bounds: dict[str, float], steps: int = 400) -> float:
    """A learner's loop over a buffer of ``normal`` honest rows and ``poisoned`` rows: each step
    draws a batch and writes back the rows' |TD error| (~1 for honest rows, HUGE for poisoned
    ones, every time: a reward the network can never fit). Returns the poisoned rows' share of
    the draws after a warm-up."""
    rng = np.random.default_rng(3)
    buf = make_per(normal + poisoned, seed=5, bounds=bounds)
    buf.add(make_batch(range(normal)), rng.uniform(0.5, 1.5, normal))
    buf.add(make_batch(range(normal, normal + poisoned)), np.full(poisoned, HUGE))
    hits = draws = 0
    for step in range(steps):
        _, ids, _ = buf.sample_prioritized(64, beta=0.4)
        bad = ids >= normal
        if step >= steps // 4:
            hits += int(np.count_nonzero(bad))
            draws += ids.size
        buf.update_priorities(ids, np.where(bad, HUGE, rng.uniform(0.5, 1.5, ids.size)))
    assert math.isfinite(buf.total_priority)
    return hits / draws


def test_one_row_measured_at_3e38_is_drawn_about_as_rarely_as_the_bound_allows() -> None:
    # Unbounded (the learner's measurements raised max_priority to 3e38), it took every draw.
    share = poisoned_share(1, 999, bounds={})
    assert share <= 2 * DEFAULT_MAX_DRAW_RATIO / 1000, share


def test_a_peer_with_two_percent_of_the_rows_takes_at_most_about_ratio_times_that() -> None:
    share = poisoned_share(20, 980, bounds={})
    assert share <= 1.25 * DEFAULT_MAX_DRAW_RATIO * 0.02, share


def test_without_the_bounds_the_same_peer_takes_nearly_every_draw() -> None:
    """The scenario above with bounds that never bind (the first release's behaviour): what the
    bounds prevent is real, not an artefact of the simulation."""
    assert poisoned_share(1, 999, bounds=LOOSE_BOUNDS) > 0.9
    assert poisoned_share(20, 980, bounds=LOOSE_BOUNDS) > 0.9


def test_every_stored_priority_is_capped_absolutely() -> None:
    buf = make_per(8, bounds={"max_draw_ratio": 1e30})  # only the absolute cap binds
    buf.add(make_batch(range(4)))
    buf.update_priorities(np.arange(4), np.array([1e30, HUGE, 5.0, 0.0]))
    cap_weight = (DEFAULT_MAX_PRIORITY + buf.priority_eps) ** buf.alpha
    assert buf.max_priority == buf.max_priority_cap == DEFAULT_MAX_PRIORITY
    np.testing.assert_allclose(buf.priorities_of(np.arange(2)), cap_weight)
    buf.add(make_batch([4]), np.array([HUGE]))  # an actor's, after the learner's max
    buf.add(make_batch([5]))  # a row without a priority gets max_priority, so the cap too
    assert buf.priorities_of(np.array([4, 5])).max() <= cap_weight * (1 + 1e-12)
    assert buf.clipped_priorities == 3  # the two learner priorities and the actor's


def test_no_row_is_written_above_the_draw_ratio_times_the_mean_weight() -> None:
    buf = make_per(100, bounds={})
    buf.add(make_batch(range(100)))  # every row at max_priority 1.0: mean weight ~1
    mean_before = buf.total_priority / 100
    buf.update_priorities(np.array([99]), np.array([500.0]))  # below replay.max_priority
    weight = buf.priorities_of(np.array([99]))[0]
    assert weight == pytest.approx(DEFAULT_MAX_DRAW_RATIO * mean_before)  # not 500 ** 0.6 = 41.6
    assert buf.clipped_priorities == 1
    # Rows without a priority get max_priority (now 500), bounded the same way.
    buf.add(make_batch([100]))
    assert buf.priorities_of(np.array([100]))[0] <= DEFAULT_MAX_DRAW_RATIO * buf.total_priority / 100


@pytest.mark.parametrize(
    "setting",
    [
        {"max_priority": 0.0},
        {"max_priority": math.inf},
        {"max_draw_ratio": 0.5},
        {"max_draw_ratio": math.nan},
    ],
)
def test_bounds_that_cannot_work_are_refused(setting: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(setting))):
        PriorityBounds(**setting)
