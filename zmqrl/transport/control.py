"""The liveness and stop channels: heartbeats to the supervisor, its stop broadcasts and own beat.

Roles send :class:`HeartbeatSender` beats that the supervisor reads with :class:`HeartbeatReceiver`;
the supervisor's :class:`ControlPublisher` broadcasts stops and its own heartbeat, which every role
reads with :class:`ControlSubscriber`. The supervisor's heartbeat may also carry a request that the
run end as at its end (``info["end"]``: the evaluator held the target), which the learner acts on.
Nothing here ever blocks on a slow peer (sends drop when full), and every read is bounded
(:data:`DRAIN_MAX_MESSAGES`), so a flood cannot stall a loop.
Bad messages are counted in the same :class:`~zmqrl.transport.bad_messages.BadMessages` tally as
the data channels'.

Every message is authenticated when the run says how (:mod:`zmqrl.transport.control_auth`: Curve
keys bound to roles, or the run's secret token): senders seal what they send with their
:class:`~zmqrl.transport.control_auth.ControlAuth`, receivers drop and count (``unauthenticated``)
whatever does not verify, so a forged heartbeat never reaches the supervisor's slots. Each message
is read within :data:`CONTROL_LIMIT` (frame by frame: ZeroMQ's size limit is per frame).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import TypeVar

import zmq

from zmqrl.transport import wire
from zmqrl.transport.bad_messages import BadMessages, Clock
from zmqrl.transport.control_auth import (
    CONTROL,
    ENVELOPE_MAX_BYTES,
    HEARTBEAT,
    ControlAuth,
    ReplayGuard,
    Unauthenticated,
)
from zmqrl.transport.fields import INT64_MAX, INT64_MIN
from zmqrl.transport.receiving import FrameLimit, recv_bounded
from zmqrl.transport.wire import HeartbeatMsg, StopMsg, WireError

log = logging.getLogger("zmqrl.transport")

# Most messages one drain of the heartbeat or control socket reads; the rest wait for the next
# call, so a flood cannot hold the supervisor's (or a role's) loop inside one drain.
DRAIN_MAX_MESSAGES = 256
# Key of the supervisor heartbeat's ``info`` that asks the learner to end the run as finished; the
# value says why (``"target held"``). A field of the heartbeat rather than a message kind of its own:
# a role that does not know it ignores it (an unknown kind would be counted as a bad message), and
# since it rides on every heartbeat from then on, a lost message or a learner restarted meanwhile
# still hears it within a heartbeat interval.
END_REQUEST_KEY = "end"
# The one end request there is: learner.stop_at_target, the evaluator held the target return. Also
# what the learner's final stats say as "ended" when its own evaluations held it.
TARGET_HELD = "target held"
# The heartbeat counter in which a role reports the control messages it dropped (bad or forged).
CONTROL_DROPS_COUNTER = "bad_control"
# The most one heartbeat or control message may hold: the authentication envelope and a header.
CONTROL_LIMIT = FrameLimit(max_frames=2, max_bytes=ENVELOPE_MAX_BYTES + wire.MAX_HEADER_BYTES)

# A beat sent without its counters (they could not be encoded) is logged the first time and then
# once per this many, so a bug that hits every beat cannot flood the log.
UNENCODABLE_LOG_EVERY = 100

_M = TypeVar("_M", bound=HeartbeatMsg | StopMsg)


class HeartbeatSender:
    """Periodic liveness + counters from a role to the supervisor. Never blocks: drops when full."""

    def __init__(
        self,
        sock: zmq.Socket,
        role: str,
        role_id: int,
        interval: float,
        clock: Clock = time.monotonic,
        auth: ControlAuth | None = None,
    ) -> None:
        self._sock = sock
        self.role = role
        self.role_id = role_id
        self.interval = interval
        self._clock = clock
        self._auth = auth or ControlAuth()
        self._last = -float("inf")
        self.unsent = 0  # beats not sent because the run's token file has not appeared yet
        self.unencodable = 0  # beats whose counters or info could not be encoded (sent without them)

    def due(self) -> bool:
        return self._clock() - self._last >= self.interval

    def beat(
        self,
        state: str,
        counters: Mapping[str, float | int],
        info: Mapping[str, str] | None = None,
    ) -> None:
        msg = HeartbeatMsg(
            role=self.role,
            id=self.role_id,
            pid=os.getpid(),
            time=time.time(),
            state=state,
            counters=carried_counters(counters),
            info=dict(info or {}),
        )
        self._last = self._clock()
        try:
            encoded = wire.dump(msg)
        except WireError as exc:
            # A report this role cannot encode is its own bug, never a reason to go silent or die:
            # the beat still goes out, without what could not be said.
            self.unencodable += 1
            if self.unencodable == 1 or self.unencodable % UNENCODABLE_LOG_EVERY == 0:
                log.error("heartbeat sent without counters and info (%d so far): %s", self.unencodable, exc)
            encoded = wire.dump(dataclasses.replace(msg, counters={}, info={}))
        frames = self._auth.seal(encoded, HEARTBEAT)
        if frames is None:
            self.unsent += 1
            return
        # Supervisor absent or slow: drop it, a stale heartbeat is worth nothing anyway.
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)


def carried_counters(counters: Mapping[str, float | int]) -> dict[str, float | int]:
    """What of ``counters`` a heartbeat can carry: integers held within int64 (a saturated count
    is still the truest report there is), finite floats; NaN means "not measured yet" and the wire
    only carries finite numbers, so it is left out, as is anything that is not a number."""
    out: dict[str, float | int] = {}
    for name, value in counters.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, int):
            out[name] = min(max(value, INT64_MIN), INT64_MAX)
        elif math.isfinite(value):
            out[name] = value
    return out


class _ControlReceiver:
    """What both receiving ends share: bounded, authenticated drains that count what they drop."""

    purpose = CONTROL

    def __init__(self, sock: zmq.Socket, bad: BadMessages, auth: ControlAuth | None) -> None:
        self._sock = sock
        self.bad = bad
        self._auth = auth or ControlAuth()
        self._guard = ReplayGuard()
        self.unauthenticated = 0  # dropped: not verified, or from a key that may not say it (in bad too)

    def _drain(self, kind: type[_M] | tuple[type[_M], ...], max_messages: int) -> list[_M]:
        """The messages queued on the socket that verify and decode to ``kind``, reading at most
        ``max_messages`` (valid or not) so a flood cannot stall the caller; the rest are counted."""
        out: list[_M] = []
        names = "/".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        for _ in range(max_messages):
            try:
                frames = recv_bounded(self._sock, CONTROL_LIMIT, copy=False)
                user_id = _user_id(frames[0]) if self._auth.curve_identities else None
                signer, opened = self._auth.open(frames, self.purpose, self._guard)
                msg = wire.load(opened)
                if not isinstance(msg, kind):
                    raise WireError(f"expected {names}, got {type(msg).__name__} on {self.bad.channel}")
                if isinstance(msg, HeartbeatMsg) and self.purpose == HEARTBEAT:
                    self._auth.check_speaker(user_id, signer, msg.role, msg.id)
            except zmq.Again:
                break
            except WireError as exc:
                if isinstance(exc, Unauthenticated):
                    self.unauthenticated += 1
                self.bad.record(exc)
                continue
            out.append(msg)
        return out


def _user_id(frame: zmq.Frame) -> str | None:
    """The ZAP User-Id of the connection a frame came over (the client key's name, with keys)."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:  # no such property: the connection had no authenticator
        return None


class HeartbeatReceiver(_ControlReceiver):
    """Supervisor side: every valid, authenticated heartbeat queued within ``timeout_ms``."""

    purpose = HEARTBEAT

    def __init__(self, sock: zmq.Socket, bad: BadMessages, auth: ControlAuth | None = None) -> None:
        super().__init__(sock, bad, auth)

    def recv_all(self, timeout_ms: int, max_messages: int = DRAIN_MAX_MESSAGES) -> list[HeartbeatMsg]:
        """At most ``max_messages`` messages are read per call; the rest stay queued."""
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return []
        return self._drain(HeartbeatMsg, max_messages)


class ControlPublisher:
    """Supervisor side of the control channel: stop broadcasts, and the supervisor's own
    heartbeat, by which roles notice a supervisor that died or hangs."""

    def __init__(self, sock: zmq.Socket, auth: ControlAuth | None = None) -> None:
        self._sock = sock
        self._auth = auth or ControlAuth()
        self.end_reason: str | None = None  # asked of the learner in every heartbeat once set

    def heartbeat(self) -> None:
        info = {END_REQUEST_KEY: self.end_reason} if self.end_reason is not None else {}
        self._send(HeartbeatMsg("supervisor", 0, os.getpid(), time.time(), "running", {}, info))

    def _send(self, msg: HeartbeatMsg | StopMsg) -> None:
        frames = self._auth.seal(wire.dump(msg), CONTROL)
        if frames is None:  # a supervisor's token file is made before it binds: cannot happen
            return
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def request_end(self, reason: str) -> None:
        """Ask the learner to end the run as finished, for ``reason``: sent at once and then with
        every heartbeat. Idempotent (the first reason stays)."""
        if self.end_reason is None:
            self.end_reason = reason
            self.heartbeat()

    def stop(self, reason: str) -> None:
        self._send(StopMsg(reason=reason))


class ControlSubscriber(_ControlReceiver):
    """Role side of the control channel: has a stop been broadcast, and when was the supervisor
    last heard from? Only authenticated messages count (``auth``)."""

    def __init__(
        self,
        sock: zmq.Socket,
        bad: BadMessages,
        clock: Clock = time.monotonic,
        auth: ControlAuth | None = None,
    ) -> None:
        super().__init__(sock, bad, auth)
        self._clock = clock
        self.supervisor_seen: float | None = None  # clock() of the last supervisor heartbeat
        # The supervisor's request that the run end (END_REQUEST_KEY), once heard; kept from then on.
        # Written by the thread that polls, read by the role's main loop (one attribute: atomic).
        self.end_request: str | None = None

    def poll_stop(self, max_messages: int = DRAIN_MAX_MESSAGES) -> StopMsg | None:
        """A stop among the next ``max_messages`` queued messages (the rest wait for the next call)."""
        stop: StopMsg | None = None
        for msg in self._drain((StopMsg, HeartbeatMsg), max_messages):
            if isinstance(msg, StopMsg):
                stop = msg
            elif msg.role == "supervisor":
                self.supervisor_seen = self._clock()
                if self.end_request is None and msg.info.get(END_REQUEST_KEY):
                    self.end_request = msg.info[END_REQUEST_KEY]
            else:
                self.bad.record(WireError(f"a {msg.role} heartbeat on the control channel"))
        return stop
