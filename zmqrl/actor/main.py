"""An actor process: its sampling loop wired to the samples socket, weights subscription and supervisor."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from zmqrl.actor.parts import build_acting
from zmqrl.actor.sampler import HOUSEKEEPING_EVERY, Collected, actor_seed
from zmqrl.config import Config
from zmqrl.runtime.link import SupervisorLink, socket_limits, transport_security
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.runtime.testhooks import Faults
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, LearnerUnreachable, SampleSender, WeightsSubscriber
from zmqrl.transport.wire import SamplesMsg

# While waiting for the learner's weights, an actor heartbeats at least this often (milliseconds).
WEIGHTS_WAIT_POLL_MS = 50
# Pacing never banks more than this many seconds of unused step budget.
PACE_MAX_DEBT = 0.05
# Longest single sleep of the pacer: a low cap still reports progress (the actor's watchdog) and
# notices a stop this often.
PACE_SLICE_SECONDS = 0.5

log = logging.getLogger("zmqrl.actor")


def one_torch_thread() -> None:
    """Give torch one intra-op thread in this process if the policy just built imported it.

    Actors start without torch (numpy policies); a torch policy (the Nature CNN) imports it while
    it is built, so this must run after ``make_policy``. Left at torch's default (one thread per
    core), several actors' OpenMP threads spin against each other on a few cores (what that cost:
    docs/performance.md, "Figures behind the actor's code").
    """
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


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


class Actor:
    """An actor process's lifecycle: builds its parts and sockets, drives its sampler, sends what
    its adder hands over, takes in weights, heartbeats, paces and stops.

    Acts with its own initial weights until the learner's first publish arrives; from then on it
    adopts every newer version (never an older one) and stamps each batch with the version its
    oldest transition was acted with, so the learner can measure policy lag.

    Nothing is sent before the learner was heard from: batches wait until a valid weights message
    arrived, which carries the learner's run fingerprint. An actor whose settings differ raises
    ``FingerprintMismatch`` (exit 2 at the CLI) without having sent a transition. Meanwhile its
    adder holds as many batches as the agent's builder allows (``Adder.hold_limit``), then the
    actor waits for the learner.

    ``faults`` are a test's (zmqrl.runtime.testhooks; the process main builds them from the
    environment): none by default, and then no fault code runs.
    """

    def __init__(
        self,
        cfg: Config,
        actor_id: int,
        *,
        ctx: zmq.Context | None = None,
        replacement: bool = False,
        link: SupervisorLink | None = None,
        faults: Faults | None = None,
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
        self._faults = faults
        self.stop_event = threading.Event()
        self.stats: dict[str, Any] = {}
        self.samples_sent = 0
        self.weights_loaded = 0
        self._learner_heard = False  # a valid (and, if fingerprinted, matching) weights message arrived

    def request_stop(self) -> None:
        self.stop_event.set()

    @property
    def steps(self) -> int:
        return self.sampler.steps if hasattr(self, "sampler") else 0

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        # Snapshots the policy refuses are counted with the weights channel's bad messages.
        bad_weights = BadMessages(f"actor-{self.actor_id} weights", log)
        parts = build_acting(cfg, self.actor_id, replacement=self.replacement, bad_weights=bad_weights)
        self.agent, spec = parts.policy, parts.spec
        self.sampler = parts.sampler  # steps the env(s) into the adder
        self.adder = parts.adder  # n-step transitions, or on-policy rollouts, as messages
        if self._faults is not None:  # a test's: this one process's sampler may hang (testhooks)
            self.sampler = self._faults.sampler(self.sampler)
        self.weights_client = parts.weights  # newer versions only
        one_torch_thread()
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        samples_sock = sockets.samples_push(self._ctx, cfg.transport.samples, limits, security=security)
        weights_sock = sockets.weights_sub(self._ctx, cfg.transport.weights, limits, security=security)
        self.sender = SampleSender(samples_sock, cfg.transport.samples, cfg.transport.connect_timeout, log)
        self._weights_sock = weights_sock
        self.weights = WeightsSubscriber(
            weights_sock, None, bad_weights, expected_fingerprint=run_fingerprint(cfg, spec)
        )
        self.link = self._link or SupervisorLink(self._ctx, cfg, "actor", self.actor_id)
        self.link.attach(self.stop_event)
        log.info(
            "actor %d up: %s, seed %d, samples -> %s",
            self.actor_id,
            self.sampler.describe(),
            actor_seed(cfg, self.actor_id),
            cfg.transport.samples,
        )
        self.started = time.monotonic()
        self.pacer = Pacer(cfg.actor.max_steps_per_s)
        state = "failed"
        try:
            reached_max_steps = (not self.replacement or self._await_weights()) and self._loop()
            # Its own end (actor.max_steps) is "finished"; a stop it was asked for, "stopped".
            state = "finished" if reached_max_steps else "stopped"
        finally:
            self.weights.bad.flush()
            self.stats = {**self._counters(), "state": state, "stop_reason": self.link.stop_reason}
            self.link.final(state, self._counters())
            self.sampler.close()
            samples_sock.close(linger=0)
            weights_sock.close(linger=0)
            self.link.close()
        return self.stats

    def _loop(self) -> bool:
        """Heartbeat and pace every HOUSEKEEPING_EVERY env steps; collect and ship in between.
        Returns True at ``actor.max_steps``, False when told to stop."""
        max_steps = self.cfg.actor.max_steps
        sampler, adder = self.sampler, self.adder
        next_housekeeping = paced_steps = ticked_steps = 0
        while True:
            if sampler.steps >= next_housekeeping:
                if self.link.tick(self._counters, useful=sampler.steps > ticked_steps):
                    return False
                ticked_steps = sampler.steps
                self.pacer.pace(sampler.steps - paced_steps, tick=lambda: self.link.tick(self._counters))
                paced_steps = sampler.steps
                next_housekeeping = sampler.steps + HOUSEKEEPING_EVERY
            if max_steps is not None and sampler.steps >= max_steps:
                # What was held before the learner was heard from still goes to it (waiting for it,
                # as a first batch always did).
                if adder.held and not self._await_learner(lambda: self._learner_heard):
                    return False
                return self._send_all()
            budget = next_housekeeping - sampler.steps
            if max_steps is not None:
                budget = min(budget, max_steps - sampler.steps)
            collected = sampler.collect(budget)
            if collected is Collected.WEIGHTS_DUE:
                self._sync_weights()
            elif collected is Collected.BATCH_READY and not self._learner_heard and not adder.hold():
                log.info("holding the next batch until the learner's weights (and run fingerprint) arrive")
                if not self._await_learner(lambda: self._learner_heard):
                    return False
            if self._learner_heard and not self._send_all():
                return False

    def _send_all(self) -> bool:
        """Send what the adder hands over (held batches first); False if told to stop meanwhile."""
        while (msg := self.adder.pop()) is not None:
            if not self._send(msg):
                return False
        return True

    def _send(self, msg: SamplesMsg) -> bool:
        sent = self.sender.send(msg)
        while not sent:  # held back by the learner's queue: housekeeping between retries
            if self._idle():
                self.sender.abandon()
                return False
            sent = self.sender.retry()
        self.samples_sent += msg.batch.size
        return True

    def _await_weights(self) -> bool:
        """Block until published weights are loaded (the learner republishes about every second);
        returns False if told to stop meanwhile."""
        log.info("replacement actor: waiting for the learner's current weights before acting")
        if not self._await_learner(lambda: self.weights_client.version > 0):
            return False
        log.info("weights version %d loaded; starting", self.weights_client.version)
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
                    "no weights from the learner at %s (transport.weights) after %.0f s: is the learner "
                    "running there? a firewall in between? with Curve keys, does it accept "
                    "transport.key_name? Waiting%s.",
                    endpoint,
                    waited,
                    "" if give_up is None else f" (giving up after transport.connect_timeout={give_up:g} s)",
                )
            if give_up is not None and waited > give_up:
                raise LearnerUnreachable(
                    f"no weights received from {endpoint} for {waited:.0f} s (transport.connect_timeout): "
                    "check that the learner runs and publishes there (transport.weights), that no firewall "
                    "is in between, and transport.keys_dir / transport.key_name if the run uses Curve keys"
                )
            self._weights_sock.poll(WEIGHTS_WAIT_POLL_MS)
        return True

    def _idle(self) -> bool:
        """While the learner's queue holds a batch back: keep draining weights (newer versions, and the
        learner's stop announcement, which a full subscriber queue could otherwise crowd out) and
        heartbeating; stop if told to."""
        self._sync_weights()
        return self.link.tick(self._counters, state="blocked")

    def _sync_weights(self) -> None:
        msg = self.weights.latest()  # raises FingerprintMismatch for a learner with other settings
        if msg is not None:
            self._learner_heard = True
            if self.weights_client.offer(msg.weights):
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
            **self.sampler.counters(elapsed),
            "samples": self.samples_sent,
            "batches": self.sender.messages_sent,
            "weights_loaded": self.weights_loaded,
            "samples_per_s": self.samples_sent / elapsed,
            "blocked_seconds": self.sender.blocked_seconds,
            "paced_seconds": self.pacer.paced_seconds,
            "bad_messages": self.weights.bad.count,
            "duration": elapsed,
        }
