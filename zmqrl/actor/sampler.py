"""An actor's sampling loop without sockets: env(s), policy, exploration, n-step windows, batches.

The actor process (and serial mode) drives a ``Sampler`` and sends what its adder
(zmqrl/actor/adders.py) makes of the steps. ``collect`` returns what happened (a batch is ready,
weights are due, the step budget is spent) and the caller decides what to do about it: the
sampler never calls back into its role.

With ``actor.envs_per_actor`` = E > 1 it steps a gymnasium ``SyncVectorEnv`` (autoreset mode
NEXT_STEP) with one batched ``act`` per vector step, and behaves like E single-env actors on
consecutive rungs of the Ape-X ladder. One acting loop serves both: what differs (how a step is
taken and an ended episode reset) is in two small steppers, which log each step in the adder's
``NStepLog`` (nstep_log.py says how). ``steps`` counts real env transitions (sub-env steps that
are not a NEXT_STEP autoreset step), and everything scheduled by it (weight polls, epsilon
annealing) goes by that count.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from zmqrl.actor.adders import Adder, StepLog
from zmqrl.actor.exploration import EpsilonExplorer, LinearSchedule, ladder_epsilon
from zmqrl.actor.nstep_log import NStepLog
from zmqrl.config import Config
from zmqrl.core import Policy
from zmqrl.spec import SampleSpec
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.types import EpisodeStat

# Actor i's env is seeded with run.seed + ACTOR_SEED_STRIDE * (i + 1): distinct and reproducible.
# Sub-env j of a vector actor gets that seed + j (distinct while envs_per_actor < the stride).
ACTOR_SEED_STRIDE = 1000
# Env steps between updates of the annealed epsilon (and the actor's heartbeat/control checks).
HOUSEKEEPING_EVERY = 16


def actor_seed(cfg: Config, actor_id: int) -> int:
    return cfg.run.seed + ACTOR_SEED_STRIDE * (actor_id + 1)


def ladder(cfg: Config, actor_id: int) -> np.ndarray:
    """Each sub-env's rung of the Ape-X ladder, which spans every sub-env of every actor: sub-env j
    of actor i is rung i * E + j of N * E, so N vector actors explore like N * E single-env ones.
    An actor past ``actor.num_actors`` (scaled up under compose or Kubernetes) gets rungs between
    the configured ones (:func:`ladder_epsilon`), so no two actors explore alike."""
    num_envs = cfg.actor.envs_per_actor
    rungs = cfg.actor.num_actors * num_envs
    return np.array(
        [
            ladder_epsilon(actor_id * num_envs + j, rungs, cfg.actor.epsilon, cfg.actor.epsilon_alpha)
            for j in range(num_envs)
        ]
    )


class Collected(enum.Enum):
    """What ``Sampler.collect`` stopped for; the caller decides what to do about it."""

    BATCH_READY = "batch ready"  # the adder holds a batch to send
    WEIGHTS_DUE = "weights due"  # actor.weights_poll_steps passed (and before the first step):
    # hand the policy newer weights if there are any, then collect on
    BUDGET_SPENT = "budget spent"  # the step budget was taken, and neither of the above


# The acting side of a policy: observation rows in, one action row per sub-env out.
Act = Callable[[np.ndarray], np.ndarray]


class SingleEnvStepper:
    """One gymnasium env, reset as soon as an episode ends. Its ``run`` (and the vector
    stepper's) acts and steps until about ``budget`` real env transitions were taken (a vector
    step may overshoot by fewer than E) or the log holds a batch, acting with weights
    ``version``, and returns the transitions taken; ended episodes go to the adder's
    ``finished``. One call runs many steps: the acting loop's per-step work is all here, in
    locals."""

    def __init__(self, env: Any, seed: int, adder: Adder[NStepLog]) -> None:
        self.env = env
        self.log = adder.log
        self._finished = adder.finished
        self._obs, _ = env.reset(seed=seed)
        self._return, self._length = 0.0, 0

    def run(self, act: Act, budget: int, version: int) -> int:
        env, log, add, finished = self.env, self.log, self.log.add_single, self._finished
        obs, ret, length = self._obs, self._return, self._length
        taken = 0
        while taken < budget and not log.ready:
            action = act(obs[None])[0]
            next_obs, reward, terminated, truncated, _ = env.step(action)
            reward = float(reward)
            ret += reward
            length += 1
            taken += 1
            add(obs, action, reward, terminated, truncated, next_obs, version)
            if terminated or truncated:
                finished.append(EpisodeStat(ret, length))
                ret, length = 0.0, 0
                obs, _ = env.reset()
            else:
                obs = next_obs
        self._obs, self._return, self._length = obs, ret, length
        return taken


class VectorEnvStepper:
    """A ``SyncVectorEnv`` (autoreset NEXT_STEP), whose autoreset steps are not transitions: the
    log tells them apart and keeps each sub-env's windows its own."""

    def __init__(self, env: Any, seed: int, adder: Adder[NStepLog]) -> None:
        self.env = env
        self.log = adder.log
        self._finished = adder.finished
        # SyncVectorEnv (copy=True, as make_vector_env builds it) returns fresh arrays each
        # step, so the log may keep them until its batch is taken.
        self.obs, _ = env.reset(seed=[seed + j for j in range(self.log.num_envs)])

    def run(self, act: Act, budget: int, version: int) -> int:
        env, log, finished = self.env, self.log, self._finished
        obs = self.obs
        taken = 0
        while taken < budget and not log.ready:
            actions = act(obs)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            taken += log.add(obs, actions, rewards, terminated, truncated, next_obs, version)
            if log.ended:
                finished.extend(stat for _, stat in log.ended)
            obs = next_obs
        self.obs = obs
        return taken


