"""An actor's sampling loop without sockets: env(s), policy, exploration, n-step windows, batches.

The actor process drives a ``Sampler`` between heartbeats and sends what it collects; serial mode
drives the same object and hands the batches to the learner in the same thread. ``collect``
returns what happened (a batch is ready, weights are due, the step budget is spent) and the
caller decides what to do about it: the sampler never calls back into its role.

With ``actor.envs_per_actor`` = E > 1 it steps a gymnasium ``SyncVectorEnv`` (autoreset mode
NEXT_STEP) with one batched ``act`` per vector step, and behaves like E single-env actors on
consecutive rungs of the Ape-X ladder. One acting loop serves both: what differs between one env
and a vector of them (how a step is taken and an ended episode reset, n-step windows per sub-env,
the versions each window's steps were acted with) is in two small steppers. ``steps`` counts real
env transitions (sub-env steps that are not a NEXT_STEP autoreset step), and everything scheduled
by it (weight polls, epsilon annealing) goes by that count.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np

from zmqrl.actor.exploration import EpsilonExplorer, LinearSchedule, ladder_epsilon
from zmqrl.actor.nstep import NStepProcessor, Transition, VectorNStep, to_batch
from zmqrl.agents import PriorityFn
from zmqrl.config import Config
from zmqrl.core import Policy
from zmqrl.spec import SampleSpec
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat, TransitionBatch

# Actor i's env is seeded with run.seed + ACTOR_SEED_STRIDE * (i + 1): distinct and reproducible.
# Sub-env j of a vector actor gets that seed + j (distinct while envs_per_actor < the stride).
ACTOR_SEED_STRIDE = 1000
# Env steps between updates of the annealed epsilon (and the actor's heartbeat/control checks).
HOUSEKEEPING_EVERY = 16

log = logging.getLogger("zmqrl.actor")


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

    BATCH_READY = "batch ready"  # ``message()`` holds a batch to send
    WEIGHTS_DUE = "weights due"  # actor.weights_poll_steps passed (and before the first step):
    # hand the policy newer weights if there are any, then collect on
    BUDGET_SPENT = "budget spent"  # the step budget was taken, and neither of the above


# What one env step gave: the n-step transitions it completed, the oldest weights version those
# were acted with (None when none was completed), the real env transitions in it, the episodes
# that ended in it.
Stepped: TypeAlias = tuple[list[Transition], int | None, int, Sequence[EpisodeStat]]
NO_EPISODES: tuple[EpisodeStat, ...] = ()


class ActedVersions:
    """The weights version each step still inside an n-step window was acted with.

    An n-step transition leaves its window up to ``n - 1`` steps after its action was taken, with
    possibly older weights than the actor holds when it leaves, so the version is recorded per
    step: one queue per (sub-)env, kept exactly as long as that env's window. Windows emit oldest
    first, so what the windows emitted is what leaves the front of the queues.
    """

    def __init__(self, num_envs: int) -> None:
        self._queues: list[deque[int]] = [deque() for _ in range(num_envs)]

    def step(self, version: int, fed: Sequence[bool], pending_after: Sequence[int]) -> int | None:
        """Record ``version`` for each env that was fed a real step (``fed``), then drop the steps
        the windows emitted (each queue shrinks to its window's length, ``pending_after``).
        Returns the oldest version among the emitted steps, or None if none was emitted."""
        oldest: int | None = None
        for queue, was_fed, left in zip(self._queues, fed, pending_after, strict=True):
            if was_fed:
                queue.append(version)
            while len(queue) > left:
                acted = queue.popleft()
                oldest = acted if oldest is None else min(oldest, acted)
        return oldest


class EnvStepper(Protocol):
    """Steps the env(s) with one batch of actions and folds the steps into n-step transitions."""

    env: Any

    @property
    def obs(self) -> np.ndarray:
        """The rows the next actions are chosen from (sub-envs on axis 0)."""

    def step(self, actions: np.ndarray, version: int) -> Stepped: ...


class SingleEnvStepper:
    """One gymnasium env, reset as soon as an episode ends; one n-step window."""

    def __init__(self, env: Any, seed: int, n_step: int, gamma: float) -> None:
        self.env = env
        self._nstep = NStepProcessor(n_step, gamma)
        self._acted: deque[int] = deque()
        self._obs, _ = env.reset(seed=seed)
        self._return, self._length = 0.0, 0

    @property
    def obs(self) -> np.ndarray:
        return self._obs[None]

    def step(self, actions: np.ndarray, version: int) -> Stepped:
        obs, action, nstep, acted = self._obs, actions[0], self._nstep, self._acted
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        emitted = nstep.step(obs, action, float(reward), terminated, truncated, next_obs)
        # One env's versions never decrease, so the first step to leave the window is the oldest
        # of those that left (no min needed, unlike ActedVersions over sub-envs).
        acted.append(version)
        oldest = None
        if emitted:
            oldest = acted.popleft()
            while len(acted) > len(nstep):
                acted.popleft()
        ended: Sequence[EpisodeStat] = NO_EPISODES
        if terminated or truncated:
            ended = (EpisodeStat(self._return, self._length),)
            self._return, self._length = 0.0, 0
            self._obs, _ = self.env.reset()
        else:
            self._obs = next_obs
        return emitted, oldest, 1, ended


class VectorEnvStepper:
    """A ``SyncVectorEnv`` (autoreset NEXT_STEP): one n-step window per sub-env, whose autoreset
    steps are not transitions (``VectorNStep``)."""

    def __init__(self, env: Any, seed: int, num_envs: int, n_step: int, gamma: float) -> None:
        self.env = env
        self.vec = VectorNStep(num_envs, n_step, gamma)
        self._acted = ActedVersions(num_envs)
        # SyncVectorEnv (copy=True, as make_vector_env builds it) returns fresh arrays each
        # step, so transitions may keep row views of them.
        self.obs, _ = env.reset(seed=[seed + j for j in range(num_envs)])

    def step(self, actions: np.ndarray, version: int) -> Stepped:
        vec = self.vec
        next_obs, rewards, terminated, truncated, _ = self.env.step(actions)
        fed = [not reset for reset in vec.autoreset]  # rows in their autoreset step are skipped
        emitted = vec.step(self.obs, actions, rewards, terminated, truncated, next_obs)
        oldest = self._acted.step(version, fed, [len(p) for p in vec.processors])
        self.obs = next_obs
        return emitted, oldest, vec.real_steps, [stat for _, stat in vec.ended]


class Sampler:
    """Steps its env(s) with exploration and folds the steps into batches of n-step transitions.

    ``collect`` returns ``Collected.WEIGHTS_DUE`` every ``actor.weights_poll_steps`` env steps (and
    before the first): the caller hands the policy newer weights then, if it has any. Each batch
    is stamped with the oldest weights version its transitions were acted with, so the learner
    can measure policy lag.
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
        replacement: bool = False,
        priorities: PriorityFn | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.policy = policy
        self.weights = weights  # which version the policy acts with (the role offers it newer ones)
        self.spec = spec
        self.num_envs = cfg.actor.envs_per_actor
        self._send_batch = cfg.actor.send_batch
        self._poll_every = cfg.actor.weights_poll_steps
        self.epsilons = ladder(cfg, actor_id)
        # Start fully random and anneal to each rung of the ladder (no-op when decay is 0); a
        # replacement joins a run under way, at its rung at once.
        self.epsilon_decay = 0 if replacement else cfg.actor.epsilon_decay_steps
        self._schedule = LinearSchedule(1.0, float(self.epsilons[0]), self.epsilon_decay)
        self._priority_fn = priorities  # Ape-X initial priorities for each batch (None: none)
        self.steps = 0
        self.episodes = 0
        self.priority_seconds = 0.0
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._seq = 0
        self._pending: list[Transition] = []
        self._pending_version = weights.version  # the oldest version acted with among pending
        self._finished: list[EpisodeStat] = []
        self._bad_priorities_logged = False
        seed, n_step, gamma = actor_seed(cfg, actor_id), cfg.agent.n_step, cfg.agent.gamma
        self.envs: EnvStepper = (
            SingleEnvStepper(env, seed, n_step, gamma)
            if self.num_envs == 1
            else VectorEnvStepper(env, seed, self.num_envs, n_step, gamma)
        )
        # Epsilon-random rows around the policy's own acting, on this actor's rungs.
        self.explorer = EpsilonExplorer(policy, spec, seed=seed, epsilon=self._epsilon())
        self._next_poll = 0
        self._next_epsilon = HOUSEKEEPING_EVERY

    @property
    def env(self) -> Any:
        return self.envs.env

    @property
    def batch_ready(self) -> bool:
        return len(self._pending) >= self._send_batch

    def describe(self) -> str:
        """How this actor explores, for its start-up line."""
        rungs = " ".join(f"{e:.4f}" for e in self.epsilons)
        return f"{self.num_envs} env(s), epsilon {rungs} (annealed from 1.0 over {self.epsilon_decay} steps)"

    def collect(self, budget: int) -> Collected:
        """Step until a batch is ready, weights are due, or about ``budget`` env transitions were
        taken (a vector step may overshoot by fewer than E); says which (see ``Collected``)."""
        if self.batch_ready:
            return Collected.BATCH_READY
        if self._act(self.steps + budget):
            return Collected.WEIGHTS_DUE
        return Collected.BATCH_READY if self.batch_ready else Collected.BUDGET_SPENT

    def message(self) -> SamplesMsg:
        """The ready batch as a samples message (with Ape-X initial priorities when asked for);
        starts the next batch."""
        batch = to_batch(self._pending, self.spec.obs_dtype, self.spec.action_dtype)
        msg = SamplesMsg(
            actor_id=self.actor_id,
            seq=self._seq,
            weights_version=self._pending_version,
            batch=batch,
            episodes=self._finished,
            priorities=self._priorities(batch) if self._priority_fn is not None else None,
        )
        self._seq += 1
        self._pending, self._finished = [], []
        return msg

    def close(self) -> None:
        self.env.close()

    def counters(self, elapsed: float) -> dict[str, float | int]:
        """What the sampling loop has done, for heartbeats and stats (``elapsed``: its seconds)."""
        recent = self.recent_returns
        return {
            "envs": self.num_envs,
            "steps": self.steps,
            "episodes": self.episodes,
            "weights_version": self.weights.version,
            # A vector actor reports the mean of its sub-envs' epsilons.
            "epsilon": float(np.mean(self.explorer.epsilon)),
            "steps_per_s": self.steps / max(elapsed, 1e-9),
            "priority_seconds": self.priority_seconds,
            "recent_return": float(np.mean(recent)) if recent else float("nan"),
        }

    def _act(self, until: int) -> bool:
        """The acting loop, for one env or a vector of them: act, step, fold, until ``until`` steps
        or a full batch; True if it stopped because weights are due."""
        explorer, weights, envs = self.explorer, self.weights, self.envs
        pending, send_batch = self._pending, self._send_batch
        while self.steps < until and len(pending) < send_batch:
            if self.steps >= self._next_poll:
                self._next_poll = self.steps + self._poll_every
                return True
            if self.steps >= self._next_epsilon:
                explorer.epsilon = self._epsilon()
                self._next_epsilon = self.steps + HOUSEKEEPING_EVERY
            version = weights.version
            actions = explorer.act(envs.obs)  # each row explores at its sub-env's epsilon
            emitted, oldest, real_steps, ended = envs.step(actions, version)
            if oldest is not None:
                self._pending_version = oldest if not pending else min(self._pending_version, oldest)
                pending.extend(emitted)
            self.steps += real_steps
            for stat in ended:
                self._finished.append(stat)
                self.recent_returns.append(stat.ret)
                self.episodes += 1
        return False

    def _epsilon(self) -> float | np.ndarray:
        """The policy's epsilon now: one env's from its schedule over the actor's steps, a vector's
        per sub-env over that sub-env's own steps."""
        if isinstance(self.envs, VectorEnvStepper):
            return self.sub_env_epsilons(np.asarray(self.envs.vec.env_steps))
        return self._schedule(self.steps)

    def sub_env_epsilons(self, env_steps: np.ndarray) -> np.ndarray:
        """Each sub-env's epsilon: annealed linearly from 1.0 to its rung over ``epsilon_decay_steps``
        of that sub-env's own transitions (as a single-env actor on that rung would be)."""
        if self.epsilon_decay == 0:
            return self.epsilons.copy()
        frac = np.minimum(env_steps / self.epsilon_decay, 1.0)
        return 1.0 + (self.epsilons - 1.0) * frac

    def _priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """The Ape-X initial priorities of ``batch`` under the weights held now, as float32 (B,), or
        None when there are none or they are unusable (NaN, inf, negative: the learner then gives
        the rows its max priority)."""
        assert self._priority_fn is not None
        started = time.perf_counter()
        try:
            raw = self._priority_fn(batch)
        finally:
            self.priority_seconds += time.perf_counter() - started
        if raw is None:
            return None
        priorities = np.ascontiguousarray(raw, dtype=np.float32)
        if priorities.shape != (batch.size,):
            raise ValueError(
                f"initial_priorities returned shape {priorities.shape}, expected ({batch.size},)"
            )
        if not (priorities.min() >= 0.0 and priorities.max() < np.inf):
            if not self._bad_priorities_logged:
                log.warning("initial priorities not finite and >= 0; sending batches without them")
                self._bad_priorities_logged = True
            return None
        return priorities
