"""Tests for the n-step reference (tests/nstep_reference.py): n-step folding with hand-computed
numbers, plus a property check.

Observations are 1-element arrays holding the step index t (obs_t = [t], next_obs = [t + 1]), so
every emitted transition says which step it starts at and which obs it bootstraps from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nstep_reference import NStepProcessor, Transition, VectorNStep, to_batch
from zmqrl.core import StepProcessor
from zmqrl.types import EpisodeStat

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


# ------------------------------------------------------------------------------ VectorNStep
#
# Vector observations are rows [env, row, 0]: row r of sub-env j is the observation the vector env
# returned at call r, so next_obs of call r is obs_at(j, r + 1) and every emitted transition says
# which sub-env and call it started at and which observation it bootstraps from. A row in its
# autoreset step gets a garbage action and reward, which must never show up anywhere.

AUTORESET_REWARD = 1e6  # gymnasium gives 0; something unmistakable proves the row is ignored
AUTORESET_ACTION = 77


def vo(env: int, row: int) -> np.ndarray:
    return np.array([env, row, 0], dtype=np.float32)


def vstep(
    vec: VectorNStep,
    row: int,
    rewards: list[float],
    term: list[bool] | None = None,
    trunc: list[bool] | None = None,
    actions: list[int] | None = None,
) -> list[Transition]:
    """One vector call at ``row`` for every sub-env (obs rows ``row``, next_obs rows ``row + 1``)."""
    e = vec.num_envs
    return vec.step(
        np.stack([vo(j, row) for j in range(e)]),
        np.array(actions if actions is not None else [100 * j + row for j in range(e)], dtype=np.int64),
        np.array(rewards, dtype=np.float32),
        np.array(term or [False] * e),
        np.array(trunc or [False] * e),
        np.stack([vo(j, row + 1) for j in range(e)]),
    )


def env_of(tr: Transition) -> int:
    return int(tr[0][0])


def row_of(tr: Transition) -> int:
    return int(tr[0][1])


def boot_row(tr: Transition) -> int:
    assert int(tr[3][0]) == env_of(tr), "bootstrap obs from another sub-env"
    return int(tr[3][1])


def test_vector_windows_never_mix_sub_envs() -> None:
    """Sub-env j earns 10**j per step: every n-step sum is a multiple of one power of ten only."""
    vec = VectorNStep(3, n=3, gamma=1.0)
    out: list[Transition] = []
    for row in range(6):
        out += vstep(vec, row, [1.0, 10.0, 100.0])
    assert len(out) == 3 * 4 and vec.real_steps == 3
    for tr in out:
        assert tr[2] == 3 * 10.0 ** env_of(tr)
        assert boot_row(tr) == row_of(tr) + 3 and tr[4] == 1.0
        assert tr[1] == 100 * env_of(tr) + row_of(tr), "each transition keeps its own sub-env's action"
    assert vec.env_steps == [6, 6, 6] and len(vec) == 3 * 2


def test_vector_order_is_env_major_then_step() -> None:
    vec = VectorNStep(3, n=2, gamma=0.5)
    vstep(vec, 0, [1.0, 1.0, 1.0])
    out = vstep(vec, 1, [1.0, 1.0, 1.0], term=[True, False, True])
    assert [(env_of(t), row_of(t)) for t in out] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]


def test_vector_autoreset_step_is_skipped_and_not_counted() -> None:
    vec = VectorNStep(2, n=3, gamma=0.5)
    vstep(vec, 0, [1.0, 2.0])
    ended = vstep(vec, 1, [1.0, 2.0], term=[True, False])
    assert [(env_of(t), row_of(t)) for t in ended] == [(0, 0), (0, 1)]
    assert vec.ended == [(0, EpisodeStat(2.0, 2))] and vec.real_steps == 2
    # Call 2: sub-env 0 is in its autoreset step (garbage action/reward), sub-env 1 steps on.
    out = vstep(vec, 2, [AUTORESET_REWARD, 2.0], actions=[AUTORESET_ACTION, 1])
    assert [(env_of(t), row_of(t)) for t in out] == [(1, 0)]
    assert vec.real_steps == 1 and vec.ended == [] and vec.env_steps == [2, 3]
    assert len(vec.processors[0]) == 0, "the autoreset row must not enter the window"
    # Call 3: sub-env 0's new episode starts from the reset obs (row 3), and only real rewards count.
    vstep(vec, 3, [5.0, 2.0])
    (first,) = vstep(vec, 4, [5.0, 2.0], term=[True, False])[:1]
    assert (env_of(first), row_of(first)) == (0, 3) and first[2] == pytest.approx(5.0 + 0.5 * 5.0)
    assert first[4] == 0.0 and vec.ended == [(0, EpisodeStat(10.0, 2))]


def test_vector_truncation_bootstraps_from_final_obs_and_termination_from_nothing() -> None:
    vec = VectorNStep(2, n=3, gamma=0.5)
    vstep(vec, 0, [1.0, 1.0])
    out = vstep(vec, 1, [2.0, 2.0], term=[True, False], trunc=[False, True])
    by_env = {j: [t for t in out if env_of(t) == j] for j in (0, 1)}
    assert [t[4] for t in by_env[0]] == [0.0, 0.0]  # terminated: no bootstrap
    assert [t[2] for t in by_env[0]] == pytest.approx([2.0, 2.0])
    # truncated: gamma**k to the real final observation (row 2, returned by this very call)
    assert [boot_row(t) for t in by_env[1]] == [2, 2]
    assert [t[4] for t in by_env[1]] == pytest.approx([0.25, 0.5])
    assert [t[2] for t in by_env[1]] == pytest.approx([2.0, 2.0])
    assert vec.autoreset == [True, True]


def test_vector_one_env_ending_does_not_flush_the_others() -> None:
    vec = VectorNStep(3, n=4, gamma=0.9)
    vstep(vec, 0, [1.0, 1.0, 1.0])
    vstep(vec, 1, [1.0, 1.0, 1.0])
    out = vstep(vec, 2, [1.0, 1.0, 1.0], trunc=[False, True, False])
    assert {env_of(t) for t in out} == {1}
    assert [len(p) for p in vec.processors] == [3, 0, 3]


def test_vector_reset_and_validation() -> None:
    vec = VectorNStep(2, n=3, gamma=0.9)
    vstep(vec, 0, [1.0, 1.0], term=[True, False])
    vec.reset()
    assert len(vec) == 0 and vec.autoreset == [False, False] and vec.env_steps == [1, 1]
    assert vec.episode_return == [0.0, 0.0] and vec.episode_length == [0, 0]
    with pytest.raises(ValueError):
        VectorNStep(0, 3, 0.9)
    with pytest.raises(ValueError):
        vstep(vec, 0, [1.0, 1.0, 1.0])


EpisodeScript = tuple[list[float], str]  # (rewards, end kind) of one episode of one sub-env


def _rows(episodes: list[EpisodeScript]) -> list[tuple[float, bool, bool, bool]]:
    """A sub-env's calls as (reward, terminated, truncated, is_autoreset), autoreset rows included."""
    rows = []
    for rewards, end in episodes:
        last = len(rewards) - 1
        for t, r in enumerate(rewards):
            term = t == last and end in (END_TERMINATED, END_BOTH)
            trunc = t == last and end in (END_TRUNCATED, END_BOTH)
            rows.append((r, term, trunc, False))
        if end != END_NONE:
            rows.append((AUTORESET_REWARD, False, False, True))
    return rows


