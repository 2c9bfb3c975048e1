"""The samples channel (actor -> learner): :class:`SampleSender` and :class:`SampleReceiver`, and
the :class:`SampleGroup` (defined with the other messages) the receiver hands the learner.

The sender says when the learner's high-water mark holds a message back (backpressure), keeps it
for retries while its caller does what it must meanwhile, and tells a learner that is connected
but slow apart from one that is not there at all; the receiver reads each
message within the channel's frame limit, decodes and validates it against the run's spec, and
counts what it drops.

Why groups: the learner's per-message costs (a replay transaction, the content scans, the lock and
the counters) are fixed, not per row, and with CartPole-sized messages they were most of the
ingest time. So the receiver takes the messages that are already queued, up to a limit, decodes
each with the one samples decoder (:func:`zmqrl.transport.decoding.load_samples`, the same serial mode
runs), scans their merged rows once, and the learner inserts them as one all-or-nothing replay
add. Each message still counts on its own: sequence numbers, policy lag, episodes, and a bad one is
dropped alone. The learner runs this receiver in its intake process (zmqrl/learner/intake_process.py),
beside training rather than on its interpreter lock.
"""

from __future__ import annotations

import logging
import time

import zmq

from zmqrl.spec import SampleSpec
from zmqrl.transport import decoding, wire
from zmqrl.transport.bad_messages import BadMessages, Clock
from zmqrl.transport.messages import SampleGroup
from zmqrl.transport.peers import PeerWatch
from zmqrl.transport.receiving import FrameLimit, recv_bounded
from zmqrl.transport.sequence import SequenceTracker
from zmqrl.transport.wire import SamplesMsg, WireError
from zmqrl.types import BATCH_FIELDS, MAX_KEYS, ROLLOUT_FIELDS

# How long a blocked sender sleeps in poll() between checks of its stop condition.
SEND_POLL_MS = 100
# Observation rows at least this large (an 84x84 frame is 7 KB) are received without a copy.
# Rollouts follow the same rule: it depends on a row's size, which is the run's, and their obs frame
# (R * (T + 1) rows) is the largest frame of either kind, where not copying saves the most.
ZERO_COPY_MIN_OBS_BYTES = 1024
# Most frames of a message on this channel: the header, then a samples message's five columns and
# optional priorities, or a rollouts message's seven columns and a recurrent run's core state; a
# Dict observation run splits two of them (obs and next_obs, or obs and final_obs) into one array
# per key, at most MAX_KEYS each.
SAMPLES_MAX_FRAMES = 1 + max(len(BATCH_FIELDS) + 1, len(ROLLOUT_FIELDS) + 1) + 2 * (MAX_KEYS - 1)
# The setting a samples (or weights) message's size limit comes from, named when one is refused.
MESSAGE_SIZE_SETTING = "transport.max_message_mb"


def channel_limit(sock: zmq.Socket, max_frames: int) -> FrameLimit:
    """The limit for a data channel: ``max_frames``, and the socket's own per-frame ``MAXMSGSIZE``
    (transport.max_message_mb, set by ``sockets``) for the whole message; the protocol's largest
    message where the socket sets none."""
    per_frame = int(sock.getsockopt(zmq.MAXMSGSIZE))
    most = per_frame if per_frame > 0 else wire.MAX_HEADER_BYTES + wire.MAX_MESSAGE_BYTES
    return FrameLimit(max_frames, most, MESSAGE_SIZE_SETTING)


class LearnerUnreachable(RuntimeError):
    """An actor found no learner to deliver samples to for ``transport.connect_timeout`` seconds."""


