"""An actor: its own env (or vector of sub-envs) and agent copy, n-step processing, and a socket to push
samples on.

With ``actor.envs_per_actor`` = E > 1 the actor steps a gymnasium ``SyncVectorEnv`` (autoreset
mode NEXT_STEP) with one batched ``act`` per vector step, and behaves like E single-env actors on
consecutive rungs of the Ape-X ladder. Its ``steps`` counter (and everything paced or scheduled by
it: ``max_steps``, ``max_steps_per_s``, weight polls, housekeeping) counts real env transitions,
i.e. sub-env steps that are not a NEXT_STEP autoreset step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl.agents import make_agent
from zmqrl.config import Config
from zmqrl.envs import action_bounds, make_env, make_vector_env, sample_spec
from zmqrl.exploration import LinearSchedule, apex_epsilon
from zmqrl.fingerprint import run_fingerprint
from zmqrl.roles.link import SupervisorLink, socket_limits, transport_security
from zmqrl.spec import SampleSpec
from zmqrl.steps import NStepProcessor, Transition, VectorNStep, to_batch
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, LearnerUnreachable, SampleSender, WeightsSubscriber
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat, TransitionBatch

# Actor i's env is seeded with run.seed + ACTOR_SEED_STRIDE * (i + 1): distinct and reproducible.
# Sub-env j of a vector actor gets that seed + j (distinct while envs_per_actor < the stride).
ACTOR_SEED_STRIDE = 1000
# Env steps between (time-gated) heartbeat / control checks.
HOUSEKEEPING_EVERY = 16
# While waiting for the learner's weights, an actor heartbeats at least this often (milliseconds).
WEIGHTS_WAIT_POLL_MS = 50
# Pacing never lets an actor bank more than this many seconds of unused step budget (e.g. while it
# was blocked on a full learner queue), so a capped actor does not burst afterwards.
PACE_MAX_DEBT = 0.05

log = logging.getLogger("zmqrl.actor")


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


class Actor:
    """Steps its env with exploration, turns steps into n-step transitions and ships them.

    Acts with its own initial weights until the learner's first publish arrives; from then on it
    adopts every newer version (never an older one) and stamps each batch with the version its
    oldest transition was acted with, so the learner can measure policy lag.

    Nothing is sent before the learner was heard from: the first batch waits until a valid
    weights message arrived, which carries the learner's run fingerprint. An actor whose settings
    differ raises ``FingerprintMismatch`` (exit 2 at the CLI) without having sent a transition.
    """

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        *,
        ctx: zmq.Context | None = None,
        replacement: bool = False,
        link: SupervisorLink | None = None,
    ) -> None:
        if not 0 <= actor_id < max(cfg.actor.num_actors, actor_id + 1):
            raise ValueError(f"actor id {actor_id} must be >= 0")
        self.cfg = cfg
        self.actor_id = actor_id
        # Started in place of a failed actor: the run is under way, so act with the learner's
        # current weights from the first step and at this slot's rung of the ladder (no warm-up).
        self.replacement = replacement
        self._ctx = ctx or zmq.Context.instance()
        self._link = link  # made by the process main before torch loaded, or here in run()
        self.stop_event = threading.Event()
        self.stats: dict[str, Any] = {}
        self.steps = 0
        self.episodes = 0
        self.samples_sent = 0
        self.weights_loaded = 0
        self.paced_seconds = 0.0
        self.priority_seconds = 0.0
        self.num_envs = cfg.actor.envs_per_actor
        self._recent_returns: deque[float] = deque(maxlen=20)
        self._bad_priorities_logged = False
        self._learner_heard = False  # a valid (and, if fingerprinted, matching) weights message arrived

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(1)
        num_actors = max(cfg.actor.num_actors, self.actor_id + 1)
        num_envs = self.num_envs
        # The ladder spans every sub-env of every actor: sub-env j of actor i is rung i * E + j of
        # N * E, so N vector actors explore like N * E single-env actors (E = 1: rung i of N).
        self.epsilons = np.array(
            [
                apex_epsilon(
                    self.actor_id * num_envs + j,
                    num_actors * num_envs,
                    cfg.actor.epsilon,
                    cfg.actor.epsilon_alpha,
                )
                for j in range(num_envs)
            ]
        )
        self.epsilon = float(self.epsilons[0])
        seed = cfg.run.seed + ACTOR_SEED_STRIDE * (self.actor_id + 1)
        # Start fully random and anneal to each rung of the ladder (no-op when decay is 0).
        self._epsilon_decay = 0 if self.replacement else cfg.actor.epsilon_decay_steps
        self._epsilon_schedule = LinearSchedule(1.0, self.epsilon, self._epsilon_decay)
        env: Any
        initial_epsilon: float | np.ndarray
        if num_envs == 1:
            env = make_env(cfg.env)
            spec = sample_spec(env)
            initial_epsilon = self._epsilon_schedule(0)
        else:
            env = make_vector_env(cfg.env, num_envs, training=True)
            spec = sample_spec(env)
            initial_epsilon = self._sub_env_epsilons(np.zeros(num_envs))  # one per sub-env (row)
        bounds = action_bounds(env)
        self.agent = make_agent(
            cfg.agent,
            spec,
            epsilon=initial_epsilon,
            device="cpu",
            seed=seed,
            action_low=bounds.get("action_low"),
            action_high=bounds.get("action_high"),
        )
        initial_priorities = getattr(self.agent, "initial_priorities", None)
        self._initial_priorities = initial_priorities if cfg.replay.prioritized else None
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        samples_sock = sockets.samples_push(self._ctx, cfg.transport.samples, limits, security=security)
        weights_sock = sockets.weights_sub(self._ctx, cfg.transport.weights, limits, security=security)
        self.sender = SampleSender(samples_sock, cfg.transport.samples, cfg.transport.connect_timeout, log)
        self._weights_sock = weights_sock
        self.weights = WeightsSubscriber(
            weights_sock,
            self.agent.weights_spec(),
            BadMessages(f"actor-{self.actor_id} weights", log),
            expected_fingerprint=run_fingerprint(cfg, spec),
        )
        self.link = self._link or SupervisorLink(self._ctx, cfg, "actor", self.actor_id)
        self.link.attach(self.stop_event)
        log.info(
            "actor %d up: %d env(s), epsilon %s (annealed from 1.0 over %d steps), seed %d, samples -> %s",
            self.actor_id,
            num_envs,
            " ".join(f"{e:.4f}" for e in self.epsilons),
            self._epsilon_decay,
            seed,
            cfg.transport.samples,
        )
        self.started = time.monotonic()
        self._pace_due = self.started
        state = "failed"
        try:
            if not self.replacement or self._await_weights():
                if num_envs == 1:
                    steps = NStepProcessor(cfg.agent.n_step, cfg.agent.gamma)
                    self._loop(env, steps, spec.obs_dtype, spec.action_dtype, seed)
                else:
                    self._vector_loop(env, spec, seed)
            state = "stopped"
        finally:
            self.weights.bad.flush()
            self.stats = {**self._counters(), "state": state, "stop_reason": self.link.stop_reason}
            self.link.final(state, self._counters())
            env.close()
            samples_sock.close(linger=0)
            weights_sock.close(linger=0)
            self.link.close()
        return self.stats

    def _loop(self, env: Any, steps: NStepProcessor, obs_dtype: str, action_dtype: str, seed: int) -> None:
        cfg = self.cfg
        send_batch = cfg.actor.send_batch
        poll_every = cfg.actor.weights_poll_steps
        max_steps = cfg.actor.max_steps
        step_period = 1.0 / cfg.actor.max_steps_per_s if cfg.actor.max_steps_per_s else 0.0
        agent = self.agent
        acted: deque[int] = deque()  # versions of the steps still inside the n-step window
        pending: list[Transition] = []
        pending_version = agent.weights_version  # the oldest version acted with among `pending`
        finished: list[EpisodeStat] = []
        seq = 0
        obs, _ = env.reset(seed=seed)
        ep_return, ep_length = 0.0, 0
        while True:
            if self.steps % poll_every == 0:
                self._sync_weights()
            if self.steps % HOUSEKEEPING_EVERY == 0:
                if self.link.tick(self._counters):
                    break
                agent.epsilon = self._epsilon_schedule(self.steps)
                if step_period:
                    self._pace(step_period, HOUSEKEEPING_EVERY)
            if max_steps is not None and self.steps >= max_steps:
                break
            version = agent.weights_version
            action = agent.act(obs[None], explore=True)[0]
            next_obs, reward, terminated, truncated, _ = env.step(action)
            self.steps += 1
            ep_return += float(reward)
            ep_length += 1
            emitted = steps.step(obs, action, float(reward), terminated, truncated, next_obs)
            # The version each windowed step was acted with. One env's versions never decrease, so
            # the first step to leave the window is the oldest of those that left (no min needed;
            # the vector loop, whose sub-envs differ, uses ActedVersions).
            acted.append(version)
            if emitted:
                oldest = acted.popleft()
                while len(acted) > len(steps):
                    acted.popleft()
                if not pending:
                    pending_version = oldest
                pending.extend(emitted)
            if terminated or truncated:
                finished.append(EpisodeStat(ep_return, ep_length))
                self._recent_returns.append(ep_return)
                self.episodes += 1
                ep_return, ep_length = 0.0, 0
                obs, _ = env.reset()
            else:
                obs = next_obs
            if len(pending) >= send_batch:
                if not self._ship(pending, finished, pending_version, seq, obs_dtype, action_dtype):
                    break
                seq += 1
                pending, finished = [], []

    def _vector_loop(self, env: Any, spec: SampleSpec, seed: int) -> None:
        """``_loop`` for E > 1 sub-envs: one batched ``act`` and one ``env.step`` per iteration.

        Counters, pacing, weight polls, housekeeping and ``max_steps`` go by real env transitions
        (``VectorNStep.real_steps``), which advance by up to E per iteration: ``max_steps`` may be
        overshot by fewer than E, and housekeeping runs on the first iteration at or past each
        multiple-of-``HOUSEKEEPING_EVERY`` mark rather than exactly on it.
        """
        cfg = self.cfg
        num_envs = self.num_envs
        send_batch = cfg.actor.send_batch
        poll_every = cfg.actor.weights_poll_steps
        max_steps = cfg.actor.max_steps
        step_period = 1.0 / cfg.actor.max_steps_per_s if cfg.actor.max_steps_per_s else 0.0
        obs_dtype, action_dtype = spec.obs_dtype, spec.action_dtype
        agent = self.agent
        vec = VectorNStep(num_envs, cfg.agent.n_step, cfg.agent.gamma)
        acted = ActedVersions(num_envs)
        pending: list[Transition] = []
        pending_version = agent.weights_version  # the oldest version acted with among `pending`
        finished: list[EpisodeStat] = []
        seq = 0
        next_poll = next_housekeeping = paced_steps = 0
        # SyncVectorEnv (copy=True, as make_vector_env builds it) returns fresh arrays each step, so
        # transitions may keep row views of them.
        obs, _ = env.reset(seed=[seed + j for j in range(num_envs)])
        while True:
            if self.steps >= next_poll:
                self._sync_weights()
                next_poll = self.steps + poll_every
            if self.steps >= next_housekeeping:
                if self.link.tick(self._counters):
                    break
                agent.epsilon = self._sub_env_epsilons(np.asarray(vec.env_steps))
                if step_period:
                    self._pace(step_period, self.steps - paced_steps)
                    paced_steps = self.steps
                next_housekeeping = self.steps + HOUSEKEEPING_EVERY
            if max_steps is not None and self.steps >= max_steps:
                break
            version = agent.weights_version
            actions = agent.act(obs, explore=True)  # each row explores at its sub-env's epsilon
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            fed = [not reset for reset in vec.autoreset]  # rows in their autoreset step are skipped
            emitted = vec.step(obs, actions, rewards, terminated, truncated, next_obs)
            oldest = acted.step(version, fed, [len(p) for p in vec.processors])
            if oldest is not None:
                pending_version = oldest if not pending else min(pending_version, oldest)
                pending.extend(emitted)
            self.steps += vec.real_steps
            for _, stat in vec.ended:
                finished.append(stat)
                self._recent_returns.append(stat.ret)
                self.episodes += 1
            obs = next_obs
            if len(pending) >= send_batch:
                if not self._ship(pending, finished, pending_version, seq, obs_dtype, action_dtype):
                    break
                seq += 1
                pending, finished = [], []

    def _sub_env_epsilons(self, env_steps: np.ndarray) -> np.ndarray:
        """Each sub-env's epsilon: annealed linearly from 1.0 to its rung over ``epsilon_decay_steps``
        of that sub-env's own transitions (as a single-env actor on that rung would be)."""
        if self._epsilon_decay == 0:
            return self.epsilons.copy()
        frac = np.minimum(env_steps / self._epsilon_decay, 1.0)
        return 1.0 + (self.epsilons - 1.0) * frac

    def _ship(
        self,
        pending: list[Transition],
        finished: list[EpisodeStat],
        version: int,
        seq: int,
        obs_dtype: str,
        action_dtype: str,
    ) -> bool:
        """Send ``pending`` (with Ape-X initial priorities where the run and the agent have them);
        returns False if told to stop while the learner's queue was full, or before the learner
        was heard from."""
        if not self._learner_heard:
            log.info("holding the first batch until the learner's weights (and run fingerprint) arrive")
            if not self._await_learner(lambda: self._learner_heard):
                return False
        batch = to_batch(pending, obs_dtype, action_dtype)
        priorities = self._priorities(batch) if self._initial_priorities is not None else None
        msg = SamplesMsg(
            actor_id=self.actor_id,
            seq=seq,
            weights_version=version,
            batch=batch,
            episodes=finished,
            priorities=priorities,
        )
        if not self.sender.send(msg, idle=self._idle):
            return False
        self.samples_sent += len(pending)
        return True

    def _priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """``agent.initial_priorities(batch)`` as float32 (B,), or None when the agent has none or
        they are unusable (NaN, inf, negative: the learner then gives the rows its max priority)."""
        assert self._initial_priorities is not None
        started = time.perf_counter()
        try:
            raw = self._initial_priorities(batch)
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

    def _await_weights(self) -> bool:
        """Block until published weights are loaded (the learner republishes about every second);
        returns False if told to stop meanwhile."""
        log.info("replacement actor: waiting for the learner's current weights before acting")
        if not self._await_learner(lambda: self.agent.weights_version > 0):
            return False
        log.info("weights version %d loaded; starting", self.agent.weights_version)
        return True

    def _await_learner(self, ready: Callable[[], bool]) -> bool:
        """Heartbeat ("waiting") and take in weights until ``ready()``; False if told to stop first.
        A learner whose run fingerprint differs raises ``FingerprintMismatch`` from here; one not
        heard from for ``transport.connect_timeout`` raises ``LearnerUnreachable``, as a send
        that never goes through does (unreachable, or refusing this actor's keys)."""
        endpoint, give_up = self.cfg.transport.weights, self.cfg.transport.connect_timeout
        started = time.monotonic()
        next_warning = SampleSender.FIRST_WARNING_SECONDS
        while not ready():
            if self.link.tick(self._counters, state="waiting"):
                return False
            self._sync_weights()
            if ready():
                break
            waited = time.monotonic() - started
            if waited >= next_warning:
                next_warning *= 2
                log.warning(
                    "no weights from the learner at %s after %.0f s: is it running and publishing "
                    "there? (with keys: does it accept transport.key_name?) Waiting.",
                    endpoint,
                    waited,
                )
            if give_up is not None and waited > give_up:
                raise LearnerUnreachable(
                    f"no weights received from {endpoint} for {waited:.0f} s (transport.connect_timeout): "
                    "check that the learner runs and publishes there, and transport.keys_dir / "
                    "transport.key_name if the run uses keys"
                )
            self._weights_sock.poll(WEIGHTS_WAIT_POLL_MS)
        return True

    def _pace(self, step_period: float, steps: int) -> None:
        """Sleep off any lead over ``actor.max_steps_per_s`` (leaves CPU to the learner), ``steps``
        being the env transitions this call accounts for."""
        now = time.monotonic()
        self._pace_due = max(self._pace_due, now - PACE_MAX_DEBT) + steps * step_period
        ahead = self._pace_due - now
        if ahead > 0:
            self.paced_seconds += ahead
            time.sleep(ahead)

    def _idle(self) -> bool:
        """Called while the learner's queue is full: keep draining weights (newer versions, and the
        learner's stop announcement, which a full subscriber queue could otherwise crowd out) and
        heartbeating; stop if told to."""
        self._sync_weights()
        return self.link.tick(self._counters, state="blocked")

    def _sync_weights(self) -> None:
        msg = self.weights.latest()  # raises FingerprintMismatch for a learner with other settings
        if msg is not None:
            self._learner_heard = True
            if self.agent.import_weights(msg.weights):
                self.weights_loaded += 1
        if self.weights.stop is not None and self.link.outlives(self.weights.stop.reason):
            log.warning("the learner failed; acting on until the supervisor's replacement publishes")
            self.weights.stop = None
        if self.weights.stop is not None and not self.stop_event.is_set():
            self.link.stop_reason = self.weights.stop.reason or "learner stopped"
            log.info("stop announced by the learner: %s", self.link.stop_reason)
            self.stop_event.set()

    def _counters(self) -> dict[str, float | int]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "envs": self.num_envs,
            "steps": self.steps,
            "episodes": self.episodes,
            "samples": self.samples_sent,
            "batches": self.sender.messages_sent,
            "weights_version": self.agent.weights_version,
            "weights_loaded": self.weights_loaded,
            # A vector actor reports the mean of its sub-envs' epsilons.
            "epsilon": float(np.mean(self.agent.epsilon)),
            "steps_per_s": self.steps / elapsed,
            "samples_per_s": self.samples_sent / elapsed,
            "blocked_seconds": self.sender.blocked_seconds,
            "paced_seconds": self.paced_seconds,
            "priority_seconds": self.priority_seconds,
            "bad_messages": self.weights.bad.count,
            "recent_return": float(np.mean(self._recent_returns)) if self._recent_returns else float("nan"),
            "duration": elapsed,
        }
