"""Whether a connecting socket has its peer, from libzmq's connection events.

A PUSH socket with ``IMMEDIATE`` refuses a send the same way (``EAGAIN``) when its one peer is
connected but its queue is full (backpressure) and when no peer is connected at all. The sender
of samples must tell the two apart (it waits on the first for as long as it takes, and gives up
on the second after transport.connect_timeout), and libzmq says which through a socket monitor:
``HANDSHAKE_SUCCEEDED`` once a connection is up (after the CurveZMQ handshake and its
authorization, with keys), ``DISCONNECTED`` when it goes.

:class:`MonitoredSocket` is a ``zmq.Socket`` whose monitor is attached before it connects (so no
event is missed) and closed with it (a monitor left open would block ``Context.term``);
:class:`PeerWatch` reads its events without blocking, from the thread that owns the socket.
"""

from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message

# The events a PeerWatch needs: a connection is up (handshake done) or gone.
PEER_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
# Most monitor events one connected() call reads (they come a few per reconnect).
MAX_EVENTS_PER_CALL = 64


class MonitoredSocket(zmq.Socket):
    """A socket that reports its connection events to a monitor it owns (``watch_peers``)."""

    def watch_peers(self) -> None:
        """Attach the monitor; call before ``connect`` so the first connection is seen."""
        monitor = self.get_monitor_socket(PEER_EVENTS)
        monitor.setsockopt(zmq.LINGER, 0)

    def close(self, linger: int | None = None) -> None:
        monitor = self._monitor_socket
        if monitor is not None:
            if not self.closed:
                self.disable_monitor()  # stops libzmq's side; the PAIR socket is ours to close
            monitor.close(linger=0)
        super().close(linger=linger)


class PeerWatch:
    """Tracks whether the socket's one peer is connected, from its monitor's events.

    zmqrl's connecting sockets have exactly one endpoint, so one connection at most is up at a time
    and a flag is the whole state. Reads only from the thread that uses the socket.
    """

    def __init__(self, monitor: zmq.Socket) -> None:
        self._monitor = monitor
        self._connected = False

    @classmethod
    def of(cls, sock: zmq.Socket) -> PeerWatch | None:
        """The watch of a :class:`MonitoredSocket` that ``watch_peers`` set up; None for any other
        socket (it cannot tell)."""
        if not isinstance(sock, MonitoredSocket) or sock._monitor_socket is None:
            return None
        return cls(sock._monitor_socket)

    def connected(self) -> bool:
        """Whether a connection is up now (reads the events that came since the last call)."""
        for _ in range(MAX_EVENTS_PER_CALL):
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError:  # the socket (and its monitor) closed under us: nothing is up
                self._connected = False
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._connected = False
        return self._connected