def _reference(
    rows: list[tuple[float, bool, bool, bool]], n: int, gamma: float
) -> list[tuple[int, float, int, float]]:
    """Brute force from one sub-env's own trajectory: (start row, n-step reward, boot row, discount)."""
    episodes: list[tuple[list[int], str]] = []  # (rows of the real steps, end kind)
    current: list[int] = []
    for r, (_, term, trunc, reset) in enumerate(rows):
        if reset:
            continue
        current.append(r)
        if term or trunc:
            episodes.append((current, END_TERMINATED if term else END_TRUNCATED))
            current = []
    if current:
        episodes.append((current, END_NONE))
    out = []
    for ep_rows, end in episodes:
        length = len(ep_rows)
        for t, start_row in enumerate(ep_rows):
            k = min(n, length - t)
            if end == END_NONE and k < n:
                continue  # still pending in the window
            ret = sum(gamma**i * rows[ep_rows[t + i]][0] for i in range(k))
            boot = ep_rows[t + k - 1] + 1  # the obs returned by the window's last real step
            discount = 0.0 if end == END_TERMINATED and t + k == length else gamma**k
            out.append((start_row, ret, boot, discount))
    return out


episode_scripts = st.lists(
    st.tuples(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=8),
        st.sampled_from([END_TERMINATED, END_TRUNCATED, END_BOTH]),
    ),
    min_size=1,
    max_size=5,
)


