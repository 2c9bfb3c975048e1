"""The CurveZMQ runtime: the per-context ZAP authenticator and the curve socket options.

Keys come from :mod:`zmqrl.transport.keys` (made by ``zmqrl keys``, read by ``Security.load``); this
module is what enforces them once a process runs. The authenticator admits the client keys listed
in the keys directory's ``authorized/`` (reread when it changes), names each connection by its key
(the ZAP User-Id the supervisor checks heartbeats against) and counts every refusal, those before
authentication included (:mod:`zmqrl.transport.handshakes`); :func:`curve_options` makes a socket a
CURVE server or client. What may bind where is :mod:`zmqrl.transport.exposure` (re-exported here).

Two libzmq behaviours this module guards against, both verified against libzmq 4.3.5:

* A CURVE server with no ZAP handler in its context accepts *any* client that knows the server's
  public key, and that key is public by design. Servers therefore set ``ZAP_DOMAIN`` together with
  ``ZAP_ENFORCE_DOMAIN``, which makes a missing handler refuse everyone instead, and
  :mod:`zmqrl.transport.sockets` refuses to bind a secured socket before
  :func:`start_authenticator` has run for that context.
* There is one ZAP endpoint per ``zmq.Context``. Roles may share a context (in-process tests, the
  singleton), so authenticators are shared per context and reference-counted.
"""

from __future__ import annotations

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

from zmqrl.transport.exposure import check_bind_allowed, is_loopback  # noqa: F401 (re-exported)
from zmqrl.transport.handshakes import HandshakeWatch
from zmqrl.transport.keys import KEYS_COMMAND, PUBLIC_SUFFIX, Security, SecurityError

log = logging.getLogger("zmqrl.security")

# The ZAP domain every zmqrl server announces; the authenticator answers for this domain only.
ZAP_DOMAIN = "zmqrl"
# Seconds between log lines about refused handshakes (the ones in between are counted, then summed up).
DENIAL_LOG_SECONDS = 30.0


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
        self._keys: dict[bytes, str] = {}  # Z85 public key -> its name (the file name without .key)

    def _current_stamp(self) -> tuple[tuple[str, int, int], ...]:
        entries = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if entry.name.endswith(PUBLIC_SUFFIX):
                    st = entry.stat()
                    entries.append((entry.name, st.st_mtime_ns, st.st_size))
        return tuple(sorted(entries))

    def keys(self) -> dict[bytes, str]:
        """Every authorized Z85 public key and its name."""
        try:
            stamp = self._current_stamp()
        except OSError as exc:
            log.warning("cannot read authorized keys in %s (%s): refusing every client", self.directory, exc)
            return {}
        if stamp != self._stamp:
            keys: dict[bytes, str] = {}
            for name, _, _ in stamp:
                path = self.directory / name
                try:
                    public, _ = zmq.auth.load_certificate(path)
                except (OSError, ValueError) as exc:
                    log.warning("ignoring authorized key file %s: %s", path, exc)
                    continue
                keys[public] = name[: -len(PUBLIC_SUFFIX)]
            self._stamp, self._keys = stamp, keys
        return self._keys

    def name_of(self, key: bytes) -> str:
        """The name of an authorized Z85 key (the connection's User-Id); "" if it is not one."""
        return self._keys.get(key, "")

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
    log. Each mechanism (a refused CURVE key, a plaintext client) has its own interval, so one
    kind of refusal never hides the first of the other. Called from the authenticator's and the
    handshake watch's threads, read from any other.
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
        self._last_log: dict[str, float] = {}  # per mechanism
        self._unlogged: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, address: str, mechanism: str, reason: str, key: str | None) -> None:
        with self._lock:
            self.count += 1
            now = self._clock()
            if now - self._last_log.get(mechanism, -float("inf")) < self._interval:
                self._unlogged[mechanism] = self._unlogged.get(mechanism, 0) + 1
                return
            earlier, total = self._unlogged.pop(mechanism, 0), self.count
            self._last_log[mechanism] = now
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
    """pyzmq's ThreadAuthenticator that reports each refusal, with the peer's address, and names
    each admitted connection by its key.

    The User-Id of an admitted CURVE connection is its key's name in ``authorized/`` (pyzmq's
    default is the Z85 key itself), which every message over it then carries: the supervisor reads
    it to check that a heartbeat comes from a key that may speak as its role
    (:mod:`zmqrl.transport.identity`).

    The credentials callback sees only the key, so the request's address, mechanism and key are
    noted on the way in (``handle_zap_message``, public API) and matched to the reply on the way out
    (``_send_zap_reply``, the one place pyzmq sends every reply, allowed or not). Both run in the
    authenticator's thread. tests/test_security.py checks that refusals are counted, so a pyzmq
    that renamed the reply method would be noticed.
    """

    def __init__(self, ctx: zmq.Context, denials: _Denials, authorized: _AuthorizedKeys) -> None:
        super().__init__(ctx, log=logging.getLogger("zmqrl.security.zap"))
        self.denials = denials
        self.authorized = authorized
        self._requests: dict[bytes, tuple[str, str, str | None]] = {}

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.authorized.name_of(z85.encode(client_public_key))

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
    """One running ThreadAuthenticator, the watch on its server sockets' handshakes, and how many
    handles still use them."""

    def __init__(self, authenticator: _CountingAuthenticator, directory: Path) -> None:
        self.authenticator = authenticator
        self.directory = directory
        self.handshakes = HandshakeWatch(authenticator.denials.record)
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
        shared.handshakes.stop()
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


