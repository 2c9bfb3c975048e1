"""The CurveZMQ runtime: the per-context ZAP authenticator, curve socket options, bind checks.

Keys come from :mod:`zmqrl.transport.keys` (made by ``zmqrl keys``, read by ``Security.load``); this
module is what enforces them once a process runs. The authenticator admits the client keys listed
in the keys directory's ``authorized/`` (reread when it changes) and counts every refusal;
:func:`curve_options` makes a socket a CURVE server or client; :func:`check_bind_allowed` refuses
plaintext binds beyond loopback.

Two libzmq behaviours this module guards against, both verified against libzmq 4.3.5:

* A CURVE server with no ZAP handler in its context accepts *any* client that knows the server's
  public key, and that key is public by design. Servers therefore set ``ZAP_DOMAIN`` together with
  ``ZAP_ENFORCE_DOMAIN``, which makes a missing handler refuse everyone instead, and
  :mod:`zmqrl.transport.sockets` refuses to bind a secured socket before
  :meth:`Security.start_authenticator` has run for that context.
* There is one ZAP endpoint per ``zmq.Context``. Roles may share a context (in-process tests, the
  singleton), so authenticators are shared per context and reference-counted.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from zmqrl.transport.keys import KEYS_COMMAND, PUBLIC_SUFFIX, Security, SecurityError

log = logging.getLogger("zmqrl.security")

# The ZAP domain every zmqrl server announces; the authenticator answers for this domain only.
ZAP_DOMAIN = "zmqrl"
# Seconds between log lines about refused handshakes (the ones in between are counted, then summed up).
DENIAL_LOG_SECONDS = 30.0
# Endpoint schemes that never leave this machine.
_LOCAL_SCHEMES = ("ipc://", "inproc://")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


# --------------------------------------------------------------------------------------------
# The authenticator
# --------------------------------------------------------------------------------------------


class _AuthorizedKeys:
    """The authenticator's answer to "is this client key listed?", read from a directory.

    pyzmq's configure_curve reads the directory once and, if any file in it is unreadable, denies
    everyone with only a log line. This rereads the directory whenever a file in it changes and
    skips (and names) a bad file, so a stray file cannot lock a run out. It runs in the
    authenticator's thread only.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._keys: frozenset[bytes] = frozenset()

    def _current_stamp(self) -> tuple[tuple[str, int, int], ...]:
        entries = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if entry.name.endswith(PUBLIC_SUFFIX):
                    st = entry.stat()
                    entries.append((entry.name, st.st_mtime_ns, st.st_size))
        return tuple(sorted(entries))

    def keys(self) -> frozenset[bytes]:
        try:
            stamp = self._current_stamp()
        except OSError as exc:
            log.warning("cannot read authorized keys in %s (%s): refusing every client", self.directory, exc)
            return frozenset()
        if stamp != self._stamp:
            keys = set()
            for name, _, _ in stamp:
                path = self.directory / name
                try:
                    public, _ = zmq.auth.load_certificate(path)
                except (OSError, ValueError) as exc:
                    log.warning("ignoring authorized key file %s: %s", path, exc)
                    continue
                keys.add(public)
            self._stamp, self._keys = stamp, frozenset(keys)
        return self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by pyzmq's Authenticator for each CURVE handshake (``key`` is Z85-encoded).

        A refusal is logged by :class:`_Denials`, with the peer's address, not here.
        """
        try:
            return key in self.keys()
        except Exception:  # an exception here would end the ZAP thread and hang every handshake
            log.exception("checking a client key against %s failed: refusing it", self.directory)
            return False


class _Denials:
    """Refused handshakes of one authenticator: all counted, logged at most every ``interval`` s.

    On the refused client's side nothing says why: its PUSH simply blocks. The server's log is
    therefore where a wrong or revoked key shows, so every refusal is counted (for stats) and the
    first one logged at once, with the peer's address and key; after that, one line per interval
    says how many more there were, so a client restarted in a loop (or a scan) cannot flood the
    log. Called from the authenticator's thread, read from any other.
    """

    def __init__(
        self,
        directory: Path,
        interval: float = DENIAL_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.count = 0
        self._interval = interval
        self._clock = clock
        self._last_log = -float("inf")
        self._unlogged = 0
        self._lock = threading.Lock()

    def record(self, address: str, mechanism: str, reason: str, key: str | None) -> None:
        with self._lock:
            self.count += 1
            now = self._clock()
            if now - self._last_log < self._interval:
                self._unlogged += 1
                return
            earlier, self._unlogged, self._last_log, total = self._unlogged, 0, now, self.count
        what = reason
        if key is not None:
            what = (
                f"public key {key} is not in {self.directory}: to let it in, add its .key file there "
                f"and restart that client"
            )
        log.warning(
            "refused a %s handshake from %s (%s); %d more refused since the last report, %d in all",
            mechanism,
            address or "an unknown address",
            what,
            earlier,
            total,
        )


class _CountingAuthenticator(ThreadAuthenticator):
    """pyzmq's ThreadAuthenticator that also reports each refusal, with the peer's address.

    The credentials callback sees only the key, so the request's address, mechanism and key are
    noted on the way in (``handle_zap_message``, public API) and matched to the reply on the way out
    (``_send_zap_reply``, the one place pyzmq sends every reply, allowed or not). Both run in the
    authenticator's thread. tests/test_security.py checks that refusals are counted, so a pyzmq
    that renamed the reply method would be noticed.
    """

    def __init__(self, ctx: zmq.Context, denials: _Denials) -> None:
        super().__init__(ctx, log=logging.getLogger("zmqrl.security.zap"))
        self.denials = denials
        self._requests: dict[bytes, tuple[str, str, str | None]] = {}

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6:  # version, request id, domain, address, identity, mechanism, credentials...
            mechanism = msg[5].decode("ascii", "replace")
            raw_key = msg[6] if mechanism == "CURVE" and len(msg) == 7 else b""
            key = z85.encode(raw_key).decode("ascii") if len(raw_key) == 32 else None
            self._requests[msg[1]] = (msg[3].decode("utf-8", "replace"), mechanism, key)
        try:
            await super().handle_zap_message(msg)
        finally:
            if len(msg) >= 2:
                self._requests.pop(msg[1], None)

    def _send_zap_reply(
        self, request_id: bytes, status_code: bytes, status_text: bytes, user_id: str = "anonymous"
    ) -> None:
        super()._send_zap_reply(request_id, status_code, status_text, user_id)
        if status_code == b"200":
            return
        address, mechanism, key = self._requests.get(request_id, ("", "ZAP", None))
        try:
            self.denials.record(address, mechanism, status_text.decode("utf-8", "replace"), key)
        except Exception:  # never let reporting end the ZAP thread (every handshake would hang)
            log.exception("recording a refused handshake failed")


class _Shared:
    """One running ThreadAuthenticator and how many handles still use it."""

    def __init__(self, authenticator: _CountingAuthenticator, directory: Path) -> None:
        self.authenticator = authenticator
        self.directory = directory
        self.users = 0


# id(ctx) -> the context's authenticator. The authenticator holds the context, so an id cannot be
# reused while its entry exists.
_running: dict[int, _Shared] = {}
_running_lock = threading.Lock()


class AuthenticatorHandle:
    """What start_authenticator returns; ``stop()`` releases it (safe to call more than once).

    The shared ZAP thread of the context stops with the last handle.
    """

    def __init__(self, ctx: zmq.Context, shared: _Shared) -> None:
        self._ctx = ctx
        self._shared: _Shared | None = shared
        self._denials = shared.authenticator.denials

    @property
    def authenticator(self) -> ThreadAuthenticator:
        if self._shared is None:
            raise SecurityError("this authenticator handle was stopped")
        return self._shared.authenticator

    @property
    def denied(self) -> int:
        """Handshakes refused so far by this context's authenticator (every server socket in it);
        still readable after ``stop()``, for final stats."""
        return self._denials.count

    def stop(self) -> None:
        with _running_lock:
            shared, self._shared = self._shared, None
            if shared is None:
                return
            shared.users -= 1
            if shared.users > 0:
                return
            _running.pop(id(self._ctx), None)
        if self._ctx.closed:
            return  # closing the context already closed the ZAP sockets, which ended its thread
        try:
            shared.authenticator.stop()
        except zmq.ZMQError as exc:  # the context was being torn down under us
            log.debug("authenticator stopped with %s", exc)

    def __enter__(self) -> AuthenticatorHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shared_authenticator(ctx: zmq.Context, directory: Path) -> AuthenticatorHandle:
    """Start the ZAP handler of ``ctx`` admitting the keys in ``directory``, or join the running one.

    What :meth:`Security.start_authenticator` runs once it has checked the directory exists.
    """
    with _running_lock:
        shared = _running.get(id(ctx))
        if shared is None:
            authenticator = _CountingAuthenticator(ctx, _Denials(directory))
            try:
                authenticator.start()
            except zmq.ZMQError as exc:
                authenticator.stop()
                raise SecurityError(
                    f"cannot start the CurveZMQ authenticator: {exc} (is another ZAP handler already "
                    f"bound in this zmq.Context?)"
                ) from None
            authenticator.configure_curve_callback(
                domain=ZAP_DOMAIN, credentials_provider=_AuthorizedKeys(directory)
            )
            if not any(directory.glob(f"*{PUBLIC_SUFFIX}")):
                log.warning("%s lists no client keys: every client will be refused", directory)
            shared = _running[id(ctx)] = _Shared(authenticator, directory)
        elif shared.directory != directory:
            raise SecurityError(
                f"this zmq.Context already authorizes clients from {shared.directory}; one context "
                f"cannot also use {directory} (give each key set its own context)"
            )
        shared.users += 1
        return AuthenticatorHandle(ctx, shared)


def authenticator_running(ctx: zmq.Context) -> bool:
    """Whether start_authenticator has run for ``ctx`` and not been stopped."""
    with _running_lock:
        return id(ctx) in _running


# --------------------------------------------------------------------------------------------
# What may bind where
# --------------------------------------------------------------------------------------------


def is_loopback(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint is reachable only from this machine.

    Unknown means no: hostnames other than localhost, interface names, wildcards and every other
    transport count as exposed, so a doubtful case asks for keys rather than silently going out.
    """
    text = endpoint.strip()
    lower = text.lower()
    if lower.startswith(_LOCAL_SCHEMES):
        return True
    if not lower.startswith("tcp://"):
        return False
    address = text[len("tcp://") :]
    if ";" in address:  # "source;destination" (connect only): the destination decides
        address = address.rsplit(";", 1)[1]
    if address.startswith("["):
        host = address[1 : address.find("]")] if "]" in address else address[1:]
    else:
        host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    host = host.split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0") is not part of the address
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_bind_allowed(endpoint: str, what: str, security: Security | None, insecure: bool) -> None:
    """Refuse to expose a plaintext socket beyond this machine unless the user said so.

    Loopback and secured binds pass silently. A plaintext bind elsewhere raises, or with
    ``insecure`` logs one warning per endpoint (restarts would otherwise repeat it).
    """
    if security is not None or is_loopback(endpoint):
        return
    if not insecure:
        raise SecurityError(
            f"binding {what} on {endpoint} exposes it beyond this machine unencrypted and "
            f"unauthenticated: make keys with `{KEYS_COMMAND} DIR` and set transport.keys_dir=DIR, "
            f"or pass --insecure on a trusted network"
        )
    with _warned_lock:
        if endpoint in _warned:
            return
        _warned.add(endpoint)
    log.warning(
        "binding %s on %s without encryption or authentication (--insecure): anyone who can reach "
        "this address can read the traffic and send data to this run",
        what,
        endpoint,
    )


def curve_options(security: Security, server: bool) -> list[tuple[int, Any]]:
    """The socket options that make a socket a CurveZMQ server or client with these keys.

    Pure (no socket), so the one place that sets them (sockets.py) and the tests agree on them.
    """
    if server:
        if security.server_secret is None:
            raise SecurityError(
                "this process has no server secret key (server.key_secret) but binds a socket: run the "
                f"binding roles (learner, supervisor) on the host where `{KEYS_COMMAND}` made the keys"
            )
        return [
            (zmq.CURVE_SERVER, 1),
            (zmq.CURVE_SECRETKEY, security.server_secret),
            (zmq.CURVE_PUBLICKEY, security.server_public),
            (zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode("ascii")),
            # Without a ZAP handler, libzmq would admit any client; enforcing the domain makes a
            # missing handler refuse everyone instead.
            (zmq.ZAP_ENFORCE_DOMAIN, 1),
        ]
    return [
        (zmq.CURVE_SERVERKEY, security.server_public),
        (zmq.CURVE_PUBLICKEY, security.client_public),
        (zmq.CURVE_SECRETKEY, security.client_secret),
    ]
