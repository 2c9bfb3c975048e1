"""Every ZeroMQ socket zmqrl opens is made here, so each option is set in exactly one place.

Who binds and who connects (see docs/architecture.md "Sockets and ports"):
  learner    binds PULL samples, XPUB weights;   connects PUSH heartbeat, SUB control
  supervisor binds PULL heartbeat, PUB control
  actor      connects PUSH samples, SUB weights, PUSH heartbeat, SUB control

Security (docs/deployment.md "Security"): every constructor takes ``security``. None (the default) means
plaintext, which binding constructors allow on loopback only unless ``insecure`` is set. With
keys, binding sockets are CurveZMQ servers and connecting sockets CurveZMQ clients; a context
must run :func:`zmqrl.transport.security.start_authenticator` before it binds a secured socket.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import cast

import zmq

from zmqrl.transport.exposure import check_bind_allowed
from zmqrl.transport.fields import MAX_HEADER_BYTES
from zmqrl.transport.keys import Security, SecurityError
from zmqrl.transport.peers import MonitoredSocket
from zmqrl.transport.security import authenticator_running, curve_options, watch_handshakes

# A weights subscriber only ever wants the newest snapshot; keep few queued (ZMQ_CONFLATE does
# not work with multipart messages, so the subscriber drains to the latest instead).
WEIGHTS_RCVHWM = 4
# Connecting sockets retry a missing peer after this long, doubling up to the max (milliseconds).
RECONNECT_MS, RECONNECT_MAX_MS = 100, 250
# Largest message a weights subscriber may send the learner. A subscription is a flag byte and a
# topic, but the limit also applies to the handshake: CurveZMQ's INITIATE carries ~300 bytes of
# keys and metadata (at 256, encrypted runs delivered nothing), so leave it room.
SUBSCRIPTION_MAX_BYTES = 4096
# Publishers drop for slow subscribers at this many queued messages instead of growing memory.
PUB_SNDHWM = 16
# Heartbeats are small and periodic; stale ones are worthless, so queue few and drop the rest.
HEARTBEAT_HWM = 32
# Control messages (stop) are rare; a handful of queued messages is plenty.
CONTROL_HWM = 64
# Largest frame a heartbeat or control socket takes: a header (the protocol's limit) or the
# authentication envelope before it, which is smaller. libzmq cuts off a peer sending a larger one.
CONTROL_MAX_FRAME_BYTES = MAX_HEADER_BYTES


class BindError(RuntimeError):
    """An endpoint could not be bound (usually: the port is already in use)."""


@dataclass(frozen=True)
class SocketLimits:
    """Per-run socket limits that come from the transport config."""

    samples_hwm: int = 64  # queued sample messages before a PUSH blocks (backpressure)
    max_message_bytes: int = 64 * 2**20  # ZeroMQ drops larger incoming messages (and the peer link)
    linger_ms: int = 1_000  # how long close() may keep flushing queued messages
    samples_buffer_bytes: int = 0  # kernel send/receive buffer per samples connection (0: OS default)


def _base(
    ctx: zmq.Context, kind: int, limits: SocketLimits, socket_class: type[zmq.Socket] = zmq.Socket
) -> zmq.Socket:
    sock = ctx.socket(kind, socket_class=socket_class)
    sock.setsockopt(zmq.LINGER, limits.linger_ms)
    # Retry a missing peer every 100 ms, backing off to at most 250 ms. Actors start while the
    # learner is still importing torch; a backoff of seconds left them connecting long after it
    # bound, and the whole run waited on that. A refused connect costs next to nothing.
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    return sock


def _secure(sock: zmq.Socket, security: Security | None, server: bool) -> None:
    """Make ``sock`` a CurveZMQ server or client; must run before bind/connect to take effect."""
    if security is None:
        return
    try:
        for option, value in curve_options(security, server):
            sock.setsockopt(option, value)
    except (zmq.ZMQError, SecurityError) as exc:
        sock.close(linger=0)
        if isinstance(exc, SecurityError):
            raise
        raise SecurityError(
            f"cannot enable CurveZMQ on this socket ({exc}); zmqrl needs libzmq >= 4.3 built with CURVE "
            f"(this one is {zmq.zmq_version()})"
        ) from None


def _server(
    ctx: zmq.Context,
    kind: int,
    limits: SocketLimits,
    endpoint: str,
    what: str,
    security: Security | None,
    insecure: bool,
) -> zmq.Socket:
    """A binding socket, after the checks that decide whether it may exist at all."""
    check_bind_allowed(endpoint, what, security, insecure)
    if security is not None and not authenticator_running(ctx):
        # With the ZAP domain enforced, nobody could connect; say so now instead of hanging later.
        raise SecurityError(
            f"cannot bind {what} with CurveZMQ: no authenticator runs in this zmq.Context; "
            f"call start_authenticator(security, ctx) before binding"
        )
    sock = _base(ctx, kind, limits)
    _secure(sock, security, server=True)
    if security is not None:
        watch_handshakes(ctx, sock, what)  # a plaintext client is refused before ZAP: count it too
    return sock


def _client(
    ctx: zmq.Context,
    kind: int,
    limits: SocketLimits,
    security: Security | None,
    socket_class: type[zmq.Socket] = zmq.Socket,
) -> zmq.Socket:
    sock = _base(ctx, kind, limits, socket_class)
    _secure(sock, security, server=False)
    return sock


def bind(sock: zmq.Socket, endpoint: str, what: str, setting: str | None = None) -> str:
    """Bind and return the real endpoint (port 0 / ``*`` resolved by the OS); errors name
    ``setting`` (default ``transport.<what>``)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        if exc.errno == zmq.EADDRINUSE:
            raise BindError(address_in_use_message(what, endpoint, setting)) from None
        named = setting or f"transport.{what}"
        raise BindError(f"cannot bind {what} on {endpoint} ({named}): {exc}") from None
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def address_in_use_message(what: str, endpoint: str, setting: str | None = None) -> str:
    """The one line for an endpoint someone else holds: which port, which setting (default
    ``transport.<what>``), what to do. Every binding role (learner, ``launch``'s supervisor,
    ``supervise``) reports it from here."""
    setting = setting or f"transport.{what}"
    scheme, _, address = endpoint.partition("://")
    if scheme == "tcp" and ":" in address:
        host, port = address.rsplit(":", 1)
        where, other = f"port {port}", f"{scheme}://{host}:PORT"
    else:
        where, other = endpoint, f"{scheme}://OTHER-PATH" if scheme == "ipc" else "ANOTHER-ENDPOINT"
    return (
        f"cannot bind {what} on {endpoint}: address already in use ({where}, setting {setting}): "
        f"stop what holds it (another zmqrl run?) or choose another with --set {setting}={other}"
    )


