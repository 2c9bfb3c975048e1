"""The weights channel (learner -> actors): :class:`WeightsPublisher` and :class:`WeightsSubscriber`,
and the versions the snapshots on it carry (:class:`WeightsNumbering`, :class:`WeightsClient`).

The learner publishes each new version once and republishes the latest on a timer and whenever a
subscriber joins (its XPUB socket reports joins); a subscriber drains its queue to the newest
valid snapshot, each message read within the channel's frame limit, and refuses weights whose run
fingerprint differs from its own.

The sync-model rules for weight versions, both halves, live here with the channel and out of the
agents. Learner side, :class:`WeightsNumbering`: each published snapshot carries a number that
grows whenever the weights changed since the previous one (republishing the same weights reuses
it, so it costs actors nothing) and that starts above a floor, the highest number a previous
learner of the run published (``zmqrl.learner.versions`` keeps it on disk), so actors never
mistake new weights for old after a restart.

Actor and evaluator side, :class:`WeightsClient`: it hands the policy only a strictly newer
snapshot, so a late or duplicated publish can never roll an actor back, and it knows which
version the policy acts with (what an actor stamps its samples with). A snapshot the policy
refuses (names or shapes of another network) is counted as a bad message and changes nothing.

Neither of those two touches a socket: serial mode, which has none, numbers and loads weights the same way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from zmqrl.core import Policy
from zmqrl.transport import wire
from zmqrl.transport.bad_messages import BadMessages, Clock
from zmqrl.transport.fingerprint import check_fingerprint
from zmqrl.transport.receiving import recv_bounded
from zmqrl.transport.sample_channel import channel_limit
from zmqrl.transport.wire import Fingerprint, StopMsg, WeightsMsg, WireError
from zmqrl.types import Weights

# Subscription messages a weights publisher reads per call (a flood waits for later calls).
JOINS_PER_CALL = 64
# Least time between two sends of the same weights for joining subscribers: a peer that connects
# and leaves in a loop cannot make the learner publish more often than this.
JOIN_RESEND_SECONDS = 0.05
# Most frames of a weights message: the header and one per parameter tensor.
WEIGHTS_MAX_FRAMES = 1 + wire.MAX_ARRAYS


class WeightsPublisher:
    """Learner side of the weights channel. Keeps the last encoded message for republishing.

    ``fingerprint`` (``zmqrl.transport.fingerprint.run_fingerprint``) travels with every snapshot, so an
    actor whose settings differ can refuse itself instead of sending wrong transitions.
    """

    def __init__(
        self,
        sock: zmq.Socket,
        agent_kind: str,
        clock: Clock = time.monotonic,
        fingerprint: Fingerprint | None = None,
    ) -> None:
        self._sock = sock
        self._agent_kind = agent_kind
        self._clock = clock
        self.fingerprint = fingerprint
        self._frames: list[bytes | memoryview] | None = None
        self._last_sent = -float("inf")
        self._last_join_send = -float("inf")
        self._xpub = sock.type == zmq.XPUB
        self._joiner_waiting = False  # a subscriber joined after the last send
        self.version = 0
        self.publishes = 0
        self.joins = 0  # subscribers that joined, as the XPUB socket reported them

    def publish(self, weights: Weights, env_steps: int | None = None) -> None:
        """Send ``weights`` (encoded once per version); ``env_steps`` is the learner's count of
        transitions received, sent along so evaluations share the learner's x-axis."""
        if weights.version < self.version:
            raise ValueError(f"weights version went backwards: {weights.version} < {self.version}")
        if weights.version != self.version or self._frames is None:
            msg = WeightsMsg(
                weights=weights, agent=self._agent_kind, fingerprint=self.fingerprint, env_steps=env_steps
            )
            self._frames = wire.dump(msg)
            self.version = weights.version
        self._send()

    def republish_if_due(self, interval: float) -> bool:
        """Re-send the latest weights if a subscriber joined since the last call (XPUB sockets
        tell), or if ``interval`` seconds passed since the last send; returns whether it sent.

        PUB/SUB drops what was sent before a subscriber's connection was up, so without this a
        new actor (and every actor at the start of a run) waited up to ``interval`` for weights.
        """
        self._joiner_waiting |= self._read_joins() > 0
        if self._frames is None:
            return False
        now = self._clock()
        if self._joiner_waiting and now - self._last_join_send >= JOIN_RESEND_SECONDS:
            self._last_join_send = now
        elif now - self._last_sent < interval:
            return False
        self._send()
        self._joiner_waiting = False
        return True

    def _read_joins(self) -> int:
        """Subscriptions received since the last call (at most ``JOINS_PER_CALL`` read now)."""
        if not self._xpub:
            return 0
        joins = 0
        for _ in range(JOINS_PER_CALL):
            if not int(self._sock.get(zmq.EVENTS)) & zmq.POLLIN:  # cheaper than catching zmq.Again
                break
            try:
                frame = self._sock.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            if frame[:1] == b"\x01":  # 1 + topic: a subscription (0 + topic: one ended)
                joins += 1
        self.joins += joins
        return joins

    def announce_stop(self, reason: str) -> None:
        """Tell subscribers the learner is gone, so actors started by hand leave with it."""
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(wire.dump(StopMsg(reason=reason)), flags=zmq.NOBLOCK)

    def _send(self) -> None:
        assert self._frames is not None
        try:
            self._sock.send_multipart(self._frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # PUB drops rather than blocks; be explicit anyway
            return
        self._last_sent = self._clock()
        self.publishes += 1


class WeightsSubscriber:
    """Actor side of the weights channel: drains the socket and keeps only the newest snapshot.

    With ``expected_fingerprint`` (this process's own ``run_fingerprint``), a weights message whose
    fingerprint differs raises ``FingerprintMismatch`` from ``latest()`` and is never returned: the
    caller must not act on, or send transitions for, a run whose settings it does not share. The
    check comes before the reference check, so a learner with another network is named as a
    mismatch instead of being dropped as malformed forever. A message without a fingerprint (an
    older learner) is not checked.
    """

    def __init__(
        self,
        sock: zmq.Socket,
        reference: Mapping[str, tuple[tuple[int, ...], str]] | None,
        bad: BadMessages,
        expected_fingerprint: Fingerprint | None = None,
    ) -> None:
        self._sock = sock
        self._reference = reference
        self.bad = bad
        self.limit = channel_limit(sock, WEIGHTS_MAX_FRAMES)
        self.expected_fingerprint = expected_fingerprint
        self.fingerprint: Fingerprint | None = None  # of the newest valid weights message
        self.stop: StopMsg | None = None  # set once the learner announced that it has stopped

    def latest(self) -> WeightsMsg | None:
        """The newest valid weights message queued since the last call, or None. A ``stop`` from
        the learner is kept in ``self.stop``; anything else that is not valid weights is counted.
        Raises ``FingerprintMismatch`` (see the class doc).

        Received without a copy: the decoded arrays are views of ZeroMQ's own buffers, validated
        and then copied once, by ``import_weights``, into the policy's parameters (for a Nature
        CNN a copy of 6.7 MB less; no slower for a small MLP either). Each message is read
        within the channel's limit (at most ``WEIGHTS_MAX_FRAMES`` frames and
        transport.max_message_mb over all of them); a larger one is dropped as it is read."""
        queued: list[list[Any]] = []
        # Asking the socket whether a message waits is cheaper than the zmq.Again raised by a
        # receive that finds none (a real share of a cold actor's time per small message).
        while int(self._sock.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                queued.append(recv_bounded(self._sock, self.limit, copy=False))
            except zmq.Again:
                break
            except WireError as exc:  # more frames or bytes than a weights message may have
                self.bad.record(exc)
        # Newest first: older valid snapshots are superseded and never need decoding.
        for frames in reversed(queued):
            try:
                msg = wire.load(frames)
                if isinstance(msg, StopMsg):
                    self.stop = msg
                    continue
                if not isinstance(msg, WeightsMsg):
                    raise WireError(f"expected a weights message, got {type(msg).__name__}")
                self._check_fingerprint(msg)
                wire.validate_weights(msg, self._reference)
            except WireError as exc:
                self.bad.record(exc)
                continue
            self.fingerprint = msg.fingerprint
            return msg
        return None

    def _check_fingerprint(self, msg: WeightsMsg) -> None:
        if self.expected_fingerprint is not None and msg.fingerprint is not None:
            check_fingerprint(self.expected_fingerprint, msg.fingerprint)


# Weight versions: numbered by the learner, loaded only when newer by actors and evaluators.


class WeightsNumbering:
    """Numbers the learner's snapshots: a new number only after ``changed()``, always above ``floor``."""

    def __init__(self, floor: int = 0) -> None:
        self.version = max(0, int(floor))  # the number of the last snapshot stamped (0: none yet)
        self._changed = True  # the initial weights were never stamped

    def changed(self) -> None:
        """The weights changed (an update ran): the next ``stamp`` gets a new number."""
        self._changed = True

    def continue_after(self, floor: int) -> None:
        """After a restart: the next snapshot is numbered above ``floor`` (the highest version
        published before in this run, or the one a checkpoint held)."""
        if floor >= self.version:
            self.version = int(floor)
            self._changed = True

    def stamp(self, arrays: Mapping[str, np.ndarray]) -> Weights:
        """``arrays`` as a published snapshot, with its number."""
        if self._changed:
            self.version += 1
            self._changed = False
        return Weights(self.version, dict(arrays))


class WeightsClient:
    """Gives ``policy`` newer weights only, and remembers the version it acts with.

    ``bad`` (a fallback is made when None) counts the snapshots the policy refused; the caller's
    channel tally, so that ``bad_messages`` says everything that was dropped.
    """

    def __init__(self, policy: Policy, bad: BadMessages | None = None, version: int = 0) -> None:
        self.policy = policy
        self.bad = bad if bad is not None else BadMessages("weights")
        self.version = version  # 0: the policy's initial weights, never synced
        self.loads = 0

    def offer(self, weights: Weights) -> bool:
        """Load ``weights`` into the policy if their version is newer than the one it holds;
        returns whether they were loaded (False changes nothing)."""
        if weights.version <= self.version:
            return False
        try:
            self.policy.load_weights(weights.arrays)
        except ValueError as exc:
            self.bad.record(WireError(f"weights version {weights.version} do not fit the policy: {exc}"))
            return False
        self.version = int(weights.version)
        self.loads += 1
        return True