class Sampler:
    """Steps its env(s) with exploration into ``adder``, whose n-step log folds them into batches.

    ``collect`` returns ``Collected.WEIGHTS_DUE`` every ``actor.weights_poll_steps`` env steps (and
    before the first): the caller hands the policy newer weights then, if it has any. Each step is
    logged with the weights version it was acted with, so each batch is stamped with its oldest
    and the learner can measure policy lag.
    """

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        policy: Policy,
        env: Any,
        spec: SampleSpec,
        *,
        weights: WeightsClient,
        adder: Adder[NStepLog],
        replacement: bool = False,
    ) -> None:
        self.adder = adder
        self.log = adder.log
        self.weights = weights  # which version the policy acts with (the role offers it newer ones)
        self.num_envs = cfg.actor.envs_per_actor
        self._poll_every = cfg.actor.weights_poll_steps
        self.epsilons = ladder(cfg, actor_id)
        # Start fully random and anneal to each rung of the ladder (no-op when decay is 0); a
        # replacement joins a run under way, at its rung at once.
        self.epsilon_decay = 0 if replacement else cfg.actor.epsilon_decay_steps
        self._schedule = LinearSchedule(1.0, float(self.epsilons[0]), self.epsilon_decay)
        self.steps = 0
        seed = actor_seed(cfg, actor_id)
        self.envs = (
            SingleEnvStepper(env, seed, adder) if self.num_envs == 1 else VectorEnvStepper(env, seed, adder)
        )
        # Epsilon-random rows around the policy's own acting, on this actor's rungs.
        self.explorer = EpsilonExplorer(policy, spec, seed=seed, epsilon=self._epsilon())
        self._next_poll = 0
        self._next_epsilon = HOUSEKEEPING_EVERY

    def describe(self) -> str:
        """How this actor explores, for its start-up line."""
        rungs = " ".join(f"{e:.4f}" for e in self.epsilons)
        return f"{self.num_envs} env(s), epsilon {rungs} (annealed from 1.0 over {self.epsilon_decay} steps)"

    def collect(self, budget: int) -> Collected:
        """Step until a batch is ready, weights are due, or about ``budget`` env transitions were
        taken (a vector step may overshoot by fewer than E); says which (see ``Collected``)."""
        if self.log.ready:
            return Collected.BATCH_READY
        if self._act(self.steps + budget):
            return Collected.WEIGHTS_DUE
        return Collected.BATCH_READY if self.log.ready else Collected.BUDGET_SPENT

    def close(self) -> None:
        self.envs.env.close()

    def counters(self, elapsed: float) -> dict[str, float | int]:
        """What the sampling loop has done, for heartbeats and stats (``elapsed``: its seconds)."""
        return {
            "envs": self.num_envs,
            "steps": self.steps,
            "weights_version": self.weights.version,
            # A vector actor reports the mean of its sub-envs' epsilons.
            "epsilon": float(np.mean(self.explorer.epsilon)),
            "steps_per_s": self.steps / max(elapsed, 1e-9),
            "priority_seconds": self.adder.priority_seconds,
            **self.adder.episode_counters(),
        }

    def _act(self, until: int) -> bool:
        """The acting loop, for one env or a vector of them: act, step, log, until ``until`` steps
        or a full batch; True if it stopped because weights are due."""
        explorer, weights, envs, log = self.explorer, self.weights, self.envs, self.log
        steps = self.steps
        next_event = min(self._next_poll, self._next_epsilon)
        try:
            while steps < until and not log.ready:
                if steps >= next_event:
                    if steps >= self._next_poll:
                        self._next_poll = steps + self._poll_every
                        return True
                    if steps >= self._next_epsilon:
                        self.steps = steps
                        explorer.epsilon = self._epsilon()
                        self._next_epsilon = steps + HOUSEKEEPING_EVERY
                    next_event = min(self._next_poll, self._next_epsilon)
                # Each row explores at its sub-env's epsilon, until the next event.
                steps += envs.run(explorer.act, min(until, next_event) - steps, weights.version)
            return False
        finally:
            self.steps = steps

    def _epsilon(self) -> float | np.ndarray:
        """The policy's epsilon now: one env's from its schedule over the actor's steps, a vector's
        per sub-env over that sub-env's own steps."""
        if isinstance(self.envs, VectorEnvStepper):
            return self.sub_env_epsilons(self.log.env_steps)
        return self._schedule(self.steps)

    def sub_env_epsilons(self, env_steps: np.ndarray) -> np.ndarray:
        """Each sub-env's epsilon: annealed linearly from 1.0 to its rung over ``epsilon_decay_steps``
        of that sub-env's own transitions (as a single-env actor on that rung would be)."""
        if self.epsilon_decay == 0:
            return self.epsilons.copy()
        frac = np.minimum(env_steps / self.epsilon_decay, 1.0)
        return 1.0 + (self.epsilons - 1.0) * frac