def tcp_port_taken(endpoint: str) -> bool:
    """Whether a ``tcp://HOST:PORT`` endpoint with a numeric host and a fixed port is already bound
    here, probed as ZeroMQ would bind it (SO_REUSEADDR: a previous run's TIME_WAIT connections do
    not count). For a check before starting processes that will bind it (``zmqrl launch``'s
    learner): a race remains, which the bind itself then reports. Anything else: False."""
    scheme, _, address = endpoint.partition("://")
    host, _, port = address.rpartition(":")
    host = {"*": "0.0.0.0", "localhost": "127.0.0.1"}.get(host, host)
    if scheme != "tcp" or not port.isdigit() or int(port) == 0:
        return False
    try:
        socket.inet_aton(host)
    except OSError:
        return False  # an IPv6 literal, a host name or an interface name: left to the bind
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, int(port)))
    except OSError:
        return True
    finally:
        probe.close()
    return False


# With CurveZMQ and a ZAP authenticator, a samples pipe whose high-water mark is 1 delivers
# nothing at all (measured with libzmq 4.3: every message queued, none received; 2 works), so
# the encrypted samples channel queues at least this many messages whatever transport.samples_hwm
# says.
CURVE_MIN_SAMPLES_HWM = 2


def _samples_hwm(limits: SocketLimits, security: Security | None) -> int:
    return max(limits.samples_hwm, CURVE_MIN_SAMPLES_HWM) if security is not None else limits.samples_hwm


def samples_pull(
    ctx: zmq.Context,
    endpoint: str,
    limits: SocketLimits,
    *,
    security: Security | None = None,
    insecure: bool = False,
) -> tuple[zmq.Socket, str]:
    sock = _server(ctx, zmq.PULL, limits, endpoint, "samples", security, insecure)
    sock.setsockopt(zmq.RCVHWM, _samples_hwm(limits, security))
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
    if limits.samples_buffer_bytes:
        sock.setsockopt(zmq.RCVBUF, limits.samples_buffer_bytes)
    return sock, bind(sock, endpoint, "samples")


def samples_push(
    ctx: zmq.Context, endpoint: str, limits: SocketLimits, *, security: Security | None = None
) -> zmq.Socket:
    # Monitored: a blocked sender must tell a learner that is connected but slow (backpressure)
    # from one that is not there (transport/peers.py); the monitor goes on before connect().
    sock = cast(MonitoredSocket, _client(ctx, zmq.PUSH, limits, security, MonitoredSocket))
    sock.watch_peers()
    sock.setsockopt(zmq.SNDHWM, _samples_hwm(limits, security))
    if limits.samples_buffer_bytes:
        # The OS otherwise grows loopback TCP buffers to megabytes: thousands of queued transitions
        # that a rate-limited learner would insert long after they were acted (policy lag).
        sock.setsockopt(zmq.SNDBUF, limits.samples_buffer_bytes)
    # Queue only on completed connections, so an actor started before its learner blocks rather
    # than piling messages into a pipe that may never connect.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect(endpoint)
    return sock


