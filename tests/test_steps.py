"""Tests for zmqrl.steps: n-step folding with hand-computed numbers, plus a property check.

Observations are 1-element arrays holding the step index t (obs_t = [t], next_obs = [t + 1]), so
every emitted transition says which step it starts at and which obs it bootstraps from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqrl.core import StepProcessor
from zmqrl.steps import NStepProcessor, Transition, to_batch

END_NONE, END_TERMINATED, END_TRUNCATED, END_BOTH = "none", "terminated", "truncated", "both"


def o(t: float) -> np.ndarray:
    return np.array([t], dtype=np.float32)


def run_episode(
    proc: NStepProcessor, rewards: list[float], end: str = END_NONE, offset: int = 0
) -> list[Transition]:
    """Feed one episode; step t has obs [offset+t], action offset+t, and the given reward."""
    out: list[Transition] = []
    last = len(rewards) - 1
    for t, r in enumerate(rewards):
        term = t == last and end in (END_TERMINATED, END_BOTH)
        trunc = t == last and end in (END_TRUNCATED, END_BOTH)
        out += proc.step(o(offset + t), offset + t, r, term, trunc, o(offset + t + 1))
    return out


def start(tr: Transition) -> int:
    return int(tr[0][0])


def boot(tr: Transition) -> int:
    return int(tr[3][0])


def test_satisfies_protocol() -> None:
    assert isinstance(NStepProcessor(3, 0.99), StepProcessor)


def test_three_step_return_hand_computed() -> None:
    proc = NStepProcessor(n=3, gamma=0.5)
    assert proc.step(o(0), 0, 1.0, False, False, o(1)) == []
    assert proc.step(o(1), 1, 2.0, False, False, o(2)) == []
    (first,) = proc.step(o(2), 2, 3.0, False, False, o(3))
    # 1 + 0.5*2 + 0.25*3 = 2.75, bootstrapping from the obs after step 3 (index 2) with 0.5**3
    assert start(first) == 0 and first[1] == 0
    assert first[2] == pytest.approx(2.75)
    assert boot(first) == 3
    assert first[4] == pytest.approx(0.125)
    (second,) = proc.step(o(3), 3, 4.0, False, False, o(4))
    assert start(second) == 1
    assert second[2] == pytest.approx(2 + 0.5 * 3 + 0.25 * 4)  # 4.5
    assert boot(second) == 4 and second[4] == pytest.approx(0.125)
    assert len(proc) == 2


def test_termination_inside_window() -> None:
    """Two-step episode with n=3: both steps flushed with discount 0 and partial sums."""
    proc = NStepProcessor(n=3, gamma=0.5)
    out = run_episode(proc, [1.0, 2.0], END_TERMINATED)
    assert [start(t) for t in out] == [0, 1]
    assert out[0][2] == pytest.approx(1 + 0.5 * 2)  # 2.0
    assert out[1][2] == pytest.approx(2.0)
    assert [t[4] for t in out] == [0.0, 0.0]
    assert len(proc) == 0


def test_termination_with_full_window() -> None:
    """n=2, γ=0.5, rewards 1,2,3, terminated: step 0 left the window normally before the end."""
    proc = NStepProcessor(n=2, gamma=0.5)
    out = run_episode(proc, [1.0, 2.0, 3.0], END_TERMINATED)
    assert [start(t) for t in out] == [0, 1, 2]
    assert [t[2] for t in out] == pytest.approx([1 + 0.5 * 2, 2 + 0.5 * 3, 3.0])  # 2.0, 3.5, 3.0
    assert [t[4] for t in out] == pytest.approx([0.25, 0.0, 0.0])
    assert boot(out[0]) == 2


def test_truncation_bootstraps_with_gamma_to_the_k() -> None:
    """Time-limit end after 3 steps with n=3: k = 3, 2, 1 steps to the end, all from the final obs."""
    proc = NStepProcessor(n=3, gamma=0.5)
    out = run_episode(proc, [1.0, 2.0, 3.0], END_TRUNCATED)
    assert [start(t) for t in out] == [0, 1, 2]
    assert [t[2] for t in out] == pytest.approx([2.75, 3.5, 3.0])
    assert [t[4] for t in out] == pytest.approx([0.125, 0.25, 0.5])
    assert [boot(t) for t in out] == [3, 3, 3]  # the final observation, never a reset obs


def test_truncation_after_window_filled() -> None:
    proc = NStepProcessor(n=2, gamma=0.5)
    out = run_episode(proc, [1.0, 1.0, 1.0, 1.0], END_TRUNCATED)
    assert [start(t) for t in out] == [0, 1, 2, 3]
    assert [t[4] for t in out] == pytest.approx([0.25, 0.25, 0.25, 0.5])
    assert [boot(t) for t in out] == [2, 3, 4, 4]


def test_one_step_is_td0() -> None:
    proc = NStepProcessor(n=1, gamma=0.9)
    (tr,) = proc.step(o(0), 0, 5.0, False, False, o(1))
    assert (start(tr), tr[2], boot(tr)) == (0, 5.0, 1) and tr[4] == pytest.approx(0.9)
    (tr,) = proc.step(o(1), 1, 6.0, False, True, o(2))
    assert tr[4] == pytest.approx(0.9)
    (tr,) = proc.step(o(2), 2, 7.0, True, False, o(3))
    assert tr[2] == 7.0 and tr[4] == 0.0


def test_long_episode_emits_one_transition_per_step() -> None:
    proc = NStepProcessor(n=4, gamma=0.99)
    out = run_episode(proc, [1.0] * 50, END_TERMINATED)
    assert len(out) == 50
    assert [start(t) for t in out] == list(range(50))


def test_consecutive_episodes_never_mix() -> None:
    """Episode 1 has rewards 100 (truncated mid-window), episode 2 rewards 1: no 100s leak."""
    proc = NStepProcessor(n=3, gamma=1.0)
    ep1 = run_episode(proc, [100.0, 100.0], END_TRUNCATED)
    ep2 = run_episode(proc, [1.0] * 5, END_TERMINATED, offset=1000)
    assert len(ep1) == 2 and len(ep2) == 5
    assert all(start(t) >= 1000 for t in ep2)
    assert [t[2] for t in ep2] == [3.0, 3.0, 3.0, 2.0, 1.0]


def test_terminated_and_truncated_counts_as_terminated() -> None:
    proc = NStepProcessor(n=3, gamma=0.5)
    out = run_episode(proc, [1.0, 2.0], END_BOTH)
    assert [t[4] for t in out] == [0.0, 0.0]


def test_reset_drops_pending_steps() -> None:
    proc = NStepProcessor(n=3, gamma=0.5)
    run_episode(proc, [9.0, 9.0])
    assert len(proc) == 2
    proc.reset()
    out = run_episode(proc, [1.0], END_TERMINATED, offset=10)
    assert [(start(t), t[2]) for t in out] == [(10, 1.0)]


@pytest.mark.parametrize(("n", "gamma"), [(0, 0.9), (2, -0.1), (2, 1.5)])
def test_invalid_args_raise(n: int, gamma: float) -> None:
    with pytest.raises(ValueError):
        NStepProcessor(n, gamma)


def test_to_batch_stacks_columns() -> None:
    proc = NStepProcessor(n=2, gamma=0.5)
    out = run_episode(proc, [1.0, 2.0, 3.0], END_TERMINATED)
    batch = to_batch(out, np.float32, np.int64)
    assert batch.obs.shape == (3, 1) and batch.obs.dtype == np.float32
    assert batch.next_obs.shape == (3, 1)
    assert batch.action.dtype == np.int64 and batch.action.tolist() == [0, 1, 2]
    assert batch.reward.dtype == np.float32 and batch.reward.tolist() == [2.0, 3.5, 3.0]
    assert batch.discount.dtype == np.float32 and batch.discount.tolist() == [0.25, 0.0, 0.0]
    assert batch.size == 3


def test_to_batch_continuous_actions_and_uint8_obs() -> None:
    tr = (np.zeros((2, 3), np.uint8), np.ones(4, np.float64), 1.0, np.ones((2, 3), np.uint8), 0.9)
    batch = to_batch([tr, tr], "uint8", np.float32)
    assert batch.obs.shape == (2, 2, 3) and batch.obs.dtype == np.uint8
    assert batch.action.shape == (2, 4) and batch.action.dtype == np.float32


def test_to_batch_empty_raises() -> None:
    with pytest.raises(ValueError):
        to_batch([], np.float32, np.int64)


@settings(database=None)  # no .hypothesis/ folder in the repo
@given(
    rewards=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=25),
    n=st.integers(1, 6),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    end=st.sampled_from([END_NONE, END_TERMINATED, END_TRUNCATED, END_BOTH]),
)
def test_property_matches_direct_sum(rewards: list[float], n: int, gamma: float, end: str) -> None:
    proc = NStepProcessor(n, gamma)
    out = run_episode(proc, rewards, end)
    length = len(rewards)
    ended = end != END_NONE
    expected_count = length if ended else max(0, length - n + 1)
    assert len(out) == expected_count
    assert [start(t) for t in out] == list(range(expected_count))
    for tr in out:
        t = start(tr)
        k = min(n, length - t)
        assert ended or k == n
        direct = sum(gamma**i * rewards[t + i] for i in range(k))
        assert math.isclose(tr[2], direct, rel_tol=1e-9, abs_tol=1e-9)
        assert boot(tr) == t + k
        terminated_in_window = end in (END_TERMINATED, END_BOTH) and t + k == length
        expected_discount = 0.0 if terminated_in_window else gamma**k
        assert math.isclose(tr[4], expected_discount, rel_tol=1e-12, abs_tol=1e-15)
    assert len(proc) == (0 if ended else min(length, n - 1))
