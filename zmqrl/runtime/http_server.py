"""A bounded HTTP server: what the role's health probes (zmqrl/runtime/http_probe.py) and the
supervisor's ``/metrics`` (zmqrl/supervisor/prometheus.py) are served from.

Why bounded: the standard library's servers trust their clients. A single-threaded one waits
for as long as one connected client sends nothing, so one idle connection (a port scanner, a
half-open connection, a browser's preconnect) stops every other answer and the server's
``shutdown()``; a thread-per-connection one without a timeout keeps a thread and a descriptor for
every idle client, until the process cannot open a file (a checkpoint write fails). Here:

- each connection has its own thread and a socket timeout (:data:`REQUEST_SECONDS`), so no client
  holds up another and an idle one is dropped;
- at most :data:`MAX_CONNECTIONS` are open at once: a new connection over the cap pushes out the
  oldest one (shut down at once, its descriptor freed). The newcomer is kept rather than refused
  because a real probe or scrape sends its request as it connects and is answered within
  milliseconds, while a flood of idle connections would otherwise lock it out;
- the listen backlog is :data:`LISTEN_BACKLOG`, so a burst of connects queues rather than fails;
- :meth:`BoundedServer.close` returns within about :data:`CLOSE_SECONDS`, whatever the clients do.

Exposure: the endpoints answer without authentication or encryption. They are read-only (a
verdict, counters), and Kubernetes' kubelet probes a pod on its own address, so a bind beyond
loopback is allowed, unlike the ZeroMQ sockets' (zmqrl/transport/exposure.py), but never silently:
:func:`exposure_warning` is the one line to log.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import sys
import threading
import time
from http.server import HTTPServer
from typing import Any

from zmqrl.transport.exposure import is_loopback

# Seconds a connection may wait on one read or write before it is dropped: a probe or a scrape
# sends its request as it connects, so only an idle or stalled client waits this long.
REQUEST_SECONDS = 5.0
# Connections served at once (one thread and one descriptor each); a newer one pushes out the oldest.
MAX_CONNECTIONS = 16
# Connections the kernel queues before the server accepts them (the library's default is 5).
LISTEN_BACKLOG = 128
# Seconds between the serving thread's checks for close(): bounds the first part of close()'s wait.
POLL_SECONDS = 0.05
# The most close() waits, in all, for the serving thread and the connections' threads.
CLOSE_SECONDS = 2.0


def exposure_warning(setting: str, host: str, port: int, paths: str) -> str | None:
    """The one line to log when ``host`` reaches beyond this machine, by the ZeroMQ sockets' test
    (a wildcard or any name but localhost counts as exposed); None on loopback."""
    shown = f"[{host}]" if ":" in host else host
    if is_loopback(f"tcp://{shown}:{port}"):
        return None
    return (
        f"{setting} {shown}:{port} serves {paths} to anyone who can reach it, unauthenticated and "
        f"unencrypted (read-only); bind 127.0.0.1 unless a prober or a scraper on another host "
        f"needs it, and keep the port off untrusted networks"
    )


class BoundedServer(socketserver.ThreadingMixIn, HTTPServer):
    """An ``HTTPServer`` (put it first among the bases of a subclass of one, e.g. wsgiref's
    ``WSGIServer``) with one daemon thread per connection, each with a socket timeout, at most
    ``max_connections`` at once, and :meth:`start` / :meth:`close` instead of ``serve_forever`` /
    ``shutdown``.

    ``handle_error`` ignores connection failures (a timeout, a reset, a client gone mid-answer, a
    connection pushed out): they are the clients' doing. Anything else goes to
    :meth:`handle_failure`, which a subclass may override (the default prints the traceback)."""

    daemon_threads = True
    block_on_close = False  # close() bounds its own wait
    allow_reuse_address = True  # a restarted process rebinds its fixed port at once
    request_queue_size = LISTEN_BACKLOG
    timeout: float | None = POLL_SECONDS  # handle_request()'s wait, between checks for close()
    max_connections = MAX_CONNECTIONS
    request_seconds = REQUEST_SECONDS

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # Open connections, oldest first, with their threads. Sockets are shut down or closed only
        # under the lock, so a pushed-out socket is never shut down after its thread closed it
        # (its descriptor number may by then be another file's).
        self._open: dict[socket.socket, threading.Thread] = {}
        self._open_lock = threading.Lock()
        self._stopping = threading.Event()
        self._serving: threading.Thread | None = None
        super().__init__(address, handler)

    # ---------------------------------------------------------------- running
    def start(self, name: str) -> None:
        """Serve from a daemon thread named ``name`` until :meth:`close`."""
        self._serving = threading.Thread(target=self._serve, name=name, daemon=True)
        self._serving.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self.handle_request()  # waits at most POLL_SECONDS; accepting never waits on a client

    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)

    def close(self) -> None:
        """Stop accepting, release the port and end every connection; returns within about
        CLOSE_SECONDS even with clients that never send or never read. Idempotent."""
        deadline = time.monotonic() + CLOSE_SECONDS
        self._stopping.set()
        if self._serving is not None:
            self._serving.join(timeout=CLOSE_SECONDS / 2)
        self.server_close()  # the listening socket: the port is free once this returns
        with self._open_lock:
            threads = list(self._open.values())
            for conn in self._open:
                _hang_up(conn)  # wakes its thread, which closes it
            self._open.clear()
        for thread in threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))

    # ---------------------------------------------------------------- socketserver's hooks
    def get_request(self) -> tuple[socket.socket, Any]:
        conn, client = self.socket.accept()
        conn.settimeout(self.request_seconds)
        return conn, client

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        with self._open_lock:
            if self._stopping.is_set():  # accepted as close() began: not served
                request.close()
                return
            while len(self._open) >= self.max_connections:
                oldest = next(iter(self._open))
                del self._open[oldest]
                _hang_up(oldest)
            self._open[request] = thread
            thread.start()  # under the lock: close() never meets a thread it cannot join

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # timeout, reset, broken pipe, pushed out
            return
        self.handle_failure(request, client_address)

    def handle_failure(self, request: Any, client_address: Any) -> None:
        """A handler's unexpected exception (called inside the ``except``): the library's report."""
        super().handle_error(request, client_address)


def _hang_up(conn: socket.socket) -> None:
    """End a connection from another thread than its own: shutdown() wakes the thread blocked on
    it (it reads end of file and closes the socket itself); close() here could free a descriptor
    that thread is still using."""
    with contextlib.suppress(OSError):  # already closed, or the client already gone
        conn.shutdown(socket.SHUT_RDWR)