def weights_pub(
    ctx: zmq.Context,
    endpoint: str,
    limits: SocketLimits,
    *,
    security: Security | None = None,
    insecure: bool = False,
) -> tuple[zmq.Socket, str]:
    # XPUB rather than PUB: it also hands the learner one message per subscriber that joins
    # (XPUB_VERBOSE: every subscriber, although all subscribe to the same empty topic), so a new
    # actor gets the current weights at once instead of at the next timed republish.
    sock = _server(ctx, zmq.XPUB, limits, endpoint, "weights", security, insecure)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    # Subscribers send only subscriptions (a flag byte and a topic): a peer sending more is cut off.
    sock.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_MAX_BYTES)
    sock.setsockopt(zmq.SNDHWM, PUB_SNDHWM)
    sock.setsockopt(zmq.LINGER, 0)  # weights are republished; never hold a closing learner up
    return sock, bind(sock, endpoint, "weights")


def weights_sub(
    ctx: zmq.Context, endpoint: str, limits: SocketLimits, *, security: Security | None = None
) -> zmq.Socket:
    sock = _client(ctx, zmq.SUB, limits, security)
    sock.setsockopt(zmq.RCVHWM, WEIGHTS_RCVHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def heartbeat_pull(
    ctx: zmq.Context,
    endpoint: str,
    limits: SocketLimits,
    *,
    security: Security | None = None,
    insecure: bool = False,
) -> tuple[zmq.Socket, str]:
    sock = _server(ctx, zmq.PULL, limits, endpoint, "heartbeat", security, insecure)
    sock.setsockopt(zmq.RCVHWM, HEARTBEAT_HWM * 16)
    sock.setsockopt(zmq.MAXMSGSIZE, CONTROL_MAX_FRAME_BYTES)
    return sock, bind(sock, endpoint, "heartbeat")


def heartbeat_push(
    ctx: zmq.Context, endpoint: str, limits: SocketLimits, *, security: Security | None = None
) -> zmq.Socket:
    sock = _client(ctx, zmq.PUSH, limits, security)
    sock.setsockopt(zmq.SNDHWM, HEARTBEAT_HWM)
    sock.connect(endpoint)
    return sock


def control_pub(
    ctx: zmq.Context,
    endpoint: str,
    limits: SocketLimits,
    *,
    security: Security | None = None,
    insecure: bool = False,
) -> tuple[zmq.Socket, str]:
    sock = _server(ctx, zmq.PUB, limits, endpoint, "control", security, insecure)
    sock.setsockopt(zmq.SNDHWM, CONTROL_HWM)
    return sock, bind(sock, endpoint, "control")


def control_sub(
    ctx: zmq.Context, endpoint: str, limits: SocketLimits, *, security: Security | None = None
) -> zmq.Socket:
    sock = _client(ctx, zmq.SUB, limits, security)
    sock.setsockopt(zmq.RCVHWM, CONTROL_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, CONTROL_MAX_FRAME_BYTES)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


# Largest request accepted (a real one is about 20 bytes); larger ones are dropped by ZeroMQ.
MAX_REQUEST_BYTES = 4096
# Largest reply a client accepts (a snapshot of a thousand actors is about 200 KB).
MAX_REPLY_BYTES = 16 * 2**20
# Queued requests / replies per peer before ZeroMQ drops (status is best-effort).
STATUS_HWM = 64


# --------------------------------------------------------------------------------------------
# The supervisor's status channel (`zmqrl status`: zmqrl.supervisor.status)
# --------------------------------------------------------------------------------------------


def status_router(
    ctx: zmq.Context,
    endpoint: str,
    limits: SocketLimits,
    *,
    security: Security | None = None,
    insecure: bool = False,
) -> tuple[zmq.Socket, str]:
    """The supervisor's side: bound, with the bind rules and Curve server options of every zmqrl
    server socket; returns it with the real endpoint."""
    sock = _server(ctx, zmq.ROUTER, limits, endpoint, "status", security, insecure)
    sock.setsockopt(zmq.LINGER, 0)  # an unsent reply is worth nothing once the supervisor exits
    sock.setsockopt(zmq.RCVHWM, STATUS_HWM)
    sock.setsockopt(zmq.SNDHWM, STATUS_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
    return sock, bind(sock, endpoint, "status", "supervisor.status")


def status_dealer(ctx: zmq.Context, endpoint: str, *, security: Security | None = None) -> zmq.Socket:
    """The asking side (DEALER: one socket asks again and again, matching replies by id)."""
    sock = _client(ctx, zmq.DEALER, SocketLimits(linger_ms=0), security)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
    sock.connect(endpoint)
    return sock
