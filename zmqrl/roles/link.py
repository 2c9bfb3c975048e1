"""A role's two channels to the supervisor: heartbeats out, stop broadcasts in.

Learner and actor both call ``tick()`` from their main loops, so a heartbeat is proof that the
main loop (not some helper thread) is making progress.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import zmq

from zmqrl.config import Config
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, ControlSubscriber, HeartbeatSender
from zmqrl.transport.security import Security

# Set by the supervisor in its children's environment: they then watch its heartbeat.
SUPERVISED_ENV = "ZMQRL_SUPERVISED"
# What a learner that crashed announces on the weights channel before it exits.
LEARNER_FAILED = "learner failed"
# Seconds between polls of the control socket; bounds how late a stop broadcast is noticed.
CONTROL_POLL_SECONDS = 0.1

log = logging.getLogger("zmqrl.link")


def transport_security(cfg: Config) -> Security | None:
    """This process's Curve keys when the run uses them (``transport.keys_dir``), else None."""
    return Security.load(Path(cfg.transport.keys_dir)) if cfg.transport.keys_dir else None


def socket_limits(cfg: Config) -> sockets.SocketLimits:
    t = cfg.transport
    return sockets.SocketLimits(
        samples_hwm=t.samples_hwm,
        max_message_bytes=t.max_message_mb * 2**20,
        linger_ms=t.linger_ms,
        samples_buffer_bytes=t.samples_buffer_kb * 1024,
    )


class SupervisorLink:
    def __init__(
        self,
        ctx: zmq.Context,
        cfg: Config,
        role: str,
        role_id: int,
        stop_event: threading.Event,
        clock: Callable[[], float] = time.monotonic,
        watch_supervisor: bool | None = None,
    ) -> None:
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        self._hb_sock = sockets.heartbeat_push(ctx, cfg.transport.heartbeat, limits, security=security)
        self._ctl_sock = sockets.control_sub(ctx, cfg.transport.control, limits, security=security)
        self.heartbeat = HeartbeatSender(
            self._hb_sock, role, role_id, cfg.supervisor.heartbeat_interval, clock
        )
        self.control = ControlSubscriber(self._ctl_sock, BadMessages(f"{role}-{role_id} control", log), clock)
        self.stop_event = stop_event
        self.stop_reason = ""
        self._clock = clock
        self._next_control = 0.0
        # Started by `zmqrl launch`: leave if the supervisor falls silent (it died, or hangs), so
        # no process of a run outlives its supervisor, on any OS and whatever killed it.
        if watch_supervisor is None:
            watch_supervisor = os.environ.get(SUPERVISED_ENV) == "1"
        self._watch_timeout = cfg.supervisor.heartbeat_timeout if watch_supervisor else None
        self.supervised = bool(watch_supervisor)
        self._created = clock()

    def outlives(self, learner_stop_reason: str) -> bool:
        """Whether to stay up through the learner's announced end: under a supervisor a failed
        learner is restarted, and the actors (and evaluator) it had are needed again; started by
        hand, a role leaves with its learner whatever the reason."""
        return self.supervised and learner_stop_reason == LEARNER_FAILED

    def tick(
        self,
        counters: Callable[[], Mapping[str, float | int]],
        info: Mapping[str, str] | None = None,
        state: str = "running",
    ) -> bool:
        """Heartbeat if due and check for a stop broadcast; returns whether the role should stop."""
        now = self._clock()
        if now >= self._next_control:
            self._next_control = now + CONTROL_POLL_SECONDS
            stop = self.control.poll_stop()
            if stop is not None and not self.stop_event.is_set():
                self.stop_reason = stop.reason or "stop broadcast"
                log.info("stop received from supervisor: %s", self.stop_reason)
                self.stop_event.set()
            if self._watch_timeout is not None and not self.stop_event.is_set():
                silent = now - (self.control.supervisor_seen or self._created)
                if silent > self._watch_timeout:
                    self.stop_reason = f"supervisor silent for {silent:.0f} s"
                    log.error("%s: shutting down (the run has lost its supervisor)", self.stop_reason)
                    self.stop_event.set()
        if self.heartbeat.due():
            self.heartbeat.beat(state, counters(), info)
        return self.stop_event.is_set()

    def final(
        self, state: str, counters: Mapping[str, float | int], info: Mapping[str, str] | None = None
    ) -> None:
        """Last heartbeat with the final counters; the supervisor's summary is built from it."""
        self.heartbeat.beat(state, counters, info)

    def close(self) -> None:
        self._ctl_sock.close(linger=0)
        self._hb_sock.close()  # default linger: lets the final heartbeat reach the supervisor
