"""The data channels over ``sockets.py``: samples in, weights out, and the tally of dropped messages.

Each channel sends or receives one message kind: :class:`SampleSender` / :class:`SampleReceiver`
(actor -> learner) and :class:`WeightsPublisher` / :class:`WeightsSubscriber` (learner -> actors).
The liveness and stop channels live in :mod:`zmqrl.transport.control`.

Receivers never raise on bad input: a malformed or foreign message is counted in a
``BadMessages`` tally, logged (rate-limited) and dropped, so nothing a peer sends can crash a
process or reach the replay buffer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
import zmq

from zmqrl.fingerprint import check_fingerprint
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.groups import SampleGroup
from zmqrl.transport.sequence import SequenceTracker
from zmqrl.transport.wire import Fingerprint, SamplesMsg, StopMsg, WeightsMsg, WireError
from zmqrl.types import Weights

# At most one log line per this many seconds per channel about dropped messages.
BAD_MESSAGE_LOG_SECONDS = 5.0
# How long a blocked sender sleeps in poll() between checks of its stop condition.
SEND_POLL_MS = 100
# Subscription messages a weights publisher reads per call (a flood waits for later calls).
JOINS_PER_CALL = 64
# Least time between two sends of the same weights for joining subscribers: a peer that connects
# and leaves in a loop cannot make the learner publish more often than this.
JOIN_RESEND_SECONDS = 0.05
# Observation rows at least this large (an 84x84 frame is 7 KB) are received without a copy.
ZERO_COPY_MIN_OBS_BYTES = 1024

Clock = Callable[[], float]


class BadMessages:
    """Tally of dropped messages for one channel, with rate-limited logging that loses no count.

    At most one line per ``interval``; each line says how many messages were dropped since the
    previous line (the suppressed ones included) and the total. Drops that arrive inside an
    interval are reported by the next line: the next ``record`` once the interval has passed, a
    ``maybe_flush`` from a housekeeping loop (so a burst that stops is still reported), or
    ``flush`` at shutdown. Thread-safe: the learner records on its ingest thread and flushes on
    its main thread.
    """

    def __init__(
        self,
        channel: str,
        logger: logging.Logger | None = None,
        interval: float = BAD_MESSAGE_LOG_SECONDS,
        clock: Clock = time.monotonic,
    ) -> None:
        self.channel = channel
        self.count = 0
        self._log = logger or logging.getLogger("zmqrl.transport")
        self._interval = interval
        self._clock = clock
        self._last_log = -float("inf")
        self._pending = 0  # dropped since the last line
        self._latest = ""  # reason of the newest drop
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Drops not yet reported in a log line."""
        return self._pending

    def record(self, error: Exception) -> None:
        with self._lock:
            self.count += 1
            self._pending += 1
            self._latest = str(error)[:120]
            self._report_if_due()

    def maybe_flush(self) -> bool:
        """Report pending drops if ``interval`` has passed since the last line; returns whether a
        line was logged. Call it from a housekeeping loop."""
        with self._lock:
            return self._report_if_due()

    def flush(self) -> bool:
        """Report pending drops now, whatever the interval (call at shutdown); whether it logged."""
        with self._lock:
            if not self._pending:
                return False
            self._report(self._clock())
            return True

    def _report_if_due(self) -> bool:
        now = self._clock()
        if not self._pending or now - self._last_log < self._interval:
            return False
        self._report(now)
        return True

    def _report(self, now: float) -> None:
        self._log.warning(
            "%s: dropped %d malformed message(s) since the last report (total %d); latest: %s",
            self.channel,
            self._pending,
            self.count,
            self._latest,
        )
        self._last_log = now
        self._pending = 0


class LearnerUnreachable(RuntimeError):
    """An actor could not deliver samples for ``transport.connect_timeout`` seconds."""


