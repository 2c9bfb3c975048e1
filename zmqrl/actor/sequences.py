"""A recurrent replay actor's sampling loop without sockets: episodes cut into overlapping windows
that carry the core state they start from (R2D2; ``zmqrl.types.SequenceBatch``).

The sequence counterpart of :class:`zmqrl.actor.sampler.Sampler`, driven the same way. It steps
``actor.envs_per_actor`` plain gymnasium envs in lockstep, resetting each as its episode ends,
with one batched greedy ``act`` of the recurrent policy per step (so the policy's state per env
advances on every step, random ones included) and each env's row replaced by a random action
with its rung's epsilon of the Ape-X ladder, as DQN's actors explore.

:class:`SequenceLog` keeps, per env, the current episode's steps since the oldest window still
open, with the core state before each, and hands over a window as soon as it is whole: window k of
an episode covers steps ``k T - B .. k T + T - 1`` (T ``sequence_length``, B ``burn_in``), or as
much of it as the episode has when it ends; the rest is padding (``SequenceBatch.mask``). Its
state is the policy's before its first real step: zero for the first window of an episode.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from zmqrl.actor.adders import Adder
from zmqrl.actor.exploration import RandomActions
from zmqrl.actor.sampler import HOUSEKEEPING_EVERY, LockstepCollector, ladder
from zmqrl.config import Config
from zmqrl.core import Policy, is_recurrent
from zmqrl.spec import SampleSpec
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.types import SEQUENCE_BURN_IN, SEQUENCE_LEARNED, SequenceBatch

# Random streams of the explorer (distinct from the policy's and the envs').
EXPLORE_STREAM = 0x5E0


class _Episode:
    """One env's episode so far, from the first step a window still needs: ``obs[i]`` is the
    observation at episode step ``base + i`` (the newest one not yet acted on), ``actions``,
    ``rewards``, ``states`` and ``versions`` those of each step taken."""

    def __init__(self, first_obs: np.ndarray) -> None:
        self.base = 0
        self.steps = 0  # steps taken in the episode
        self.next_window = 0  # k of the next window to hand over
        self.obs: list[np.ndarray] = [first_obs]
        self.actions: list[int] = []
        self.rewards: list[float] = []
        self.states: list[np.ndarray] = []
        self.versions: list[int] = []


class SequenceLog:
    """Steps of E envs cut into windows of ``burn_in + length`` positions: the step log of a
    recurrent replay actor's adder. Ready when ``rows`` windows are whole; ``take`` hands over
    that many, stamped with the oldest weights version any of their steps was acted with."""

    def __init__(self, spec: SampleSpec, num_envs: int, length: int, burn_in: int, rows: int) -> None:
        if spec.core_size < 1:
            raise ValueError("a sequence log needs the spec's core_size")
        self.spec = spec
        self.length = length
        self.burn_in = burn_in
        self.window = burn_in + length
        self.rows = rows
        self.windows = 0  # windows handed over so far
        self._episodes: list[_Episode | None] = [None] * num_envs
        self._ready: list[tuple[SequenceBatch, int]] = []  # whole windows (one row each) and versions

    @property
    def ready(self) -> bool:
        return len(self._ready) >= self.rows

    def start(self, env: int, obs: np.ndarray) -> None:
        """Env ``env``'s episode begins at ``obs`` (its core state is zero)."""
        self._episodes[env] = _Episode(np.array(obs, self.spec.obs_np_dtype))

    def add(
        self,
        env: int,
        action: int,
        reward: float,
        terminated: bool,
        next_obs: np.ndarray,
        state: np.ndarray,
        version: int,
        ended: bool,
    ) -> None:
        """One step of env ``env``: the action taken from its newest observation, from the core
        state ``state`` ``(2, H)``; ``next_obs`` the observation after it (when the episode
        ``ended``, the one it ended at: terminated, or truncated and bootstrapped from)."""
        episode = self._episodes[env]
        assert episode is not None, "start(env, obs) first"
        episode.actions.append(int(action))
        episode.rewards.append(float(reward))
        episode.states.append(np.array(state, np.float32))
        episode.versions.append(int(version))
        episode.obs.append(np.array(next_obs, self.spec.obs_np_dtype))
        episode.steps += 1
        if ended:
            while episode.next_window * self.length < episode.steps:
                self._close_window(episode, terminated)
            self._episodes[env] = None
            return
        if (episode.next_window + 1) * self.length <= episode.steps:
            self._close_window(episode, False)
            keep_from = max(0, episode.next_window * self.length - self.burn_in)
            drop = keep_from - episode.base
            if drop > 0:
                del episode.obs[:drop], episode.actions[:drop], episode.rewards[:drop]
                del episode.states[:drop], episode.versions[:drop]
                episode.base = keep_from

    def _close_window(self, episode: _Episode, terminated: bool) -> None:
        """Hand over window ``episode.next_window`` as one row (padded past the steps taken)."""
        spec, window, base = self.spec, self.window, episode.base
        start = episode.next_window * self.length - self.burn_in  # episode step of position 0
        episode.next_window += 1
        first, last = max(start, 0), min(start + window, episode.steps)  # real steps [first, last)
        obs = np.empty((window + 1, *spec.obs_shape), spec.obs_np_dtype)
        action = np.zeros(window, np.int64)
        reward = np.zeros(window, np.float32)
        ended = np.zeros(window, bool)
        mask = np.zeros(window, np.uint8)
        for p in range(window + 1):  # padding repeats the nearest real observation
            step = min(max(start + p, 0), episode.steps)
            obs[p] = episode.obs[step - base]
        lo, hi = first - start, last - start
        action[lo:hi] = episode.actions[first - base : last - base]
        reward[lo:hi] = episode.rewards[first - base : last - base]
        mask[lo:hi] = SEQUENCE_LEARNED
        mask[lo : min(hi, self.burn_in)] = SEQUENCE_BURN_IN
        if terminated and last == episode.steps:
            ended[hi - 1] = True
        state = episode.states[first - base]
        version = min(episode.versions[first - base : last - base])
        row = SequenceBatch(obs[None], action[None], reward[None], ended[None], mask[None], state[None])
        self._ready.append((row, version))

    def take(self) -> tuple[SequenceBatch, int]:
        """The oldest ``rows`` whole windows as one batch, and the oldest version they were acted with."""
        taken, self._ready = self._ready[: self.rows], self._ready[self.rows :]
        self.windows += len(taken)
        columns = zip(*(row for row, _ in taken), strict=True)
        batch = SequenceBatch(*(np.concatenate(column) for column in columns))
        return batch, min(version for _, version in taken)


