"""An on-policy actor's sampling loop without sockets: fixed-length rollouts of its env(s).

The on-policy counterpart of :class:`zmqrl.actor.sampler.Sampler`, driven the same way. It steps
``actor.envs_per_actor`` envs in lockstep with one batched ``sample`` of the policy per step into
its adder's ``RolloutLog``, which keeps each action's log-probability and after
``actor.rollout_length`` steps hands over one rollout per env, stamped with the weights version
its first step was acted with (the oldest in it).

The envs are plain gymnasium envs reset here as soon as an episode ends (not a vector env with
gymnasium's autoreset), so every recorded step is a real transition: after a done step the row
continues with the next episode's first observation, and a truncated step keeps the observation
it was cut at for the learner to bootstrap from (``RolloutBatch.final_obs``).

A recurrent policy (``zmqrl.core.RecurrentPolicy``: APPO with ``agent.core: lstm``) keeps one
state per env, in the envs' order; the collector zeroes an env's state after its episode ends (the
next step is an episode's first), and each rollout row carries the state its first step started
from (``RolloutBatch.core_state``), which the learner unrolls the row from.

Weights are offered at the start of every rollout (and every ``actor.weights_poll_steps``): an
on-policy learner wants the freshest behaviour it can get, and the per-step log-probabilities
keep a rollout correct even if its policy changed in the middle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zmqrl.actor.adders import Adder
from zmqrl.actor.sampler import LockstepCollector
from zmqrl.config import Config
from zmqrl.core import SamplingPolicy, is_recurrent
from zmqrl.errors import ConfigError
from zmqrl.spec import SampleSpec, rollout_message_problem
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.types import RolloutBatch


class RolloutLog:
    """Lockstep steps of E envs cut into rollouts of ``length`` steps, one row per env: the step log
    of an on-policy actor's adder. ``take`` hands over the filled rows (copies) stamped with the
    weights version the rollout's first step was acted with; the collector steps no further
    until then."""

    def __init__(self, spec: SampleSpec, num_envs: int, length: int) -> None:
        self.spec = spec
        self.length = length
        self.rollouts = 0  # rows completed so far
        self.t = 0  # steps in the rollout being filled
        # The rollout being filled, one row per env; obs has one more step, the bootstrap.
        self._obs = np.zeros((num_envs, length + 1, *spec.obs_shape), spec.obs_np_dtype)
        self._action = np.zeros((num_envs, length, *spec.action_shape), spec.action_dtype)
        self._reward = np.zeros((num_envs, length), np.float32)
        self._terminated = np.zeros((num_envs, length), bool)
        self._truncated = np.zeros((num_envs, length), bool)
        self._logp = np.zeros((num_envs, length), np.float32)
        self._final: list[tuple[int, int, np.ndarray]] = []  # (row, step, obs) of truncated steps
        self._version = 0  # the version the rollout's first step was acted with
        self._core_state: np.ndarray | None = None  # each row's state before its first step

    @property
    def ready(self) -> bool:
        return self.t == self.length

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        logp: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        finals: list[tuple[int, np.ndarray]],
        next_obs: np.ndarray,
        version: int,
        core_state: np.ndarray | None = None,
    ) -> bool:
        """One lockstep step (``finals``: each truncated row's last observation, as ``(row, obs)``;
        ``next_obs``: the observations the next step starts from). ``version`` and ``core_state``
        count at a rollout's first step only. True when it completed the rollouts."""
        t = self.t
        if t == 0:
            self._version, self._core_state = version, core_state
            self._final.clear()
        self._obs[:, t] = obs
        self._action[:, t] = actions
        self._logp[:, t] = logp
        self._reward[:, t] = rewards
        self._terminated[:, t] = terminated
        self._truncated[:, t] = truncated
        self._final.extend((row, t, np.asarray(final, self.spec.obs_np_dtype)) for row, final in finals)
        self.t = t = t + 1
        if t < self.length:
            return False
        self._obs[:, t] = next_obs
        self.rollouts += len(obs)
        return True

    def take(self) -> tuple[RolloutBatch, int]:
        """The filled rows as rollouts (copies: the buffers are refilled by the next rollout)."""
        # Row-major order of the truncated flags, as RolloutBatch.final_obs is defined.
        final = [obs for _, _, obs in sorted(self._final, key=lambda item: item[:2])]
        final_obs = np.array(final, self.spec.obs_np_dtype).reshape(len(final), *self.spec.obs_shape)
        batch = RolloutBatch(
            self._obs.copy(),
            self._action.copy(),
            self._reward.copy(),
            self._terminated.copy(),
            self._truncated.copy(),
            self._logp.copy(),
            final_obs,
            self._core_state,
        )
        self.t = 0
        return batch, self._version


