"""Refused handshakes that never reach the authenticator: a plaintext client at a CurveZMQ server.

A client without keys speaks ZMTP's NULL mechanism; a CURVE server stops it at the greeting
(``ZMTP_MECHANISM_MISMATCH``) before any ZAP request is made, so the authenticator never saw it:
nothing was logged and ``auth_denied`` stayed 0, although such a client is the most common mistake
(a host started without ``transport.keys_dir``). libzmq reports the failure to a socket monitor as
``EVENT_HANDSHAKE_FAILED_PROTOCOL`` (verified with libzmq 4.3.5: a refused *key* shows as
``HANDSHAKE_FAILED_AUTH`` there and is already counted by the authenticator, so it is not watched).

One :class:`HandshakeWatch` thread per context reads the monitors of every secured server socket
in it and records each such failure in the authenticator's refusal tally (counted, logged at most
every ``DENIAL_LOG_SECONDS``). It lives and stops with the context's authenticator.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("zmqrl.security")

# What a server socket's monitor reports: handshakes that failed before authentication, and the
# end of monitoring (the socket closed), which lets the watch close its side.
WATCHED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_MONITOR_STOPPED
)
# How often the watch thread looks for new sockets and for its stop flag (milliseconds).
POLL_MS = 100

# record(address, mechanism, reason, key): the authenticator's refusal tally (security._Denials).
Record = Callable[[str, str, str, "str | None"], None]


def describe_failure(event: int, value: int) -> tuple[str, str]:
    """(mechanism, reason) of a failed handshake as the refusal log says them."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "plaintext", "a client without keys: give it transport.keys_dir and the server's public key"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "ZMTP", f"protocol error {value:#x} in the handshake (not a zmqrl client?)"
    return "ZMTP", "the handshake failed before authentication"


class HandshakeWatch:
    """A thread that reads server sockets' monitors and records every handshake they refused."""

    def __init__(self, record: Record, name: str = "zmqrl-handshakes") -> None:
        self._record = record
        self._incoming: queue.SimpleQueue[tuple[zmq.Socket, str]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, sock: zmq.Socket, where: str) -> None:
        """Watch a server socket (call before it binds). The monitor's PAIR socket is made here,
        in the owner's thread, and from then on used by the watch thread alone."""
        monitor = sock.get_monitor_socket(WATCHED_EVENTS)
        monitor.setsockopt(zmq.LINGER, 0)
        sock._monitor_socket = None  # the watch owns it now; the socket's close() must not reuse it
        self._incoming.put((monitor, where))

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        poller = zmq.Poller()
        monitors: dict[zmq.Socket, str] = {}
        try:
            while not self._stop.is_set():
                while not self._incoming.empty():
                    monitor, where = self._incoming.get()
                    monitors[monitor] = where
                    poller.register(monitor, zmq.POLLIN)
                try:
                    ready = dict(poller.poll(POLL_MS))
                except zmq.ZMQError:  # the context is being destroyed
                    return
                for monitor in [m for m in monitors if m in ready]:
                    if not self._read(monitor, monitors[monitor]):
                        poller.unregister(monitor)
                        monitor.close(linger=0)
                        del monitors[monitor]
        finally:
            for monitor in monitors:
                monitor.close(linger=0)
            while not self._incoming.empty():
                self._incoming.get()[0].close(linger=0)

    def _read(self, monitor: zmq.Socket, where: str) -> bool:
        """Record the queued events; False once monitoring has stopped (the socket closed)."""
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return True
            except zmq.ZMQError:
                return False
            if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                return False
            mechanism, reason = describe_failure(int(event["event"]), int(event["value"]))
            self.refused += 1
            try:
                self._record(where, mechanism, reason, None)
            except Exception:  # reporting must never end the watch
                log.exception("recording a refused handshake failed")
