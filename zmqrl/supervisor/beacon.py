"""The supervisor's side of the control channel, from a thread of its own: its heartbeat, which
keeps every role of the run up, and the stop broadcasts and end requests it sends.

Roles leave when the supervisor's heartbeat stops for ``heartbeat_timeout``: that is how no
process outlives a supervisor that died or hangs. The supervisor's loop also writes to the
console, and a write blocks while the terminal is paused (Ctrl-S) or nobody reads the pipe: sent
from that loop, the heartbeat stopped too and the whole run went down. So the control socket
belongs to this thread alone (ZeroMQ sockets are not thread-safe), which beats every
``heartbeat_interval`` whatever the loop is doing; the loop hands it stop broadcasts and end
requests through a queue, sent in order, at once.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

from zmqrl.runtime.guard import start_guarded
from zmqrl.transport.control import ControlPublisher

# How long close() waits for the thread to send what it was handed and finish.
CLOSE_JOIN_SECONDS = 2.0

log = logging.getLogger("zmqrl.supervisor")

_STOP, _END, _CLOSE = "stop", "end", "close"


class ControlBeacon:
    """Beats on ``control`` every ``interval`` seconds (calling ``on_beat`` after each, e.g. to
    write the supervisor's health file) and sends what ``stop`` and ``request_end`` hand it.

    Once its thread has ended (closed, or died: its traceback is logged and ``error`` set) the
    caller is the socket's only user, and ``stop`` sends directly.
    """

    def __init__(
        self,
        control: ControlPublisher,
        interval: float,
        on_beat: Callable[[], None] = lambda: None,
    ) -> None:
        self._control = control
        self._interval = interval
        self._on_beat = on_beat
        self._orders: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._thread = start_guarded(self._run, "control-beacon", self._crashed)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, reason: str) -> None:
        """Broadcast a stop for ``reason`` (sent at once by the thread)."""
        if self.alive:
            self._orders.put((_STOP, reason))
        else:
            self._control.stop(reason)

    def request_end(self, reason: str) -> None:
        """Ask the learner to end the run as finished (then carried by every heartbeat)."""
        if self.alive:
            self._orders.put((_END, reason))
        else:
            self._control.request_end(reason)

    def close(self) -> None:
        """Send what was handed over so far, then end the thread."""
        self._orders.put((_CLOSE, ""))
        self._thread.join(timeout=CLOSE_JOIN_SECONDS)

    def _run(self) -> None:
        next_beat = time.monotonic()
        while True:
            try:
                kind, reason = self._orders.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                kind, reason = "", ""
            if kind == _CLOSE:
                return
            if kind == _STOP:
                self._control.stop(reason)
            elif kind == _END:
                self._control.request_end(reason)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self._interval
                self._control.heartbeat()
                self._on_beat()

    def _crashed(self, exc: BaseException) -> None:
        self.error = exc
