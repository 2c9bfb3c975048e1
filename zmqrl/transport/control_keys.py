"""Where the control plane's secrets come from: the run's token (the supervisor's) and the role keys
derived from it (one per role, each process holding only its own).

One secret shared by every process let any of them end the run: a subverted actor, or the TensorBoard
container that happened to mount the run volume, could send the supervisor ``learner-0 finished``.
So the run's **token** S (32 random bytes, hex) stays with the supervisor, and each role gets a
**role key** of its own, ``K_role = HMAC-SHA256(S, "zmqrl control role v2 " + role)`` for
``role`` in ``learner``, ``actor``, ``evaluator``. A role signs its heartbeats with its key and
verifies the supervisor's messages with it; the supervisor, which holds S, derives every role's key
and checks that a heartbeat signed with the actor key speaks as an actor. So an actor's key can
never pass as the learner's, and nothing in it leads back to S (HMAC is one-way).

Files: the token is ``transport.control_token_file`` (or ``ZMQRL_CONTROL_TOKEN``); role keys are
``CONTROL_KEYS_DIR/ROLE/control.key`` (``transport.control_keys_dir``), one directory per role so that
a container can mount its own and no other (docker/compose.yaml). A role reads its key there when
the setting is given, else derives it from the token (roles started by hand that share the token:
authenticated, but not separated). The supervisor writes the role keys whenever it holds the token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from zmqrl.transport.secret_files import exposure_warning

log = logging.getLogger("zmqrl.security")

# The environment variable that may carry the run's control secret, hex-encoded.
CONTROL_TOKEN_ENV = "ZMQRL_CONTROL_TOKEN"
# Bytes of secret `zmqrl launch` and `zmqrl keys --token` make; the fewest a token may have.
TOKEN_BYTES = 32
MIN_TOKEN_BYTES = 16
# The command that makes a token file, named in every "what to do next".
TOKEN_COMMAND = "zmqrl keys --token FILE"
# The file `zmqrl launch` writes the run's secret to, in the run directory, and the directory of
# role keys beside it.
LAUNCH_TOKEN_FILE = "control.token"
LAUNCH_KEYS_DIR = "control-keys"
# A role's key file, under transport.control_keys_dir/ROLE/.
ROLE_KEY_FILE = "control.key"
# The roles that hold a key; the supervisor signs its messages for each of them.
KEY_ROLES = ("learner", "actor", "evaluator")
# First word of a role key file (a token file is bare hex): tells the two apart and names the role.
ROLE_KEY_MAGIC = "zmqrl-control-key-v2"


class TokenError(RuntimeError):
    """A control token or role key that cannot be used; the message says what to do next."""


def role_key(token: bytes, role: str) -> bytes:
    """The key of ``role`` in the run whose token is ``token``."""
    return hmac.new(token, b"zmqrl control role v2 " + role.encode("ascii"), hashlib.sha256).digest()


def parse_token(text: str, where: str) -> bytes:
    try:
        token = bytes.fromhex(text.strip())
    except ValueError:
        raise TokenError(f"{where} is not a control token (hex): make one with `{TOKEN_COMMAND}`") from None
    if len(token) < MIN_TOKEN_BYTES:
        raise TokenError(
            f"{where} holds {len(token)} bytes of secret, fewer than {MIN_TOKEN_BYTES}: make a new one "
            f"with `{TOKEN_COMMAND}`"
        )
    return token


def new_token_text() -> str:
    return secrets.token_hex(TOKEN_BYTES) + "\n"


def role_key_text(token: bytes, role: str) -> str:
    return f"{ROLE_KEY_MAGIC} {role} {role_key(token, role).hex()}\n"


def role_key_path(keys_dir: Path, role: str) -> Path:
    return keys_dir / role / ROLE_KEY_FILE


def _write_private(path: Path, text: str, replace: bool) -> None:
    """``text`` in ``path``, mode 0600 from its first byte. ``replace`` swaps it in atomically
    through a fresh temporary name (O_EXCL: never a file or link planted there); otherwise an
    existing file is left alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp") if replace else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        if replace:
            raise
        return  # made meanwhile by another process: theirs counts
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)


def write_token_file(path: Path, replace: bool = False) -> None:
    """A fresh secret in ``path`` (mode 0600). ``replace`` swaps in a new one atomically (a launch's
    per-run token); otherwise an existing file is left alone."""
    _write_private(path, new_token_text(), replace)


