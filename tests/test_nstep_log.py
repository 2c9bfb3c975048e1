"""The actor's array n-step path (zmqrl.actor.nstep_log) against the per-transition reference.

The reference is what the actor did before: ``NStepProcessor`` (one env) or ``VectorNStep`` (a
vector env, autoreset steps included) per step, the weights versions each window's steps were
acted with (``ActedVersions``), and a batch cut when ``send_batch`` transitions have piled up,
stacked by ``to_batch``. On random episodes (random rewards, terminations, truncations, both,
versions moving on) both must give the same batches at the same steps: equal rows in equal
order, bit for bit, and the same oldest version; and the same episodes and step counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.nstep_reference import ActedVersions, NStepProcessor, Transition, VectorNStep, to_batch
from zmqrl.actor.nstep_log import NStepLog
from zmqrl.types import EpisodeStat, TransitionBatch

OBS = 3  # observation size: [sub-env, step, noise]
AUTORESET_REWARD = 1e6  # gymnasium gives 0; anything else must never show up


def assert_same_batch(got: TransitionBatch, want: TransitionBatch) -> None:
    for name in ("obs", "action", "reward", "next_obs", "discount"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


class Reference:
    """The old actor's path: per-step folding, a pending list, a batch at ``send_batch``."""

    def __init__(self, envs: int, n: int, gamma: float, send_batch: int, vector: bool) -> None:
        self.vector = vector
        self.single = NStepProcessor(n, gamma)
        self.vec = VectorNStep(envs, n, gamma)
        self.acted = ActedVersions(envs)
        self.pending: list[Transition] = []
        self.version: int | None = None
        self.send_batch = send_batch

    def step(self, *step: np.ndarray, version: int) -> None:
        obs, actions, rewards, term, trunc, next_obs = step
        if self.vector:
            fed = [not reset for reset in self.vec.autoreset]
            emitted = self.vec.step(obs, actions, rewards, term, trunc, next_obs)
            oldest = self.acted.step(version, fed, [len(p) for p in self.vec.processors])
        else:
            emitted = self.single.step(
                obs[0], actions[0], float(rewards[0]), bool(term[0]), bool(trunc[0]), next_obs[0]
            )
            oldest = self.acted.step(version, [True], [len(self.single)])
        if oldest is not None:
            self.version = oldest if self.version is None else min(self.version, oldest)
            self.pending.extend(emitted)

    def take(self) -> tuple[TransitionBatch, int] | None:
        if len(self.pending) < self.send_batch:
            return None
        batch = to_batch(self.pending, np.float32, np.int64)
        assert self.version is not None
        version, self.pending, self.version = self.version, [], None
        return batch, version


def random_steps(
    rng: np.random.Generator, envs: int, calls: int, vector: bool, end_p: float
) -> list[tuple[np.ndarray, ...]]:
    """``calls`` steps of ``envs`` sub-envs: obs rows [j, t, noise], random ends; with a vector
    env the row after an end is an autoreset step (garbage action and reward, no end flags)."""
    steps = []
    resetting = np.zeros(envs, dtype=bool)
    for t in range(calls):
        obs = np.stack([[j, t, rng.normal()] for j in range(envs)]).astype(np.float32)
        next_obs = np.stack([[j, t + 0.5, rng.normal()] for j in range(envs)]).astype(np.float32)
        actions = rng.integers(0, 5, envs).astype(np.int64)
        rewards = rng.normal(0, 3, envs)
        term = rng.random(envs) < end_p
        trunc = rng.random(envs) < end_p
        if vector:
            actions[resetting] = 99
            rewards[resetting] = AUTORESET_REWARD
            term[resetting] = trunc[resetting] = False
            resetting = term | trunc
        steps.append((obs, actions, rewards, term, trunc, next_obs))
    return steps


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("envs", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_array_path_equals_the_per_transition_reference(n: int, envs: int, seed: int) -> None:
    rng = np.random.default_rng([seed, n, envs])
    gamma = float(rng.choice([0.0, 0.5, 0.9, 0.99, 1.0]))
    send_batch = int(rng.choice([1, 7, 16, 64]))
    vector = envs > 1
    end_p = float(rng.choice([0.02, 0.1, 0.4]))
    ref = Reference(envs, n, gamma, send_batch, vector)
    log = NStepLog(envs, n, gamma, send_batch, np.float32, np.int64)
    version = 0
    batches = 0
    for step in random_steps(rng, envs, 600, vector, end_p):
        version += int(rng.random() < 0.05)
        ref.step(*step, version=version)
        obs, actions, rewards, term, trunc, next_obs = step
        if vector:
            real = log.add(obs, actions, rewards, term, trunc, next_obs, version)
            assert real == ref.vec.real_steps
            assert log.ended == ref.vec.ended
            assert log.env_steps.tolist() == ref.vec.env_steps
        else:
            log.add_single(
                obs[0], actions[0], float(rewards[0]), bool(term[0]), bool(trunc[0]), next_obs[0], version
            )
        want = ref.take()
        assert log.ready == (want is not None)
        assert len(log) == (len(ref.pending) if want is None else want[0].size)
        if want is not None:
            batch, got_version = log.take()
            assert_same_batch(batch, want[0])
            assert got_version == want[1]
            batches += 1
            assert len(log) == 0 and not log.ready
    assert batches > 0


def test_truncation_bootstraps_from_the_final_obs_and_termination_from_nothing() -> None:
    """By hand, n = 3, gamma = 0.5: sub-env 0 terminates at its 2nd step, sub-env 1 is truncated."""
    log = NStepLog(2, 3, 0.5, 4, np.float32, np.int64)
    obs = [np.array([[0, t], [1, t]], np.float32) for t in range(3)]
    log.add(
        obs[0],
        np.array([0, 0]),
        np.array([1.0, 1.0]),
        np.array([False, False]),
        np.array([False, False]),
        obs[1],
        7,
    )
    log.add(
        obs[1],
        np.array([1, 1]),
        np.array([2.0, 2.0]),
        np.array([True, False]),
        np.array([False, True]),
        obs[2],
        8,
    )
    assert log.ended == [(0, EpisodeStat(3.0, 2)), (1, EpisodeStat(3.0, 2))]
    batch, version = log.take()
    assert version == 7
    assert batch.obs[:, 0].tolist() == [0, 0, 1, 1] and batch.obs[:, 1].tolist() == [0, 1, 0, 1]
    assert batch.reward.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert batch.discount.tolist() == [0.0, 0.0, 0.25, 0.5]
    assert batch.next_obs[:, 1].tolist() == [2, 2, 2, 2]
    # The next step is both sub-envs' autoreset step: no transition, no reward counted.
    assert (
        log.add(
            obs[2], np.array([5, 5]), np.array([9.0, 9.0]), np.zeros(2, bool), np.zeros(2, bool), obs[0], 9
        )
        == 0
    )
    assert len(log) == 0 and log.env_steps.tolist() == [2, 2]


def test_take_without_a_complete_transition_raises() -> None:
    log = NStepLog(1, 3, 0.9, 1, np.float32, np.int64)
    log.add_single(np.zeros(2, np.float32), 0, 1.0, False, False, np.zeros(2, np.float32), 0)
    with pytest.raises(ValueError):
        log.take()
