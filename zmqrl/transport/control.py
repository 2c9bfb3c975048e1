"""The liveness and stop channels: heartbeats to the supervisor, its stop broadcasts and own beat.

Roles send :class:`HeartbeatSender` beats that the supervisor reads with :class:`HeartbeatReceiver`;
the supervisor's :class:`ControlPublisher` broadcasts stops and its own heartbeat, which every role
reads with :class:`ControlSubscriber`. The supervisor's heartbeat may also carry a request that the
run end as at its end (``info["end"]``: the evaluator held the target), which the learner acts on.
Nothing here ever blocks on a slow peer (sends drop when full), and every read is bounded
(:data:`DRAIN_MAX_MESSAGES`), so a flood cannot stall a loop.
Bad messages are counted in the same :class:`~zmqrl.transport.channels.BadMessages` tally as the
data channels'.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from typing import TypeVar

import zmq

from zmqrl.transport import wire
from zmqrl.transport.channels import BadMessages, Clock
from zmqrl.transport.wire import HeartbeatMsg, StopMsg, WireError

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
    ) -> None:
        self._sock = sock
        self.role = role
        self.role_id = role_id
        self.interval = interval
        self._clock = clock
        self._last = -float("inf")

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
            # NaN means "not measured yet"; the wire only carries finite numbers, so leave it out.
            counters={k: v for k, v in counters.items() if math.isfinite(v)},
            info=dict(info or {}),
        )
        self._last = self._clock()
        # Supervisor absent or slow: drop it, a stale heartbeat is worth nothing anyway.
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(wire.dump(msg), flags=zmq.NOBLOCK)


class HeartbeatReceiver:
    """Supervisor side: every valid heartbeat queued within ``timeout_ms``."""

    def __init__(self, sock: zmq.Socket, bad: BadMessages) -> None:
        self._sock = sock
        self.bad = bad

    def recv_all(self, timeout_ms: int, max_messages: int = DRAIN_MAX_MESSAGES) -> list[HeartbeatMsg]:
        """At most ``max_messages`` messages are read per call; the rest stay queued."""
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return []
        return _drain(self._sock, HeartbeatMsg, self.bad, max_messages)


class ControlPublisher:
    """Supervisor side of the control channel: stop broadcasts, and the supervisor's own
    heartbeat, by which roles notice a supervisor that died or hangs."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self.end_reason: str | None = None  # asked of the learner in every heartbeat once set

    def heartbeat(self) -> None:
        info = {END_REQUEST_KEY: self.end_reason} if self.end_reason is not None else {}
        msg = HeartbeatMsg("supervisor", 0, os.getpid(), time.time(), "running", {}, info)
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(wire.dump(msg), flags=zmq.NOBLOCK)

    def request_end(self, reason: str) -> None:
        """Ask the learner to end the run as finished, for ``reason``: sent at once and then with
        every heartbeat. Idempotent (the first reason stays)."""
        if self.end_reason is None:
            self.end_reason = reason
            self.heartbeat()

    def stop(self, reason: str) -> None:
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(wire.dump(StopMsg(reason=reason)), flags=zmq.NOBLOCK)


class ControlSubscriber:
    """Role side of the control channel: has a stop been broadcast, and when was the supervisor
    last heard from?"""

    def __init__(self, sock: zmq.Socket, bad: BadMessages, clock: Clock = time.monotonic) -> None:
        self._sock = sock
        self.bad = bad
        self._clock = clock
        self.supervisor_seen: float | None = None  # clock() of the last supervisor heartbeat
        # The supervisor's request that the run end (END_REQUEST_KEY), once heard; kept from then on.
        # Written by the thread that polls, read by the role's main loop (one attribute: atomic).
        self.end_request: str | None = None

    def poll_stop(self, max_messages: int = DRAIN_MAX_MESSAGES) -> StopMsg | None:
        """A stop among the next ``max_messages`` queued messages (the rest wait for the next call)."""
        stop: StopMsg | None = None
        for msg in _drain(self._sock, (StopMsg, HeartbeatMsg), self.bad, max_messages):
            if isinstance(msg, StopMsg):
                stop = msg
            elif msg.role == "supervisor":
                self.supervisor_seen = self._clock()
                if self.end_request is None and msg.info.get(END_REQUEST_KEY):
                    self.end_request = msg.info[END_REQUEST_KEY]
            else:
                self.bad.record(WireError(f"a {msg.role} heartbeat on the control channel"))
        return stop


def _drain(
    sock: zmq.Socket,
    kind: type[_M] | tuple[type[_M], ...],
    bad: BadMessages,
    max_messages: int = DRAIN_MAX_MESSAGES,
) -> list[_M]:
    """The messages queued on ``sock`` that decode to ``kind``, reading at most ``max_messages``
    (valid or not) so a flood cannot stall the caller; anything else is counted as bad."""
    out: list[_M] = []
    names = "/".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
    for _ in range(max_messages):
        try:
            frames = sock.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return out
        try:
            msg = wire.load(frames)
        except WireError as exc:
            bad.record(exc)
            continue
        if isinstance(msg, kind):
            out.append(msg)
        else:
            bad.record(WireError(f"expected {names}, got {type(msg).__name__} on {bad.channel}"))
    return out