def start_authenticator(security: Security, ctx: zmq.Context) -> AuthenticatorHandle:
    """Start (or join) the ZAP handler of ``ctx`` that admits the clients listed in
    ``security.authorized_dir``.

    Call it before binding secured sockets in ``ctx`` (sockets.py refuses otherwise) and call
    ``stop()`` on the result at shutdown, before the context is closed. Files added to or
    removed from authorized_dir count from the next handshake on; connections already made stay
    up until they drop. libzmq does not retry a handshake the authenticator refused, so a client
    refused before its key was added must be restarted to get in.
    """
    if not security.authorized_dir.is_dir():
        raise SecurityError(
            f"{security.authorized_dir} is missing: servers need the list of authorized client keys. "
            f"Run the binding roles on the host where `{KEYS_COMMAND}` made the keys."
        )
    return shared_authenticator(ctx, security.authorized_dir.resolve())


def shared_authenticator(ctx: zmq.Context, directory: Path) -> AuthenticatorHandle:
    """Start the ZAP handler of ``ctx`` admitting the keys in ``directory``, or join the running one.

    What :func:`start_authenticator` runs once it has checked the directory exists.
    """
    with _running_lock:
        shared = _running.get(id(ctx))
        if shared is None:
            authorized = _AuthorizedKeys(directory)
            authenticator = _CountingAuthenticator(ctx, _Denials(directory), authorized)
            try:
                authenticator.start()
            except zmq.ZMQError as exc:
                authenticator.stop()
                raise SecurityError(
                    f"cannot start the CurveZMQ authenticator: {exc} (is another ZAP handler already "
                    f"bound in this zmq.Context?)"
                ) from None
            authenticator.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=authorized)
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


def watch_handshakes(ctx: zmq.Context, sock: zmq.Socket, what: str) -> None:
    """Count and log the handshakes a secured server socket of ``ctx`` refuses before they reach
    the authenticator (a plaintext client: :mod:`zmqrl.transport.handshakes`). Call before bind."""
    with _running_lock:
        shared = _running.get(id(ctx))
    if shared is not None:
        shared.handshakes.add(sock, f"a client of the {what} socket")


# --------------------------------------------------------------------------------------------
# Socket options
# --------------------------------------------------------------------------------------------


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
