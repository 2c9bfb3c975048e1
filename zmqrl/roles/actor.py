"""An actor: its own env and agent copy, an n-step processor, and a socket to push samples on."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl.agents import make_agent
from zmqrl.config import Config
from zmqrl.envs import make_env, sample_spec
from zmqrl.exploration import LinearSchedule, apex_epsilon
from zmqrl.roles.link import SupervisorLink, socket_limits, transport_security
from zmqrl.steps import NStepProcessor, Transition, to_batch
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, SampleSender, WeightsSubscriber
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat

# Actor i's env is seeded with run.seed + ACTOR_SEED_STRIDE * (i + 1): distinct and reproducible.
ACTOR_SEED_STRIDE = 1000
# Env steps between (time-gated) heartbeat / control checks.
HOUSEKEEPING_EVERY = 16
# A replacement actor checks for the learner's weights this often while it waits for them.
WEIGHTS_WAIT_POLL_SECONDS = 0.05
# Pacing never lets an actor bank more than this many seconds of unused step budget (e.g. while it
# was blocked on a full learner queue), so a capped actor does not burst afterwards.
PACE_MAX_DEBT = 0.05

log = logging.getLogger("zmqrl.actor")


class Actor:
    """Steps its env with exploration, turns steps into n-step transitions and ships them.

    Acts with its own initial weights until the learner's first publish arrives; from then on it
    adopts every newer version (never an older one) and stamps each batch with the version its
    oldest transition was acted with, so the learner can measure policy lag.
    """

    def __init__(
        self, cfg: Config, actor_id: int, *, ctx: zmq.Context | None = None, replacement: bool = False
    ) -> None:
        if not 0 <= actor_id < max(cfg.actor.num_actors, actor_id + 1):
            raise ValueError(f"actor id {actor_id} must be >= 0")
        self.cfg = cfg
        self.actor_id = actor_id
        # Started in place of a failed actor: the run is under way, so act with the learner's
        # current weights from the first step and at this slot's rung of the ladder (no warm-up).
        self.replacement = replacement
        self._ctx = ctx or zmq.Context.instance()
        self.stop_event = threading.Event()
        self.stats: dict[str, Any] = {}
        self.steps = 0
        self.episodes = 0
        self.samples_sent = 0
        self.weights_loaded = 0
        self.paced_seconds = 0.0
        self._recent_returns: deque[float] = deque(maxlen=20)

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(1)
        num_actors = max(cfg.actor.num_actors, self.actor_id + 1)
        self.epsilon = apex_epsilon(self.actor_id, num_actors, cfg.actor.epsilon, cfg.actor.epsilon_alpha)
        seed = cfg.run.seed + ACTOR_SEED_STRIDE * (self.actor_id + 1)
        env = make_env(cfg.env)
        spec = sample_spec(env)
        # Start fully random and anneal to this actor's rung of the ladder (no-op when decay is 0).
        decay = 0 if self.replacement else cfg.actor.epsilon_decay_steps
        self._epsilon_schedule = LinearSchedule(1.0, self.epsilon, decay)
        self.agent = make_agent(cfg.agent, spec, epsilon=self._epsilon_schedule(0), device="cpu", seed=seed)
        steps = NStepProcessor(cfg.agent.n_step, cfg.agent.gamma)
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        samples_sock = sockets.samples_push(self._ctx, cfg.transport.samples, limits, security=security)
        weights_sock = sockets.weights_sub(self._ctx, cfg.transport.weights, limits, security=security)
        self.sender = SampleSender(samples_sock)
        self.weights = WeightsSubscriber(
            weights_sock, self.agent.weights_spec(), BadMessages(f"actor-{self.actor_id} weights", log)
        )
        self.link = SupervisorLink(self._ctx, cfg, "actor", self.actor_id, self.stop_event)
        log.info(
            "actor %d up: epsilon %.4f (annealed from 1.0 over %d steps), seed %d, samples -> %s",
            self.actor_id,
            self.epsilon,
            cfg.actor.epsilon_decay_steps,
            seed,
            cfg.transport.samples,
        )
        self.started = time.monotonic()
        self._pace_due = self.started
        state = "failed"
        try:
            if not self.replacement or self._await_weights():
                self._loop(env, steps, spec.obs_dtype, spec.action_dtype, seed)
            state = "stopped"
        finally:
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
        pending: list[Transition] = []
        pending_version = agent.weights_version
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
                    self._pace(step_period)
            if max_steps is not None and self.steps >= max_steps:
                break
            action = agent.act(obs[None], explore=True)[0]
            next_obs, reward, terminated, truncated, _ = env.step(action)
            self.steps += 1
            ep_return += float(reward)
            ep_length += 1
            if not pending:
                pending_version = agent.weights_version
            pending.extend(steps.step(obs, action, float(reward), terminated, truncated, next_obs))
            if terminated or truncated:
                finished.append(EpisodeStat(ep_return, ep_length))
                self._recent_returns.append(ep_return)
                self.episodes += 1
                ep_return, ep_length = 0.0, 0
                obs, _ = env.reset()
            else:
                obs = next_obs
            if len(pending) >= send_batch:
                msg = SamplesMsg(
                    actor_id=self.actor_id,
                    seq=seq,
                    weights_version=pending_version,
                    batch=to_batch(pending, obs_dtype, action_dtype),
                    episodes=finished,
                )
                if not self.sender.send(msg, idle=self._idle):
                    break
                seq += 1
                self.samples_sent += len(pending)
                pending, finished = [], []

    def _await_weights(self) -> bool:
        """Block until published weights are loaded (the learner republishes about every second);
        returns False if told to stop meanwhile."""
        log.info("replacement actor: waiting for the learner's current weights before acting")
        while self.agent.weights_version == 0:
            if self.link.tick(self._counters, state="waiting"):
                return False
            self._sync_weights()
            time.sleep(WEIGHTS_WAIT_POLL_SECONDS)
        log.info("weights version %d loaded; starting", self.agent.weights_version)
        return True

    def _pace(self, step_period: float) -> None:
        """Sleep off any lead over ``actor.max_steps_per_s`` (leaves CPU to the learner)."""
        now = time.monotonic()
        self._pace_due = max(self._pace_due, now - PACE_MAX_DEBT) + HOUSEKEEPING_EVERY * step_period
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
        msg = self.weights.latest()
        if msg is not None and self.agent.import_weights(msg.weights):
            self.weights_loaded += 1
        if self.weights.stop is not None and not self.stop_event.is_set():
            self.link.stop_reason = self.weights.stop.reason or "learner stopped"
            log.info("stop announced by the learner: %s", self.link.stop_reason)
            self.stop_event.set()

    def _counters(self) -> dict[str, float | int]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "steps": self.steps,
            "episodes": self.episodes,
            "samples": self.samples_sent,
            "batches": self.sender.messages_sent,
            "weights_version": self.agent.weights_version,
            "weights_loaded": self.weights_loaded,
            "epsilon": self.agent.epsilon,
            "steps_per_s": self.steps / elapsed,
            "samples_per_s": self.samples_sent / elapsed,
            "blocked_seconds": self.sender.blocked_seconds,
            "paced_seconds": self.paced_seconds,
            "bad_messages": self.weights.bad.count,
            "recent_return": float(np.mean(self._recent_returns)) if self._recent_returns else float("nan"),
            "duration": elapsed,
        }