@settings(database=None, max_examples=150, deadline=None)
@given(
    scripts=st.lists(episode_scripts, min_size=1, max_size=4),
    cut=st.integers(1, 40),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_vector_property_matches_per_env_brute_force(
    scripts: list[list[EpisodeScript]], cut: int, n: int, gamma: float
) -> None:
    """Lockstep vector calls (autoreset rows included, cut at an arbitrary call) give each sub-env
    exactly the transitions computed from its own trajectory, in order, and nothing else."""
    per_env = [_rows(s) for s in scripts]
    calls = min(cut, *(len(r) for r in per_env))
    per_env = [r[:calls] for r in per_env]
    e = len(per_env)
    vec = VectorNStep(e, n, gamma)
    got: list[list[tuple[int, float, int, float]]] = [[] for _ in range(e)]
    real_total = 0
    ended: list[list[EpisodeStat]] = [[] for _ in range(e)]
    for row in range(calls):
        rewards = [per_env[j][row][0] for j in range(e)]
        term = [per_env[j][row][1] for j in range(e)]
        trunc = [per_env[j][row][2] for j in range(e)]
        actions = [AUTORESET_ACTION if per_env[j][row][3] else row for j in range(e)]
        out = vec.step(
            np.stack([vo(j, row) for j in range(e)]),
            np.array(actions, dtype=np.int64),
            np.array(rewards, dtype=np.float64),
            np.array(term),
            np.array(trunc),
            np.stack([vo(j, row + 1) for j in range(e)]),
        )
        assert [env_of(t) for t in out] == sorted(env_of(t) for t in out), "env-major order"
        for tr in out:
            assert tr[1] != AUTORESET_ACTION and tr[1] == row_of(tr)
            got[env_of(tr)].append((row_of(tr), tr[2], boot_row(tr), tr[4]))
        real_total += vec.real_steps
        for j, stat in vec.ended:
            ended[j].append(stat)
    for j in range(e):
        want = _reference(per_env[j], n, gamma)
        assert [g[0] for g in got[j]] == [w[0] for w in want]
        for g, w in zip(got[j], want, strict=True):
            assert math.isclose(g[1], w[1], rel_tol=1e-9, abs_tol=1e-9)
            assert g[2] == w[2]
            assert math.isclose(g[3], w[3], rel_tol=1e-12, abs_tol=1e-15)
        real_rows = [r for r in per_env[j] if not r[3]]
        assert vec.env_steps[j] == len(real_rows)
        ends = [i for i, r in enumerate(real_rows) if r[1] or r[2]]
        starts = [0, *(i + 1 for i in ends)]
        expected_stats = [
            EpisodeStat(sum(r[0] for r in real_rows[a : b + 1]), b + 1 - a)
            for a, b in zip(starts, ends, strict=False)
        ]
        assert [s.length for s in ended[j]] == [s.length for s in expected_stats]
        for s, x in zip(ended[j], expected_stats, strict=True):
            assert math.isclose(s.ret, x.ret, rel_tol=1e-9, abs_tol=1e-9)
    assert real_total == sum(vec.env_steps)