P = TypeVar("P", bound=Policy)
Log = TypeVar("Log", bound=StepLog)


class LockstepCollector(Generic[P, Log]):
    """Plain gymnasium envs stepped in lockstep, one batched policy call per step, each env reset
    as soon as its episode ends (no autoreset: every step logged is a real transition), a recurrent
    policy's state one row per env: what the on-policy (``RolloutCollector``) and recurrent replay
    (``SequenceCollector``) actors share, driven as ``Sampler`` is; each logs a step its own way."""

    # Weights are offered before every batch (on-policy: each rollout acted with the newest), not
    # only every actor.weights_poll_steps.
    poll_each_batch: ClassVar[bool] = False

    def __init__(
        self, cfg: Config, policy: P, envs: list[Any], *, weights: WeightsClient, adder: Adder[Log], seed: int
    ) -> None:
        self.policy = policy
        self.weights = weights
        self.envs = envs
        self.adder = adder
        self.log = adder.log
        self.num_envs = n = len(envs)
        self._poll_every = cfg.actor.weights_poll_steps
        # Weights are due at the latest this many steps after a batch is ready.
        self._poll_after_batch = 0 if self.poll_each_batch else self._poll_every
        self.steps = 0
        self._returns = np.zeros(n)
        self._lengths = np.zeros(n, np.int64)
        self._current = np.stack([env.reset(seed=seed + j)[0] for j, env in enumerate(envs)])
        self._next_poll = 0

    def collect(self, budget: int) -> Collected:
        """Step until a batch is ready, weights are due, or about ``budget`` env transitions
        were taken (one lockstep step may overshoot by fewer than the env count)."""
        if self.log.ready:
            return Collected.BATCH_READY
        until = self.steps + budget
        while self.steps < until:
            if self.steps >= self._next_poll:
                self._next_poll = self.steps + self._poll_every
                return Collected.WEIGHTS_DUE
            if self._step():
                self._next_poll = min(self._next_poll, self.steps + self._poll_after_batch)
                return Collected.BATCH_READY
        return Collected.BUDGET_SPENT

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _step(self) -> bool:
        """One lockstep step of every env, logged; True when a batch is ready."""
        raise NotImplementedError

    def _core_state(self) -> np.ndarray:
        """A copy of the policy's state for the envs' next step: zeros before its first step."""
        state: np.ndarray = self.policy.core_state()  # type: ignore[attr-defined]
        if len(state) != self.num_envs:  # not sized yet: no step taken since the reset
            state = np.zeros((self.num_envs, *state.shape[1:]), np.float32)
        return state

    def _episode_ended(self, j: int) -> None:
        self.adder.finished.append(EpisodeStat(float(self._returns[j]), int(self._lengths[j])))
        self._returns[j], self._lengths[j] = 0.0, 0
