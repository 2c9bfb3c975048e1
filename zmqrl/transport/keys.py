"""CurveZMQ key generation and key files: ``zmqrl keys``, client names, and :meth:`Security.load`.

Why keys at all: zmqrl's sockets carry model weights out and training data in, and the learner
trusts what arrives enough to train on it. On loopback that is fine; anything reachable from other
machines must be encrypted and must only accept known peers. CurveZMQ does both inside libzmq:
servers (the binding side: learner and supervisor) hold a long-term key pair, clients (actors, and
the learner when it talks to the supervisor) hold their own pair and the server's public key, and a
ZAP handler decides which client public keys may connect. This module makes and reads the keys;
:mod:`zmqrl.transport.security` is the runtime that uses them (the ZAP handler, socket options,
and the rule about what may bind where).

Key layout (what :func:`create_keys`, i.e. ``zmqrl keys DIR``, writes)::

    DIR/server.key, DIR/server.key_secret          the binding side
    DIR/<client>.key, DIR/<client>.key_secret      the connecting side
    DIR/authorized/<client>.key                    public keys the servers accept
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

# The key layout's reserved names and the client naming rule live with the config checks, which
# apply the rule to transport.key_name before anything imports zmq.
from zmqrl.config_checks import AUTHORIZED_DIR, SERVER_NAME, client_name_problem
from zmqrl.transport.secret_files import exposure_warning

log = logging.getLogger("zmqrl.security")

# File names of the layout above. ``.key``/``.key_secret`` and the text format are the ones pyzmq
# and czmq use, so their tools (zmq.auth.load_certificate, zcert) read zmqrl's keys as they are.
DEFAULT_CLIENT = "client"
# The roles that heartbeat to a supervisor: with keys, each has a client pair named for it, which is
# the only kind of key the supervisor lets speak as that role (zmqrl/transport/identity.py).
ROLE_CLIENTS = ("learner", "actor", "evaluator")
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
# Secret files are readable by their owner only, like an ssh private key; the keys directory too.
SECRET_MODE = 0o600
KEYS_DIR_MODE = 0o700
# The command users run to make keys; every "what to do next" message names it.
KEYS_COMMAND = "zmqrl keys"


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

    The default clients are ``client`` (tools such as ``zmqrl status``, and the supervisor's own
    pair) and one pair per role (``learner``, ``actor``, ``evaluator``), each of which the
    supervisor lets speak only as its role.

    Run once per deployment on the host of the binding roles; run again with new names to add
    clients (each gets its own pair, so one can later be revoked by deleting its authorized file).
    Nothing is ever overwritten: replacing the server key would lock out every deployed client,
    so that raises FileExistsError, as does reusing a client name. Everything is checked before the
    first file is written, so a refused call leaves the directory as it was.
    """
    keys_dir = Path(keys_dir)
    explicit = clients is not None
    names = _check_client_names(clients if clients is not None else [DEFAULT_CLIENT, *ROLE_CLIENTS])
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
    exposed = exposure_warning(path, "secret key") if secret is not None else None
    if exposed is not None:  # which modes warn, and why a mounted 0440 does not: secret_files.py
        log.warning("%s", exposed)
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
    client_name: str = DEFAULT_CLIENT  # the pair's name: the role its heartbeats may speak as

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
            client_name=client,
        )