class RolloutCollector(LockstepCollector[SamplingPolicy, RolloutLog]):
    """Steps its envs with the policy's own sampling into ``adder``, whose log cuts them into rollouts."""

    poll_each_batch = True  # a rollout is acted with the newest weights (see the module docstring)

    def __init__(
        self,
        cfg: Config,
        policy: SamplingPolicy,
        envs: list[Any],
        spec: SampleSpec,
        *,
        weights: WeightsClient,
        adder: Adder[RolloutLog],
        seed: int,
    ) -> None:
        problem = rollout_message_problem(
            spec, len(envs), cfg.actor.rollout_length, cfg.transport.max_message_mb
        )
        if problem:
            raise ConfigError(problem)
        super().__init__(cfg, policy, envs, weights=weights, adder=adder, seed=seed)
        self.recurrent = is_recurrent(policy)
        if self.recurrent:
            policy.reset_core()  # type: ignore[attr-defined]
        # This step's rewards and end flags, one per env (refilled each step).
        self._reward = np.zeros(len(envs), np.float32)
        self._terminated = np.zeros(len(envs), bool)
        self._truncated = np.zeros(len(envs), bool)

    def describe(self) -> str:
        """How this actor acts, for its start-up line."""
        return f"on-policy rollouts of {self.log.length} steps x {self.num_envs} env(s)"

    def counters(self, elapsed: float) -> dict[str, float | int]:
        """What the sampling loop has done, for heartbeats and stats (``elapsed``: its seconds)."""
        return {
            "envs": self.num_envs,
            "steps": self.steps,
            "rollouts": self.log.rollouts,
            "weights_version": self.weights.version,
            "steps_per_s": self.steps / max(elapsed, 1e-9),
            **self.adder.episode_counters(),
        }

    def _step(self) -> bool:
        """One lockstep step of every env; True when it completed the rollouts."""
        start_state = self._core_state() if self.recurrent and self.log.t == 0 else None
        obs = self._current
        actions, logp = self.policy.sample(obs)
        rewards, terminated, truncated = self._reward, self._terminated, self._truncated
        finals: list[tuple[int, np.ndarray]] = []
        next_obs = np.empty_like(obs)
        for j, env in enumerate(self.envs):
            observation, reward, term, trunc, _ = env.step(actions[j])
            rewards[j] = reward
            self._returns[j] += float(reward)
            self._lengths[j] += 1
            # A step is terminated or truncated, never both: termination bootstraps nothing.
            terminated[j] = term
            truncated[j] = trunc and not term
            if term or trunc:
                if not term:
                    finals.append((j, observation))
                self._episode_ended(j)
                observation, _ = env.reset()
            next_obs[j] = observation
        self._current = next_obs
        if self.recurrent:  # the envs whose episode ended start the next one from a zero state
            done = terminated | truncated
            if done.any():
                self.policy.reset_core(done)  # type: ignore[attr-defined]
        self.steps += self.num_envs
        version = self.weights.version
        return self.log.add(
            obs, actions, logp, rewards, terminated, truncated, finals, next_obs, version, start_state
        )