class SampleSender:
    """Actor side of the samples channel. Says when the learner's queue holds a message back.

    It sends either kind of experience (``wire.dump`` picks ``"samples"`` or ``"rollouts"`` from the
    message's batch type); which one a learner takes is its run's.

    Two reasons keep a send from going through, and they call for different things:

    * **Backpressure**: the learner is connected but not reading yet (training, held back by its
      replay ratio, checkpointing, or stopped). ``retry`` waits as long as it takes and says so
      at doubling intervals; giving up here would kill healthy actors of a busy learner.
    * **No learner**: nothing is connected (the learner is down, unreachable, or refuses this
      actor's keys). Said in the log after ``FIRST_WARNING_SECONDS``, then at doubling intervals;
      after ``give_up_after`` seconds without a connection it raises ``LearnerUnreachable``, so an
      orchestrator sees a failed process rather than a silent one.

    Which one it is comes from the socket's connection events (:class:`PeerWatch`:
    ``sockets.samples_push`` makes sockets that report them). A socket without them (a plain one,
    in tests) cannot tell, and every blocked second counts towards giving up, as before.
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
        self._peer = PeerWatch.of(sock)
        self.messages_sent = 0
        self.blocked_seconds = 0.0
        self.backpressure_seconds = 0.0  # blocked while the learner was connected
        self._held: list[bytes | memoryview] | None = None  # held back at the high-water mark
        self._blocked_since = self._last = 0.0
        self._unreachable_since: float | None = None  # held back with nothing connected, since then
        self._next_warning = self.FIRST_WARNING_SECONDS

    def send(self, msg: SamplesMsg) -> bool:
        """Send ``msg`` if the learner's queue has room; True if it went out. False: the high-water
        mark holds it back. The sender keeps it (``held``) and the caller decides what to do
        meanwhile (an actor drains weights and heartbeats) before each ``retry()``, or
        ``abandon()``s it when told to stop."""
        if self._held is not None:
            raise RuntimeError("a held-back message must be retried or abandoned before the next send")
        frames = wire.dump(msg)
        if self._try(frames):
            return True
        self._held = frames
        self._blocked_since = self._last = self._clock()
        self._unreachable_since = None
        self._next_warning = self.FIRST_WARNING_SECONDS
        return False

    @property
    def held(self) -> bool:
        """Whether a message is held back at the high-water mark (see ``send``)."""
        return self._held is not None

    def retry(self) -> bool:
        """Wait up to ``SEND_POLL_MS`` for room and send the held-back message; True if it went
        out. Says at doubling intervals why it waits; raises ``LearnerUnreachable`` once nothing
        has been connected for ``give_up_after`` seconds (a connected learner that does not read
        is backpressure: no time limit)."""
        if self._held is None:
            return True
        now = self._clock()
        connected = self._peer.connected() if self._peer is not None else None
        if connected:
            self.backpressure_seconds += now - self._last
            self._unreachable_since = None
        elif self._unreachable_since is None:
            self._unreachable_since = now
        self._last = now
        waited = now - self._blocked_since
        if waited >= self._next_warning:
            self._next_warning *= 2
            self._warn(waited, connected)
        if self._unreachable_since is not None:
            self._give_up_if_due(now - self._unreachable_since)
        self._sock.poll(SEND_POLL_MS, zmq.POLLOUT)
        if not self._try(self._held):
            return False
        self._held = None
        self.blocked_seconds += self._clock() - self._blocked_since
        return True

    def abandon(self) -> None:
        """Forget the held-back message (the caller stops); its blocked time is counted."""
        if self._held is not None:
            self._held = None
            self.blocked_seconds += self._clock() - self._blocked_since

    def _try(self, frames: list[bytes | memoryview]) -> bool:
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.messages_sent += 1
        return True

    def _give_up_if_due(self, unreachable: float) -> None:
        if self._give_up_after is not None and unreachable > self._give_up_after:
            raise LearnerUnreachable(
                f"no learner to deliver samples to at {self._endpoint} for {unreachable:.0f} s "
                "(transport.connect_timeout): check that the learner runs and listens there, and "
                "transport.keys_dir / transport.key_name if the run uses keys"
            )

    def _warn(self, waited: float, connected: bool | None) -> None:
        if connected:
            self._log.warning(
                "samples to %s blocked for %.0f s: the learner is connected but not reading them yet "
                "(training, held back by its replay ratio, checkpointing, or stopped); waiting for it "
                "(backpressure: no time limit while it stays connected).",
                self._endpoint,
                waited,
            )
        elif self.messages_sent == 0:
            self._log.warning(
                "no samples delivered to %s yet after %.0f s: is the learner running and listening there? "
                "(with keys: does it accept transport.key_name?) Retrying.",
                self._endpoint,
                waited,
            )
        else:
            why = "no learner is connected" if connected is False else "the learner is not reading"
            limit = ""
            if self._give_up_after is not None:
                limit = f" (transport.connect_timeout={self._give_up_after:g} s)"
            self._log.warning(
                "samples to %s blocked for %.0f s: %s (busy, stopped, or gone); waiting for it%s.",
                self._endpoint,
                waited,
                why,
                limit,
            )

    def close(self) -> None:
        """Close the socket and its connection monitor (closing the socket alone does that too)."""
        self._sock.close(linger=0)


class SampleReceiver:
    """Learner side of the samples channel: decodes and validates against the run's spec (which
    also says the kind: a message of the other one is counted and dropped like any bad one).

    Each message is read within the channel's limit (:func:`channel_limit`: at most
    ``SAMPLES_MAX_FRAMES`` frames and transport.max_message_mb over all of them); a larger one is
    dropped frame by frame as it is read and counted.

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
        self.limit = channel_limit(sock, SAMPLES_MAX_FRAMES)
        self.zero_copy = spec.obs_bytes >= ZERO_COPY_MIN_OBS_BYTES if zero_copy is None else zero_copy
        self._held: SamplesMsg | None = None  # received, validated in layout, for the next group

    def wait(self, timeout_ms: int) -> bool:
        """Whether a message is ready within ``timeout_ms`` (so a reading loop never spins)."""
        return self._held is not None or bool(self._sock.poll(timeout_ms, zmq.POLLIN))

    @property
    def holding(self) -> bool:
        """Whether a message read for the last group waits for the next one (its priorities
        differed): ``recv_group`` has something to give although the socket may be empty."""
        return self._held is not None

    def recv_nowait(self) -> SamplesMsg | bool | None:
        """One message: a valid ``SamplesMsg``; ``None`` if it was malformed (counted); ``False``
        if nothing is queued."""
        try:
            frames = recv_bounded(self._sock, self.limit, copy=not self.zero_copy)
            msg = decoding.load_samples(frames, self.spec)
        except zmq.Again:
            return False
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
        so far waits for the next group, which is read at once when every message of this one
        was bad (a message held back is never left waiting for more to arrive).
        """
        while True:
            group = self._read_group(limit)
            if group is not None or self._held is None:
                return group

    def _read_group(self, limit: int) -> SampleGroup | None:
        """One pass of ``recv_group``: the queued messages up to ``limit`` or a change of priorities."""
        messages: list[SamplesMsg] = []
        if self._held is not None:
            messages.append(self._held)
            self._held = None
        while len(messages) < limit:
            try:
                frames = recv_bounded(self._sock, self.limit, copy=not self.zero_copy)
                msg = decoding.load_samples(frames, self.spec, contents=False)
            except zmq.Again:
                break
            except WireError as exc:
                self.bad.record(exc)
                continue
            if messages and (msg.priorities is None) != (messages[0].priorities is None):
                self._held = msg
                break
            messages.append(msg)
        if not messages:
            return None
        return self._checked(SampleGroup.of(messages))

    def _checked(self, group: SampleGroup) -> SampleGroup | None:
        """``group`` less the messages whose contents fail (counted), their sequence numbers
        accounted; None if none is left."""
        try:
            decoding.validate_content(group.batch, group.priorities, self.spec)
        except WireError:
            good = []
            for msg in group.messages:
                try:
                    decoding.validate_content(msg.batch, msg.priorities, self.spec)
                    good.append(msg)
                except WireError as exc:
                    self.bad.record(exc)
            if not good:
                return None
            group = SampleGroup.of(good)
        self.seqs.observe_all([(info.actor_id, info.seq, info.stop - info.start) for info in group.infos])
        return group
