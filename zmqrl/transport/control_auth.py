"""Authentication of the control plane: heartbeats (roles -> supervisor), control (supervisor -> roles).

One forged heartbeat used to end a run: anything that reached the heartbeat port could send
``learner-0 finished``. Every control-plane message is now authenticated, in one of two ways:

* **CurveZMQ keys, one per role** (``transport.keys_dir``): the supervisor's authenticator gives
  each connection its client key's name as User-Id, and a heartbeat is taken only when that key may
  speak as the role and id it claims (:mod:`zmqrl.transport.identity`). Control messages come from
  the Curve server, which every client authenticates by its key.
* **A per-run secret** (no keys): every message gets an envelope frame in front of its header,
  ``MAGIC | time | nonce | HMAC-SHA256``, the MAC keyed by the secret (one key per direction) over
  the envelope's fields and the exact header bytes. The secret itself never travels. A receiver
  takes a message only if the MAC matches, its time is within ``REPLAY_WINDOW_SECONDS`` of its own
  clock and its nonce was not seen inside that window (so a recorded message cannot be replayed).
  The secret comes from ``ZMQRL_CONTROL_TOKEN`` (hex) or ``transport.control_token_file``; `zmqrl
  launch` writes a fresh one per run into the run directory (mode 0600) and names it in the config
  its children read, so it never appears on a command line.

The wire layout is in docs/protocol.md ("Control-plane authentication"). A receiver without a
secret accepts an enveloped message unverified (it cannot check it), so a role given a secret can
talk to a supervisor that has none; a receiver with one drops everything it cannot verify.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zmqrl.transport.identity import speaker_of
from zmqrl.transport.messages import WireError

log = logging.getLogger("zmqrl.security")

# The environment variable that may carry the run's control secret, hex-encoded.
CONTROL_TOKEN_ENV = "ZMQRL_CONTROL_TOKEN"
# Bytes of secret `zmqrl launch` and `zmqrl keys --token` make; the fewest a token may have.
TOKEN_BYTES = 32
MIN_TOKEN_BYTES = 16
# The command that makes a token file, named in every "what to do next".
TOKEN_COMMAND = "zmqrl keys --token FILE"
# The file `zmqrl launch` writes the run's secret to, in the run directory.
LAUNCH_TOKEN_FILE = "control.token"
# Envelope: magic, sender's Unix time in ms (uint64 LE), a random nonce, the MAC.
ENVELOPE_MAGIC = b"ZQRLMAC1"
NONCE_BYTES = 16
MAC_BYTES = 32
ENVELOPE_BYTES = len(ENVELOPE_MAGIC) + 8 + NONCE_BYTES + MAC_BYTES
_TIME = struct.Struct("<Q")
_LENGTH = struct.Struct("<I")
# A message whose time is further than this from the receiver's clock is refused; inside it, a
# nonce seen before is. Generous for clocks of hosts kept by NTP, short enough to keep few nonces.
REPLAY_WINDOW_SECONDS = 60.0
# Most nonces remembered (only of messages whose MAC matched, so no outsider can fill it): two
# beats a second from a thousand processes over the window is 120,000; past this the oldest go.
MAX_REMEMBERED_NONCES = 200_000
# The two directions, each with a key of its own: a heartbeat can never pass as a control message.
HEARTBEAT = "heartbeat"
CONTROL = "control"


class Unauthenticated(WireError):
    """A control-plane message that could not be verified, or whose sender may not say what it
    says; dropped and counted like every bad message."""


def _derive(secret: bytes, purpose: str) -> bytes:
    return hmac.new(secret, b"zmqrl control plane v1 " + purpose.encode("ascii"), hashlib.sha256).digest()


def _mac(key: bytes, head: bytes, frames: Sequence[Any]) -> bytes:
    mac = hmac.new(key, head, hashlib.sha256)
    for frame in frames:
        view = memoryview(frame)
        mac.update(_LENGTH.pack(view.nbytes))
        mac.update(view)
    return mac.digest()


def seal(key: bytes, frames: Sequence[Any], now: float, nonce: bytes | None = None) -> list[Any]:
    """``frames`` with the envelope in front: MAC over magic, time, nonce and every frame."""
    nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)
    head = ENVELOPE_MAGIC + _TIME.pack(int(now * 1000)) + nonce
    return [head + _mac(key, head, frames), *frames]


def is_enveloped(frames: Sequence[Any]) -> bool:
    return (
        len(frames) >= 2
        and memoryview(frames[0]).nbytes == ENVELOPE_BYTES
        and (bytes(memoryview(frames[0])[: len(ENVELOPE_MAGIC)]) == ENVELOPE_MAGIC)
    )


class ReplayGuard:
    """The nonces of verified messages seen inside the replay window, oldest first. One per
    receiver: two subscribers in one process each see the same message once."""

    def __init__(self, window: float = REPLAY_WINDOW_SECONDS, capacity: int = MAX_REMEMBERED_NONCES) -> None:
        self.window = window
        self.capacity = capacity
        self._seen: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def admit(self, sent: float, nonce: bytes, now: float) -> None:
        """Raise Unauthenticated for a stale or replayed message; remember it otherwise."""
        if abs(now - sent) > self.window:
            raise Unauthenticated(
                f"message time is {now - sent:+.0f} s off this host's clock (more than "
                f"{self.window:.0f} s): a replay, or the two hosts' clocks differ (check NTP)"
            )
        if nonce in self._seen:
            raise Unauthenticated("a replayed message (its nonce was seen before)")
        self._seen[nonce] = sent
        oldest_kept = now - self.window
        seen = self._seen
        while seen and (len(seen) > self.capacity or next(iter(seen.values())) < oldest_kept):
            seen.popitem(last=False)


def unseal(key: bytes, frames: Sequence[Any], now: float, guard: ReplayGuard) -> list[Any]:
    """The frames after a verified envelope; raises Unauthenticated otherwise."""
    if not is_enveloped(frames):
        raise Unauthenticated("no authentication envelope: this receiver requires the run's control token")
    envelope = bytes(memoryview(frames[0]))
    head, mac = envelope[:-MAC_BYTES], envelope[-MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, head, frames[1:])):
        raise Unauthenticated("bad MAC: the sender does not hold this run's control token")
    sent_ms = _TIME.unpack_from(head, len(ENVELOPE_MAGIC))[0]
    guard.admit(sent_ms / 1000.0, head[len(ENVELOPE_MAGIC) + _TIME.size :], now)
    return list(frames[1:])


# --------------------------------------------------------------------------------------------
# Where the secret comes from
# --------------------------------------------------------------------------------------------


class TokenError(RuntimeError):
    """A control token that cannot be used; the message says what to do next."""


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


def write_token_file(path: Path, replace: bool = False) -> None:
    """A fresh secret in ``path``, mode 0600 from its first byte. ``replace`` swaps in a new one
    atomically (a launch's per-run token); otherwise an existing file is left alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path.with_name(f".{path.name}.{os.getpid()}.tmp") if replace else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if replace:
            raise
        return  # made meanwhile by another process: theirs counts
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, new_token_text().encode("ascii"))
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)


