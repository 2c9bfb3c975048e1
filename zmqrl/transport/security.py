"""CurveZMQ keys, the per-context authenticator, and the rule about what may bind where.

Why this exists: zmqrl's sockets carry model weights out and training data in, and the learner
trusts what arrives enough to train on it. On loopback that is fine; anything reachable from other
machines must be encrypted and must only accept known peers. CurveZMQ does both inside libzmq:
servers (the binding side: learner and supervisor) hold a long-term key pair, clients (actors, and
the learner when it talks to the supervisor) hold their own pair and the server's public key, and a
ZAP handler (the authenticator started here) decides which client public keys may connect.

Two libzmq behaviours this module guards against, both verified against libzmq 4.3.5:

* A CURVE server with no ZAP handler in its context accepts *any* client that knows the server's
  public key, and that key is public by design. Servers therefore set ``ZAP_DOMAIN`` together with
  ``ZAP_ENFORCE_DOMAIN``, which makes a missing handler refuse everyone instead, and
  :mod:`zmqrl.transport.sockets` refuses to bind a secured socket before
  :meth:`Security.start_authenticator` has run for that context.
* There is one ZAP endpoint per ``zmq.Context``. Roles may share a context (in-process tests, the
  singleton), so authenticators are shared per context and reference-counted.

Key layout (what :func:`create_keys`, i.e. ``zmqrl keys DIR``, writes)::

    DIR/server.key, DIR/server.key_secret          the binding side
    DIR/<client>.key, DIR/<client>.key_secret      the connecting side
    DIR/authorized/<client>.key                    public keys the servers accept
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

log = logging.getLogger("zmqrl.security")

# File names of the layout above. ``.key``/``.key_secret`` and the text format are the ones pyzmq
# and czmq use, so their tools (zmq.auth.load_certificate, zcert) read zmqrl's keys as they are.
SERVER_NAME = "server"
DEFAULT_CLIENT = "client"
AUTHORIZED_DIR = "authorized"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
# Secret files are readable by their owner only, like an ssh private key; the keys directory too.
SECRET_MODE = 0o600
KEYS_DIR_MODE = 0o700
# The ZAP domain every zmqrl server announces; the authenticator answers for this domain only.
ZAP_DOMAIN = "zmqrl"
# Seconds between log lines about refused handshakes (the ones in between are counted, then summed up).
DENIAL_LOG_SECONDS = 30.0
# The command users run to make keys; every "what to do next" message names it.
KEYS_COMMAND = "zmqrl keys"
# Client names become file names: keep them to one plain path component.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Endpoint schemes that never leave this machine.
_LOCAL_SCHEMES = ("ipc://", "inproc://")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


class SecurityError(RuntimeError):
    """Keys or settings that cannot be used safely; the message says what to do next."""


# --------------------------------------------------------------------------------------------
# Key files
# --------------------------------------------------------------------------------------------


def _key_text(name: str, public: bytes, secret: bytes | None) -> str:
    """One key in the ZPL text format that zmq.auth.load_certificate and czmq's zcert read."""
    kind = "secret key: keep it private" if secret is not None else "public key: safe to share"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"#   zmqrl CurveZMQ {kind} (made by `{KEYS_COMMAND}` on {when})",
        "",
        "metadata",
        f'    name = "{name}"',
        "curve",
        f'    public-key = "{public.decode("ascii")}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create ``path`` with ``mode`` from the first byte on; never replace an existing file.

    pyzmq's create_certificates opens with the process umask and would need a chmod afterwards,
    which leaves a window where a secret is readable by others, and it silently overwrites.
    O_EXCL closes both holes.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits we asked for; set exactly this
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def client_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a client key pair (it becomes a file name), or None if it can.

    Pure, so that config checking (transport.key_name) and ``zmqrl keys`` apply the same rule.
    """
    if not _CLIENT_NAME.fullmatch(name) or name in (SERVER_NAME, AUTHORIZED_DIR):
        return (
            f"bad client name {name!r}: use 1-64 letters, digits, '.', '_' or '-' "
            f"(not starting with '.', and not {SERVER_NAME!r} or {AUTHORIZED_DIR!r})"
        )
    return None


def _check_client_names(names: Iterable[str]) -> list[str]:
    checked: list[str] = []
    for name in names:
        if problem := client_name_problem(name):
            raise SecurityError(problem)
        if name in checked:
            raise SecurityError(f"client name {name!r} given twice")
        checked.append(name)
    return checked


def create_keys(keys_dir: Path, clients: list[str] | None = None) -> list[Path]:
    """Make the server pair (when absent) and one pair per client, and authorize every client.

    Run once per deployment on the host of the binding roles; run again with new names to add
    clients (each gets its own pair, so one can later be revoked by deleting its authorized file).
    Nothing is ever overwritten: replacing the server key would lock out every deployed client,
    so that raises FileExistsError, as does reusing a client name. Everything is checked before the
    first file is written, so a refused call leaves the directory as it was.
    """
    keys_dir = Path(keys_dir)
    explicit = clients is not None
    names = _check_client_names(clients if clients is not None else [DEFAULT_CLIENT])
    server_files = [keys_dir / f"{SERVER_NAME}{PUBLIC_SUFFIX}", keys_dir / f"{SERVER_NAME}{SECRET_SUFFIX}"]
    have_server = any(p.exists() for p in server_files)
    if have_server and not explicit:
        raise FileExistsError(
            f"{keys_dir} already holds a server key ({server_files[0].name}); refusing to overwrite it, "
            f"because every client made for it would be locked out. To add a client, give a new "
            f"client name; to start over, move {keys_dir} away first."
        )
    authorized = keys_dir / AUTHORIZED_DIR
    planned: list[tuple[str, Path, Path, Path]] = []
    for name in names:
        files = (
            keys_dir / f"{name}{PUBLIC_SUFFIX}",
            keys_dir / f"{name}{SECRET_SUFFIX}",
            authorized / f"{name}{PUBLIC_SUFFIX}",
        )
        for path in files:
            if path.exists():
                raise FileExistsError(
                    f"{path} already exists; refusing to overwrite a key. Pick another client name, "
                    f"or delete that client's files first to replace it."
                )
        planned.append((name, *files))

    if not keys_dir.exists():
        keys_dir.mkdir(parents=True, mode=KEYS_DIR_MODE)
    authorized.mkdir(exist_ok=True)
    written: list[Path] = []
    if not have_server:
        public, secret = zmq.curve_keypair()
        _write_new(server_files[0], _key_text(SERVER_NAME, public, None), 0o644)
        _write_new(server_files[1], _key_text(SERVER_NAME, public, secret), SECRET_MODE)
        written += server_files
    for name, public_path, secret_path, authorized_path in planned:
        public, secret = zmq.curve_keypair()
        _write_new(public_path, _key_text(name, public, None), 0o644)
        _write_new(secret_path, _key_text(name, public, secret), SECRET_MODE)
        _write_new(authorized_path, _key_text(name, public, None), 0o644)
        written += [public_path, secret_path, authorized_path]
    return written


def _missing(path: Path, keys_dir: Path, hint: str) -> SecurityError:
    return SecurityError(
        f"{path} is missing: {hint} Make keys with `{KEYS_COMMAND} DIR` on the host of the learner and "
        f"supervisor, copy what each host needs, and point transport.keys_dir at it (now {keys_dir})."
    )


def _read_key(path: Path, keys_dir: Path, hint: str, need_secret: bool) -> tuple[bytes, bytes | None]:
    """Public and secret key of one key file, with errors that name the file and the fix."""
    if not path.is_file():
        raise _missing(path, keys_dir, hint)
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read key file {path}: {exc}; remake it with `{KEYS_COMMAND}`") from None
    if need_secret and secret is None:
        raise SecurityError(f"{path} holds no secret key; remake it with `{KEYS_COMMAND}`")
    try:
        if secret is not None and zmq.curve_public(secret) != public:
            raise SecurityError(f"{path}: its public and secret keys do not belong together; remake it")
    except zmq.ZMQError as exc:
        raise SecurityError(f"{path}: not a valid CurveZMQ key ({exc}); remake it") from None
    if secret is not None:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("secret key %s is readable by other users (mode %o): chmod 600 it", path, mode)
    return public, secret


@dataclass(frozen=True)
class Security:
    """Curve keys of one process; None everywhere means plaintext (loopback default).

    One value serves every role on a host: binding sockets use the server pair, connecting sockets
    the client pair plus the server's public key. ``server_secret`` is None on hosts that only
    connect (actor hosts get ``server.key`` but never ``server.key_secret``).
    """

    server_public: bytes
    server_secret: bytes | None
    client_public: bytes
    client_secret: bytes
    authorized_dir: Path

    @property
    def can_serve(self) -> bool:
        """Whether this process holds the server secret, i.e. may bind secured sockets."""
        return self.server_secret is not None

    @classmethod
    def load(cls, keys_dir: Path, client: str = DEFAULT_CLIENT) -> Security:
        """Read the keys of one process from ``keys_dir`` (made by ``zmqrl keys``)."""
        keys_dir = Path(keys_dir)
        _check_client_names([client])
        if not zmq.has("curve"):
            raise SecurityError(
                f"this libzmq ({zmq.zmq_version()}) was built without CURVE; install a pyzmq wheel, "
                f"which bundles a libzmq with CURVE"
            )
        if not keys_dir.is_dir():
            raise SecurityError(
                f"keys directory {keys_dir} does not exist: make it with `{KEYS_COMMAND} {keys_dir}` "
                f"(or fix transport.keys_dir)"
            )
        server_public, _ = _read_key(
            keys_dir / f"{SERVER_NAME}{PUBLIC_SUFFIX}",
            keys_dir,
            "every host needs the server's public key.",
            need_secret=False,
        )
        server_secret: bytes | None = None
        secret_path = keys_dir / f"{SERVER_NAME}{SECRET_SUFFIX}"
        if secret_path.exists():
            secret_public, server_secret = _read_key(secret_path, keys_dir, "", need_secret=True)
            if secret_public != server_public:
                raise SecurityError(
                    f"{secret_path} and {SERVER_NAME}{PUBLIC_SUFFIX} in {keys_dir} are different keys: "
                    f"copy both from the directory `{KEYS_COMMAND}` made"
                )
        client_public, client_secret = _read_key(
            keys_dir / f"{client}{SECRET_SUFFIX}",
            keys_dir,
            f"every process needs a client key pair (here: {client!r}).",
            need_secret=True,
        )
        assert client_secret is not None  # need_secret=True guarantees it
        return cls(
            server_public=server_public,
            server_secret=server_secret,
            client_public=client_public,
            client_secret=client_secret,
            authorized_dir=keys_dir / AUTHORIZED_DIR,
        )

    def start_authenticator(self, ctx: zmq.Context) -> AuthenticatorHandle:
        """Start (or join) the ZAP handler of ``ctx`` that admits clients listed in authorized_dir.

        Call it before binding secured sockets in ``ctx`` (sockets.py refuses otherwise) and call
        ``stop()`` on the result at shutdown, before the context is closed. Files added to or
        removed from authorized_dir count from the next handshake on; connections already made stay
        up until they drop. libzmq does not retry a handshake the authenticator refused, so a client
        refused before its key was added must be restarted to get in.
        """
        if not self.authorized_dir.is_dir():
            raise SecurityError(
                f"{self.authorized_dir} is missing: servers need the list of authorized client keys. "
                f"Run the binding roles on the host where `{KEYS_COMMAND}` made the keys."
            )
        return _start_shared(ctx, self.authorized_dir.resolve())


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


def _start_shared(ctx: zmq.Context, directory: Path) -> AuthenticatorHandle:
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
