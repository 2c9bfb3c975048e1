"""The learner's two server sockets, bound before torch is imported: weights here, samples by the
learner's intake process (zmqrl/learner/intake_process.py), which it starts here too.

A learner process spends about a second importing torch. Its actors start as fast as Python does
and connect while it loads; if the learner's sockets are bound only after the import, each
actor's connection waits for its next reconnect attempt, and the run's first update waits for
the slowest of them. Bound first (the process main does this before importing the learner),
every actor is connected by the time the first weights are published, and the batches it
collected meanwhile (zmqrl.actor.parts: ``early_batches``) reach the learner at once.

The intake starts in parallel with the rest of the learner's start: it binds while this process
binds the weights socket and imports torch. Nothing here imports torch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.config import Config
from zmqrl.learner.intake import IntakeProcess
from zmqrl.runtime.link import socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.security import start_authenticator

log = logging.getLogger("zmqrl.learner")

# How long the closing weights socket may take to deliver the learner's stop announcement.
STOP_LINGER_MS = 500


@dataclass
class LearnerSockets:
    """The intake process (with the samples PULL it bound) and the weights XPUB, their real
    endpoints, and the Curve authenticator when the run uses keys (it must run before a Curve
    server socket binds; the intake runs one of its own)."""

    intake: IntakeProcess
    weights: zmq.Socket
    weights_endpoint: str
    auth: Any
    bound_at: float  # wall-clock seconds

    @property
    def samples_endpoint(self) -> str:
        """Where the intake bound ``transport.samples``: waits for it the first time (it binds while
        this process imports torch); raises BindError / SecurityError as a bind here would."""
        return self.intake.endpoint or self.intake.bound()

    def close(self) -> None:
        """Stop the intake, close the weights socket (it lingers for the stop announcement), then
        the authenticator."""
        self.intake.close()
        self.weights.close(linger=STOP_LINGER_MS)
        if self.auth is not None:
            self.auth.stop()


def bind_learner_sockets(cfg: Config, ctx: zmq.Context) -> LearnerSockets:
    """Start the intake (which binds ``transport.samples``) and bind ``transport.weights`` as the
    learner does; raises ``BindError`` / ``SecurityError`` (nothing is left open or running then),
    or, for the samples socket, ``samples_endpoint`` does once asked (close() then stops all).
    The intake's bad-message tally counts the learner's own drops too (``intake.bad.own``)."""
    limits = socket_limits(cfg)
    security = transport_security(cfg)
    insecure = cfg.transport.insecure
    intake = IntakeProcess(ctx, cfg.transport, BadMessages("learner ingest", log))
    auth = None
    try:
        auth = start_authenticator(security, ctx) if security is not None else None
        weights, weights_ep = sockets.weights_pub(
            ctx, cfg.transport.weights, limits, security=security, insecure=insecure
        )
    except BaseException:
        intake.close()
        if auth is not None:
            auth.stop()
        raise
    return LearnerSockets(intake, weights, weights_ep, auth, time.time())