def message_rows(send_batch: int, length: int) -> int:
    """Windows per message: about ``actor.send_batch`` learned steps' worth, at least one."""
    return max(1, math.ceil(send_batch / length))


class SequenceCollector(LockstepCollector[Policy, SequenceLog]):
    """Steps its envs with the recurrent policy and epsilon-random rows into ``adder``'s
    ``SequenceLog``; weights are offered every ``actor.weights_poll_steps`` only."""

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        policy: Policy,
        envs: list[Any],
        spec: SampleSpec,
        *,
        weights: WeightsClient,
        adder: Adder[SequenceLog],
        seed: int,
        replacement: bool = False,
    ) -> None:
        if not is_recurrent(policy):
            raise TypeError(f"a sequence actor needs a recurrent policy, got {type(policy).__name__}")
        super().__init__(cfg, policy, envs, weights=weights, adder=adder, seed=seed)
        self.epsilons = ladder(cfg, actor_id)
        self.epsilon_decay = 0 if replacement else cfg.actor.epsilon_decay_steps
        self.epsilon = self._epsilon()
        self._rng = np.random.default_rng([seed, EXPLORE_STREAM])
        self._random = RandomActions(spec)
        policy.reset_core()  # type: ignore[attr-defined]
        for j in range(self.num_envs):
            self.log.start(j, self._current[j])

    def describe(self) -> str:
        """How this actor acts, for its start-up line."""
        rungs = " ".join(f"{e:.4f}" for e in self.epsilons)
        return (
            f"recurrent sequences of {self.log.burn_in}+{self.log.length} steps x {self.num_envs} env(s), "
            f"epsilon {rungs} (annealed from 1.0 over {self.epsilon_decay} steps)"
        )

    def counters(self, elapsed: float) -> dict[str, float | int]:
        """What the sampling loop has done, for heartbeats and stats (``elapsed``: its seconds)."""
        return {
            "envs": self.num_envs,
            "steps": self.steps,
            "sequences": self.log.windows,
            "epsilon": float(np.mean(self.epsilon)),
            "weights_version": self.weights.version,
            "steps_per_s": self.steps / max(elapsed, 1e-9),
            **self.adder.episode_counters(),
        }

    def _epsilon(self) -> np.ndarray:
        """Each env's epsilon now: annealed from 1.0 towards its rung."""
        if self.epsilon_decay <= 0:
            return self.epsilons
        fraction = min(1.0, self.steps / self.epsilon_decay)
        return 1.0 + fraction * (self.epsilons - 1.0)

    def _step(self) -> bool:
        """One lockstep step of every env; True when windows are ready."""
        policy = self.policy
        states = self._core_state()
        obs = self._current
        actions = np.array(policy.act(obs, explore=True), np.int64)  # advances every env's state
        random_rows = self._rng.random(self.num_envs) < self.epsilon
        if random_rows.any():
            # A masked run's random rows draw among their own legal actions.
            actions[random_rows] = self._random(self._rng, int(random_rows.sum()), obs[random_rows])
        version = self.weights.version
        done = np.zeros(self.num_envs, bool)
        next_obs = np.empty_like(obs)
        for j, env in enumerate(self.envs):
            observation, reward, term, trunc, _ = env.step(actions[j])
            self._returns[j] += float(reward)
            self._lengths[j] += 1
            ended = bool(term or trunc)
            self.log.add(j, actions[j], float(reward), bool(term), observation, states[j], version, ended)
            if ended:
                done[j] = True
                self._episode_ended(j)
                observation, _ = env.reset()
                self.log.start(j, observation)
            next_obs[j] = observation
        self._current = next_obs
        if done.any():
            policy.reset_core(done)  # type: ignore[attr-defined]
        self.steps += self.num_envs
        if self.steps % HOUSEKEEPING_EVERY < self.num_envs:
            self.epsilon = self._epsilon()
        return self.log.ready
