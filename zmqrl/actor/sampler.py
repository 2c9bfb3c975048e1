"""An actor's sampling loop without sockets: env(s), policy, exploration, n-step windows, batches.

The actor process drives a ``Sampler`` between heartbeats and sends what it collects; serial mode
drives the same object and hands the batches to the learner in the same thread. With
``actor.envs_per_actor`` = E > 1 it steps a gymnasium ``SyncVectorEnv`` (autoreset mode
NEXT_STEP) with one batched ``act`` per vector step, and behaves like E single-env actors on
consecutive rungs of the Ape-X ladder. ``steps`` counts real env transitions (sub-env steps that
are not a NEXT_STEP autoreset step), and everything scheduled by it (weight polls, epsilon
annealing) goes by that count.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zmqrl.actor.exploration import LinearSchedule, apex_epsilon
from zmqrl.actor.nstep import NStepProcessor, Transition, VectorNStep, to_batch
from zmqrl.config import Config
from zmqrl.core import Policy
from zmqrl.spec import SampleSpec
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat, TransitionBatch

# Actor i's env is seeded with run.seed + ACTOR_SEED_STRIDE * (i + 1): distinct and reproducible.
# Sub-env j of a vector actor gets that seed + j (distinct while envs_per_actor < the stride).
ACTOR_SEED_STRIDE = 1000
# Env steps between updates of the annealed epsilon (and the actor's heartbeat/control checks).
HOUSEKEEPING_EVERY = 16
# Pacing never banks more than this many seconds of unused step budget.
PACE_MAX_DEBT = 0.05
# Longest single sleep of the pacer: a low cap still reports progress (the actor's watchdog) and
# notices a stop this often.
PACE_SLICE_SECONDS = 0.5

log = logging.getLogger("zmqrl.actor")


def actor_seed(cfg: Config, actor_id: int) -> int:
    return cfg.run.seed + ACTOR_SEED_STRIDE * (actor_id + 1)


def ladder(cfg: Config, actor_id: int) -> np.ndarray:
    """Each sub-env's rung of the Ape-X ladder, which spans every sub-env of every actor: sub-env j
    of actor i is rung i * E + j of N * E, so N vector actors explore like N * E single-env ones."""
    num_actors = max(cfg.actor.num_actors, actor_id + 1)
    num_envs = cfg.actor.envs_per_actor
    return np.array(
        [
            apex_epsilon(
                actor_id * num_envs + j, num_actors * num_envs, cfg.actor.epsilon, cfg.actor.epsilon_alpha
            )
            for j in range(num_envs)
        ]
    )


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


class Pacer:
    """Sleeps off an actor's lead over ``actor.max_steps_per_s`` (leaving CPU to the learner);
    a no-op without a cap. Never banks more than PACE_MAX_DEBT seconds of unused budget (e.g.
    while the actor was blocked on a full learner queue), so a capped actor does not burst."""

    def __init__(self, max_steps_per_s: float | None) -> None:
        self._period = 1.0 / max_steps_per_s if max_steps_per_s else 0.0
        self._due = time.monotonic()
        self.paced_seconds = 0.0

    def pace(self, steps: int, tick: Callable[[], bool] = lambda: False) -> None:
        """Account for ``steps`` env transitions taken since the last call. A long sleep is cut
        into slices with a ``tick()`` after each; it ends early when ``tick`` returns True."""
        if not self._period:
            return
        now = time.monotonic()
        self._due = max(self._due, now - PACE_MAX_DEBT) + steps * self._period
        ahead = self._due - now
        if ahead > 0:
            self.paced_seconds += ahead
            while (left := self._due - time.monotonic()) > 0:
                time.sleep(min(left, PACE_SLICE_SECONDS))
                if left > PACE_SLICE_SECONDS and tick():
                    return


class Sampler:
    """Steps its env(s) with exploration and folds the steps into batches of n-step transitions.

    ``sync_weights`` is called every ``actor.weights_poll_steps`` env steps (and before the first):
    it is where the caller hands the policy newer weights. Each batch is stamped with the oldest
    weights version its transitions were acted with, so the learner can measure policy lag.
    """

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        policy: Policy,
        env: Any,
        spec: SampleSpec,
        *,
        sync_weights: Callable[[], None],
        replacement: bool = False,
        initial_priorities: bool = False,
    ) -> None:
        self.actor_id = actor_id
        self.policy = policy
        self.env = env
        self.spec = spec
        self.num_envs = cfg.actor.envs_per_actor
        self._sync = sync_weights
        self._send_batch = cfg.actor.send_batch
        self._poll_every = cfg.actor.weights_poll_steps
        self.epsilons = ladder(cfg, actor_id)
        # Start fully random and anneal to each rung of the ladder (no-op when decay is 0); a
        # replacement joins a run under way, at its rung at once.
        self.epsilon_decay = 0 if replacement else cfg.actor.epsilon_decay_steps
        self._schedule = LinearSchedule(1.0, float(self.epsilons[0]), self.epsilon_decay)
        self._apex = initial_priorities  # compute Ape-X initial priorities for each batch
        self.steps = 0
        self.episodes = 0
        self.priority_seconds = 0.0
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._seq = 0
        self._pending: list[Transition] = []
        self._pending_version = policy.weights_version  # the oldest version acted with among pending
        self._finished: list[EpisodeStat] = []
        self._bad_priorities_logged = False
        seed = actor_seed(cfg, actor_id)
        if self.num_envs == 1:
            self._steps_fn = self._single_steps
            self._nstep = NStepProcessor(cfg.agent.n_step, cfg.agent.gamma)
            self._acted: deque[int] = deque()
            self._obs, _ = env.reset(seed=seed)
            self._ep_return, self._ep_length = 0.0, 0
            policy.epsilon = self._schedule(0)
        else:
            self._steps_fn = self._vector_steps
            self._vec = VectorNStep(self.num_envs, cfg.agent.n_step, cfg.agent.gamma)
            self._vec_acted = ActedVersions(self.num_envs)
            # SyncVectorEnv (copy=True, as make_vector_env builds it) returns fresh arrays each
            # step, so transitions may keep row views of them.
            self._obs, _ = env.reset(seed=[seed + j for j in range(self.num_envs)])
            policy.epsilon = self.sub_env_epsilons(np.zeros(self.num_envs))
        self._next_poll = 0
        self._next_epsilon = HOUSEKEEPING_EVERY

    @property
    def batch_ready(self) -> bool:
        return len(self._pending) >= self._send_batch

    def collect(self, budget: int) -> bool:
        """Step until a batch is ready or about ``budget`` env transitions were taken (a vector
        step may overshoot by fewer than E); returns whether a batch is ready (see ``message``)."""
        if not self.batch_ready:
            self._steps_fn(self.steps + budget)
        return self.batch_ready

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
            priorities=self._priorities(batch) if self._apex else None,
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
            "weights_version": self.policy.weights_version,
            # A vector actor reports the mean of its sub-envs' epsilons.
            "epsilon": float(np.mean(self.policy.epsilon)),
            "steps_per_s": self.steps / max(elapsed, 1e-9),
            "priority_seconds": self.priority_seconds,
            "recent_return": float(np.mean(recent)) if recent else float("nan"),
        }

    def _single_steps(self, until: int) -> None:
        policy, env, nstep, acted = self.policy, self.env, self._nstep, self._acted
        pending, send_batch = self._pending, self._send_batch
        obs = self._obs
        while self.steps < until and len(pending) < send_batch:
            if self.steps >= self._next_poll:
                self._sync()
                self._next_poll = self.steps + self._poll_every
            if self.steps >= self._next_epsilon:
                policy.epsilon = self._schedule(self.steps)
                self._next_epsilon = self.steps + HOUSEKEEPING_EVERY
            version = policy.weights_version
            action = policy.act(obs[None], explore=True)[0]
            next_obs, reward, terminated, truncated, _ = env.step(action)
            self.steps += 1
            self._ep_return += float(reward)
            self._ep_length += 1
            emitted = nstep.step(obs, action, float(reward), terminated, truncated, next_obs)
            # The version each windowed step was acted with. One env's versions never decrease, so
            # the first step to leave the window is the oldest of those that left (no min needed;
            # the vector loop, whose sub-envs differ, uses ActedVersions).
            acted.append(version)
            if emitted:
                oldest = acted.popleft()
                while len(acted) > len(nstep):
                    acted.popleft()
                if not pending:
                    self._pending_version = oldest
                pending.extend(emitted)
            if terminated or truncated:
                self._finished.append(EpisodeStat(self._ep_return, self._ep_length))
                self.recent_returns.append(self._ep_return)
                self.episodes += 1
                self._ep_return, self._ep_length = 0.0, 0
                obs, _ = env.reset()
            else:
                obs = next_obs
        self._obs = obs

    def _vector_steps(self, until: int) -> None:
        policy, env, vec, acted = self.policy, self.env, self._vec, self._vec_acted
        pending, send_batch = self._pending, self._send_batch
        obs = self._obs
        while self.steps < until and len(pending) < send_batch:
            if self.steps >= self._next_poll:
                self._sync()
                self._next_poll = self.steps + self._poll_every
            if self.steps >= self._next_epsilon:
                policy.epsilon = self.sub_env_epsilons(np.asarray(vec.env_steps))
                self._next_epsilon = self.steps + HOUSEKEEPING_EVERY
            version = policy.weights_version
            actions = policy.act(obs, explore=True)  # each row explores at its sub-env's epsilon
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            fed = [not reset for reset in vec.autoreset]  # rows in their autoreset step are skipped
            emitted = vec.step(obs, actions, rewards, terminated, truncated, next_obs)
            oldest = acted.step(version, fed, [len(p) for p in vec.processors])
            if oldest is not None:
                self._pending_version = oldest if not pending else min(self._pending_version, oldest)
                pending.extend(emitted)
            self.steps += vec.real_steps
            for _, stat in vec.ended:
                self._finished.append(stat)
                self.recent_returns.append(stat.ret)
                self.episodes += 1
            obs = next_obs
        self._obs = obs

    def sub_env_epsilons(self, env_steps: np.ndarray) -> np.ndarray:
        """Each sub-env's epsilon: annealed linearly from 1.0 to its rung over ``epsilon_decay_steps``
        of that sub-env's own transitions (as a single-env actor on that rung would be)."""
        if self.epsilon_decay == 0:
            return self.epsilons.copy()
        frac = np.minimum(env_steps / self.epsilon_decay, 1.0)
        return 1.0 + (self.epsilons - 1.0) * frac

    def _priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """``policy.initial_priorities(batch)`` as float32 (B,), or None when the policy has none or
        they are unusable (NaN, inf, negative: the learner then gives the rows its max priority)."""
        started = time.perf_counter()
        try:
            raw = self.policy.initial_priorities(batch)
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
