"""The learner's two server sockets, bound before torch is imported.

A learner process spends about a second importing torch. Its actors start as fast as Python does
and connect while it loads; if the learner's sockets are bound only after the import, each
actor's connection waits for its next reconnect attempt, and the run's first update waits for
the slowest of them. Bound first (the process main does this before importing the learner),
every actor is connected by the time the first weights are published, and the batches it
collected meanwhile (zmqrl.actor.main: ``early_batches``) reach the learner at once.

Nothing here imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.config import Config
from zmqrl.runtime.link import socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.security import start_authenticator

# How long the closing weights socket may take to deliver the learner's stop announcement.
STOP_LINGER_MS = 500


@dataclass
class LearnerSockets:
    """The bound samples PULL and weights XPUB, their real endpoints, and the Curve
    authenticator when the run uses keys (it must run before a Curve server socket binds)."""

    samples: zmq.Socket
    samples_endpoint: str
    weights: zmq.Socket
    weights_endpoint: str
    auth: Any
    bound_at: float  # wall-clock seconds

    def close(self) -> None:
        """Close both sockets (the weights one lingers for the stop announcement), then the
        authenticator."""
        self.samples.close(linger=0)
        self.weights.close(linger=STOP_LINGER_MS)
        if self.auth is not None:
            self.auth.stop()


def bind_learner_sockets(cfg: Config, ctx: zmq.Context) -> LearnerSockets:
    """Bind ``transport.samples`` and ``transport.weights`` as the learner does; raises
    ``BindError`` / ``SecurityError`` (nothing is left open then)."""
    limits = socket_limits(cfg)
    security = transport_security(cfg)
    insecure = cfg.transport.insecure
    auth = start_authenticator(security, ctx) if security is not None else None
    opened: list[zmq.Socket] = []
    try:
        samples, samples_ep = sockets.samples_pull(
            ctx, cfg.transport.samples, limits, security=security, insecure=insecure
        )
        opened.append(samples)
        weights, weights_ep = sockets.weights_pub(
            ctx, cfg.transport.weights, limits, security=security, insecure=insecure
        )
    except BaseException:
        for sock in opened:
            sock.close(linger=0)
        if auth is not None:
            auth.stop()
        raise
    return LearnerSockets(samples, samples_ep, weights, weights_ep, auth, time.time())