def write_role_keys(token: bytes, keys_dir: Path) -> list[Path]:
    """Every role's key under ``keys_dir`` (``ROLE/control.key``, mode 0600), rewritten whenever the
    supervisor starts: they follow from the token, so a new token replaces them all."""
    written = []
    for role in KEY_ROLES:
        path = role_key_path(keys_dir, role)
        current = path.read_text(encoding="ascii", errors="replace") if path.is_file() else None
        text = role_key_text(token, role)
        if current != text:
            _write_private(path, text, replace=True)
        written.append(path)
    return written


def _read_private(path: Path) -> str | None:
    """The file's text; None while it does not exist. Warns when others may read it."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokenError(f"cannot read the control secret file {path}: {exc}") from None
    exposed = exposure_warning(path, "control secret file")
    if exposed is not None:  # which modes warn, and why a mounted 0440 does not: secret_files.py
        log.warning("%s", exposed)
    return text


class KeySource:
    """What one process holds of the run's control secrets, read lazily: files that do not exist yet
    are looked for again on every use (a supervisor started after the roles writes them), said once
    in the log meanwhile.

    The supervisor (``role=None``) needs the token. A role needs its own key: from
    ``keys_dir/ROLE/control.key`` when ``keys_dir`` is given, else derived from the token."""

    def __init__(
        self,
        env_value: str | None,
        path: Path | None,
        keys_dir: Path | None = None,
        role: str | None = None,
    ) -> None:
        if role is not None and role not in KEY_ROLES:
            raise ValueError(f"no control key for role {role!r}")
        self.path = path
        self.keys_dir = keys_dir
        self.role = role
        self._token: bytes | None = parse_token(env_value, CONTROL_TOKEN_ENV) if env_value else None
        self._role_key: bytes | None = None
        self._waiting_logged = False

    @property
    def configured(self) -> bool:
        if self.role is not None and self.keys_dir is not None:
            return True
        return self._token is not None or self.path is not None

    @property
    def own_key_file(self) -> Path | None:
        """The role key file this role reads (None: it derives its key from the token)."""
        if self.role is None or self.keys_dir is None:
            return None
        return role_key_path(self.keys_dir, self.role)

    def describe(self) -> str:
        if (own := self.own_key_file) is not None:
            return f"the role key {own} (transport.control_keys_dir)"
        return f"transport.control_token_file={self.path}" if self.path is not None else CONTROL_TOKEN_ENV

    def token(self) -> bytes | None:
        """The run's token; None while its file does not exist yet."""
        if self._token is None and self.path is not None:
            text = self._read(self.path)
            if text is not None:
                self._token = parse_token(text, str(self.path))
        return self._token

    def own_key(self) -> bytes | None:
        """This role's key; None while the file it comes from does not exist yet."""
        if self.role is None:
            raise ValueError("the supervisor holds the token, not a role key")
        if self._role_key is None:
            if (own := self.own_key_file) is not None:
                text = self._read(own)
                if text is not None:
                    self._role_key = self._parse_role_key(text, own)
            elif (token := self.token()) is not None:
                self._role_key = role_key(token, self.role)
        return self._role_key

    def _read(self, path: Path) -> str | None:
        text = _read_private(path)
        if text is None and not self._waiting_logged:
            self._waiting_logged = True
            log.info("waiting for the control secret file %s (the supervisor writes it)", path)
        return text

    def _parse_role_key(self, text: str, path: Path) -> bytes:
        words = text.split()
        if len(words) != 3 or words[0] != ROLE_KEY_MAGIC:
            raise TokenError(
                f"{path} is not a zmqrl role key: the supervisor writes them under "
                "transport.control_keys_dir (or make them with `zmqrl keys --token FILE --role-keys DIR`)"
            )
        if words[1] != self.role:
            raise TokenError(
                f"{path} holds the {words[1]}'s control key, not the {self.role}'s: give this {self.role} "
                f"its own ({self.role}/{ROLE_KEY_FILE} under transport.control_keys_dir)"
            )
        try:
            key = bytes.fromhex(words[2])
        except ValueError:
            raise TokenError(f"{path}: the role key is not hex; rewrite it from the run's token") from None
        if len(key) != hashlib.sha256().digest_size:
            raise TokenError(f"{path}: a role key has 32 bytes, this one {len(key)}")
        return key