class SampleSender:
    """Actor side of the samples channel. Blocks (politely) when the learner's queue is full.

    A learner that is down, unreachable or refusing this actor's keys looks the same from here:
    sends that never go through. The sender says so in its log after ``FIRST_WARNING_SECONDS``,
    then at doubling intervals, and gives up after ``give_up_after`` seconds without a delivery
    (``LearnerUnreachable``), so an orchestrator sees a failed process rather than a silent one.
    """

    FIRST_WARNING_SECONDS = 5.0

    def __init__(
        self,
        sock: zmq.Socket,
        endpoint: str = "",
        give_up_after: float | None = None,
        logger: logging.Logger | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._sock = sock
        self._endpoint = endpoint
        self._give_up_after = give_up_after
        self._log = logger or logging.getLogger("zmqrl.transport")
        self._clock = clock
        self.messages_sent = 0
        self.blocked_seconds = 0.0

    def send(self, msg: SamplesMsg, idle: Callable[[], bool]) -> bool:
        """Send ``msg``; while the high-water mark holds it back, call ``idle()`` every
        ``SEND_POLL_MS`` and give up if it returns True (stop requested). Returns whether sent."""
        frames = wire.dump(msg)
        started: float | None = None
        next_warning = self.FIRST_WARNING_SECONDS
        while True:
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:
                now = self._clock()
                if started is None:
                    started = now
                if idle():
                    self.blocked_seconds += self._clock() - started
                    return False
                waited = now - started
                if waited >= next_warning:
                    next_warning *= 2
                    self._warn(waited)
                if self._give_up_after is not None and waited > self._give_up_after:
                    raise LearnerUnreachable(
                        f"no samples delivered to {self._endpoint} for {waited:.0f} s "
                        "(transport.connect_timeout): check that the learner runs and listens there, "
                        "and transport.keys_dir / transport.key_name if the run uses keys"
                    ) from None
                self._sock.poll(SEND_POLL_MS, zmq.POLLOUT)
        if started is not None:
            self.blocked_seconds += self._clock() - started
        self.messages_sent += 1
        return True

    def _warn(self, waited: float) -> None:
        if self.messages_sent == 0:
            self._log.warning(
                "no samples delivered to %s yet after %.0f s: is the learner running and listening there? "
                "(with keys: does it accept transport.key_name?) Retrying.",
                self._endpoint,
                waited,
            )
        else:
            self._log.warning(
                "samples to %s blocked for %.0f s: the learner is not reading (busy, stopped, or gone); "
                "waiting for it.",
                self._endpoint,
                waited,
            )


class SampleReceiver:
    """Learner side of the samples channel: decodes and validates against the run's spec.

    Large rows (images) are received zero-copy: the decoded arrays are views of ZeroMQ's own
    message buffers, copied once, into replay. For small rows a plain copy is cheaper than the
    per-frame bookkeeping of zero-copy frames, so ``zero_copy`` defaults by observation size.

    Every valid message is also accounted per actor in ``seqs`` (lost, reordered, restarts).
    """

    def __init__(
        self,
        sock: zmq.Socket,
        spec: SampleSpec,
        bad: BadMessages,
        zero_copy: bool | None = None,
        seqs: SequenceTracker | None = None,
    ) -> None:
        self._sock = sock
        self.spec = spec
        self.bad = bad
        self.seqs = seqs or SequenceTracker()
        obs_bytes = int(np.prod(spec.obs_shape, dtype=np.int64)) * np.dtype(spec.obs_dtype).itemsize
        self.zero_copy = obs_bytes >= ZERO_COPY_MIN_OBS_BYTES if zero_copy is None else zero_copy
        self._held: SamplesMsg | None = None  # received, validated in layout, for the next group

    def wait(self, timeout_ms: int) -> bool:
        """Whether a message is ready within ``timeout_ms`` (so the ingest thread never spins)."""
        return bool(self._sock.poll(timeout_ms, zmq.POLLIN))

    def recv_nowait(self) -> SamplesMsg | bool | None:
        """One message: a valid ``SamplesMsg``; ``None`` if it was malformed (counted); ``False``
        if nothing is queued."""
        try:
            frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=not self.zero_copy)
        except zmq.Again:
            return False
        try:
            msg = wire.load_samples(frames, self.spec)
        except WireError as exc:
            self.bad.record(exc)
            return None
        self.seqs.observe(msg.actor_id, msg.seq, msg.batch.size)
        return msg

    def recv_group(self, limit: int) -> SampleGroup | None:
        """Up to ``limit`` queued messages as one group, their contents scanned once over the
        merged rows; ``None`` when no valid message was queued.

        Malformed messages are counted and dropped one by one, as by ``recv_nowait``: when the
        merged scan fails, each message is scanned alone to find the bad ones, and only the
        good ones stay. A message whose priorities (present or absent) differ from the group's
        so far waits for the next group.
        """
        messages: list[SamplesMsg] = []
        if self._held is not None:
            messages.append(self._held)
            self._held = None
        while len(messages) < limit:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=not self.zero_copy)
            except zmq.Again:
                break
            try:
                msg = wire.load_samples(frames, self.spec, contents=False)
            except WireError as exc:
                self.bad.record(exc)
                continue
            if messages and (msg.priorities is None) != (messages[0].priorities is None):
                self._held = msg
                break
            messages.append(msg)
        if not messages:
            return None
        group = SampleGroup.of(messages)
        try:
            wire.validate_content(group.batch, group.priorities, self.spec)
        except WireError:
            good = []
            for msg in messages:
                try:
                    wire.validate_content(msg.batch, msg.priorities, self.spec)
                    good.append(msg)
                except WireError as exc:
                    self.bad.record(exc)
            if not good:
                return None
            group = SampleGroup.of(good)
        for msg in group.messages:
            self.seqs.observe(msg.actor_id, msg.seq, msg.batch.size)
        return group


class WeightsPublisher:
    """Learner side of the weights channel. Keeps the last encoded message for republishing.

    ``fingerprint`` (``zmqrl.fingerprint.run_fingerprint``) travels with every snapshot, so an
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
        self.expected_fingerprint = expected_fingerprint
        self.fingerprint: Fingerprint | None = None  # of the newest valid weights message
        self.stop: StopMsg | None = None  # set once the learner announced that it has stopped

    def latest(self) -> WeightsMsg | None:
        """The newest valid weights message queued since the last call, or None. A ``stop`` from
        the learner is kept in ``self.stop``; anything else that is not valid weights is counted.
        Raises ``FingerprintMismatch`` (see the class doc).

        Received without a copy: the decoded arrays are views of ZeroMQ's own buffers, validated
        and then copied once, by ``import_weights``, into the policy's parameters (for a Nature
        CNN a copy of 6.7 MB less; measured no slower for a small MLP either)."""
        queued: list[list[zmq.Frame]] = []
        # Asking the socket whether a message waits is cheaper than the zmq.Again raised by a
        # receive that finds none (~50 us of a cold actor's ~0.5 ms per small message).
        while int(self._sock.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                queued.append(self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False))
            except zmq.Again:
                break
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