class TokenSource:
    """The run's control secret: from ``ZMQRL_CONTROL_TOKEN``, else ``transport.control_token_file``.

    A file that does not exist yet is looked for again on every use (a supervisor started after
    the roles writes it), and said once in the log meanwhile. Keys are derived per direction."""

    def __init__(self, env_value: str | None, path: Path | None) -> None:
        self.path = path
        self._keys: dict[str, bytes] | None = None
        self._waiting_logged = False
        if env_value:
            self._set(parse_token(env_value, CONTROL_TOKEN_ENV))

    @property
    def configured(self) -> bool:
        return self._keys is not None or self.path is not None

    def describe(self) -> str:
        return f"transport.control_token_file={self.path}" if self.path is not None else CONTROL_TOKEN_ENV

    def key(self, purpose: str) -> bytes | None:
        """The key for ``purpose``; None while the token file does not exist yet."""
        if self._keys is None and self.path is not None:
            self._load_file(self.path)
        return None if self._keys is None else self._keys[purpose]

    def _set(self, token: bytes) -> None:
        self._keys = {purpose: _derive(token, purpose) for purpose in (HEARTBEAT, CONTROL)}

    def _load_file(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            if not self._waiting_logged:
                self._waiting_logged = True
                log.info("waiting for the control token file %s (the supervisor writes it)", path)
            return
        except OSError as exc:
            raise TokenError(f"cannot read the control token file {path}: {exc}") from None
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("control token file %s is readable by others (mode %o): chmod 600 it", path, mode)
        self._set(parse_token(text, str(path)))


# --------------------------------------------------------------------------------------------
# What a sender or receiver holds
# --------------------------------------------------------------------------------------------


class ControlAuth:
    """One process's control-plane authentication: a token (or none) and whether Curve keys bind
    heartbeats to their senders' roles. ``ControlAuth()`` is none at all (loopback by hand)."""

    def __init__(
        self,
        token: TokenSource | None = None,
        curve_identities: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token if token is not None and token.configured else None
        self.curve_identities = curve_identities
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.curve_identities

    def seal(self, frames: list[Any], purpose: str) -> list[Any] | None:
        """``frames`` as sent: enveloped with a token, as they are without one; None while the
        token file has not appeared yet (send nothing: the receiver would drop it anyway)."""
        if self.token is None:
            return frames
        key = self.token.key(purpose)
        return None if key is None else seal(key, frames, self._clock())

    def open(self, frames: Sequence[Any], purpose: str, guard: ReplayGuard) -> list[Any]:
        """The message's own frames after its envelope is verified (with a token) or set aside
        (without one: nothing to verify with); raises Unauthenticated."""
        if self.token is None:
            return list(frames[1:]) if is_enveloped(frames) else list(frames)
        key = self.token.key(purpose)
        if key is None:
            raise Unauthenticated(f"no control token here yet ({self.token.describe()} does not exist)")
        return unseal(key, frames, self._clock(), guard)

    def check_speaker(self, user_id: str | None, role: str, role_id: int) -> None:
        """With Curve identities, raise Unauthenticated unless the connection's key may speak as
        ``role-role_id``."""
        if not self.curve_identities:
            return
        speaker = speaker_of(user_id) if user_id else None
        if speaker is None or not speaker.allows(role, role_id):
            raise Unauthenticated(
                f"a heartbeat as {role}-{role_id} over a connection with client key {user_id!r}, which may "
                "not speak as it (docs/deployment.md, 'One key per role')"
            )
