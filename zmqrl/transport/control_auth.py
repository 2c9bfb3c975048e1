"""Authentication of the control plane: heartbeats (roles -> supervisor), control (supervisor -> roles).

One forged heartbeat used to end a run: anything that reached the heartbeat port could send
``learner-0 finished``. Every control-plane message is now authenticated, in one of two ways:

* **CurveZMQ keys, one per role** (``transport.keys_dir``): the supervisor's authenticator gives
  each connection its client key's name as User-Id, and a heartbeat is taken only when that key may
  speak as the role and id it claims (:mod:`zmqrl.transport.identity`). Control messages come from
  the Curve server, which every client authenticates by its key.
* **Role keys derived from the run's token** (no Curve keys; :mod:`zmqrl.transport.control_keys`):
  every message gets an envelope frame in front of its header, ``MAGIC | time | nonce | count |
  (name, HMAC-SHA256)...``, each MAC made with a role's key (one key per direction derived from it)
  over the envelope's fixed fields, the entry's name and the exact frames. A heartbeat carries one
  entry, its sender's role; the supervisor holds the token, derives that role's key, and takes the
  heartbeat only if the MAC matches *and* the heartbeat speaks as that role. The supervisor's messages
  carry one entry per role, so each role verifies with the one key it holds. A receiver also
  refuses a message whose time is not within ``REPLAY_WINDOW_SECONDS`` of its own clock or whose
  nonce it saw inside that window (a recorded message cannot be replayed).

So an actor's key cannot pass as the learner's (it can speak for actors only, and stop only actors);
no role's key leads back to the token. The wire layout is in docs/protocol.md ("Control-plane
authentication"). A receiver without any secret accepts an enveloped message unverified (it cannot
check it), so a role given a key can talk to a supervisor that has none; a receiver with one drops
everything it cannot verify.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zmqrl.transport.control_keys import KEY_ROLES, KeySource, role_key
from zmqrl.transport.identity import speaker_of
from zmqrl.transport.messages import WireError

# Envelope: magic, sender's Unix time in ms (uint64 LE), a random nonce, the number of entries, then
# per entry the length of its name (one byte), the name (a role, ASCII) and its MAC.
ENVELOPE_MAGIC = b"ZQRLMAC2"
NONCE_BYTES = 16
MAC_BYTES = 32
_TIME = struct.Struct("<Q")
_LENGTH = struct.Struct("<I")
FIXED_BYTES = len(ENVELOPE_MAGIC) + _TIME.size + NONCE_BYTES + 1
MAX_NAME_BYTES = 32
# Most entries an envelope may carry (one per role the supervisor speaks to), and so its largest size.
MAX_ENTRIES = len(KEY_ROLES)
ENVELOPE_MAX_BYTES = FIXED_BYTES + MAX_ENTRIES * (1 + MAX_NAME_BYTES + MAC_BYTES)
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


def direction_key(key: bytes, purpose: str) -> bytes:
    """The key one role's ``key`` gives for one direction (``HEARTBEAT`` or ``CONTROL``)."""
    return hmac.new(key, b"zmqrl control plane v2 " + purpose.encode("ascii"), hashlib.sha256).digest()


def _mac(key: bytes, fixed: bytes, name: bytes, frames: Sequence[Any]) -> bytes:
    mac = hmac.new(key, fixed, hashlib.sha256)
    mac.update(bytes([len(name)]) + name)
    for frame in frames:
        view = memoryview(frame)
        mac.update(_LENGTH.pack(view.nbytes))
        mac.update(view)
    return mac.digest()


def seal(
    keys: Mapping[str, bytes], frames: Sequence[Any], now: float, nonce: bytes | None = None
) -> list[Any]:
    """``frames`` with the envelope in front: one MAC per ``name: key`` over the fixed fields, the
    name and every frame."""
    if not 1 <= len(keys) <= MAX_ENTRIES:
        raise ValueError(f"an envelope carries 1 to {MAX_ENTRIES} MACs, not {len(keys)}")
    nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)
    fixed = ENVELOPE_MAGIC + _TIME.pack(int(now * 1000)) + nonce + bytes([len(keys)])
    entries = []
    for name, key in keys.items():
        raw = name.encode("ascii")
        if not 0 < len(raw) <= MAX_NAME_BYTES:
            raise ValueError(f"a MAC's name has 1 to {MAX_NAME_BYTES} bytes: {name!r}")
        entries.append(bytes([len(raw)]) + raw + _mac(key, fixed, raw, frames))
    return [fixed + b"".join(entries), *frames]


def is_enveloped(frames: Sequence[Any]) -> bool:
    return (
        len(frames) >= 2
        and FIXED_BYTES < memoryview(frames[0]).nbytes <= ENVELOPE_MAX_BYTES
        and (bytes(memoryview(frames[0])[: len(ENVELOPE_MAGIC)]) == ENVELOPE_MAGIC)
    )


def envelope_entries(envelope: bytes) -> tuple[bytes, dict[str, bytes]]:
    """The envelope's fixed fields and its MACs by name; raises Unauthenticated when malformed."""
    fixed, count = envelope[:FIXED_BYTES], envelope[FIXED_BYTES - 1]
    entries: dict[str, bytes] = {}
    at = FIXED_BYTES
    for _ in range(count):
        size = envelope[at] if at < len(envelope) else 0
        name, mac = envelope[at + 1 : at + 1 + size], envelope[at + 1 + size : at + 1 + size + MAC_BYTES]
        if not 0 < size <= MAX_NAME_BYTES or len(mac) != MAC_BYTES or not name.isascii():
            raise Unauthenticated("a malformed authentication envelope")
        entries[name.decode("ascii")] = mac
        at += 1 + size + MAC_BYTES
    if at != len(envelope) or not entries:
        raise Unauthenticated("a malformed authentication envelope")
    return fixed, entries


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


def unseal(
    key_of: Callable[[str], bytes | None], frames: Sequence[Any], now: float, guard: ReplayGuard
) -> tuple[str, list[Any]]:
    """The frames after a verified envelope, and the name whose MAC verified them. ``key_of(name)``
    gives the key a receiver checks an entry with, None for a name it does not check (a role checks
    its own entry only; the supervisor any role's). Raises Unauthenticated otherwise."""
    if not is_enveloped(frames):
        raise Unauthenticated("no authentication envelope: this receiver requires the run's control token")
    fixed, entries = envelope_entries(bytes(memoryview(frames[0])))
    signer = None
    for name, mac in entries.items():
        key = key_of(name)
        if key is not None:
            if not hmac.compare_digest(mac, _mac(key, fixed, name.encode("ascii"), frames[1:])):
                raise Unauthenticated(f"bad MAC for {name!r}: the sender does not hold that key of this run")
            signer = name
            break
    if signer is None:
        raise Unauthenticated(f"no MAC this receiver can check (signed for {', '.join(sorted(entries))})")
    sent_ms = _TIME.unpack_from(fixed, len(ENVELOPE_MAGIC))[0]
    guard.admit(sent_ms / 1000.0, fixed[len(ENVELOPE_MAGIC) + _TIME.size : -1], now)
    return signer, list(frames[1:])


# --------------------------------------------------------------------------------------------
# What a sender or receiver holds
# --------------------------------------------------------------------------------------------


class ControlAuth:
    """One process's control-plane authentication: its secrets (or none) and whether Curve keys bind
    heartbeats to their senders' roles. ``ControlAuth()`` is none at all (loopback by hand).

    A role (``keys.role`` set) signs heartbeats with its own key and checks the supervisor's entry
    for it; the supervisor (``keys.role`` None) holds the token, signs for every role and checks
    each heartbeat with the key of the role whose entry it carries."""

    def __init__(
        self,
        keys: KeySource | None = None,
        curve_identities: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys if keys is not None and keys.configured else None
        self.curve_identities = curve_identities
        self._clock = clock
        self._derived: dict[tuple[str, str], bytes] = {}

    @property
    def enabled(self) -> bool:
        return self.keys is not None or self.curve_identities

    def _key(self, name: str, purpose: str) -> bytes | None:
        """The direction key of role ``name``: this role's own, or (the supervisor) any role's."""
        assert self.keys is not None
        if (name, purpose) in self._derived:
            return self._derived[(name, purpose)]
        if self.keys.role is not None:
            base = self.keys.own_key() if name == self.keys.role else None
        else:
            token = self.keys.token() if name in KEY_ROLES else None
            base = role_key(token, name) if token is not None else None
        if base is None:
            return None
        key = self._derived[(name, purpose)] = direction_key(base, purpose)
        return key

    def seal(self, frames: list[Any], purpose: str) -> list[Any] | None:
        """``frames`` as sent: enveloped with a key, as they are without one; None while the file
        the key comes from has not appeared yet (send nothing: the receiver would drop it anyway)."""
        if self.keys is None:
            return frames
        names = (self.keys.role,) if self.keys.role is not None else KEY_ROLES
        keys = {}
        for name in names:
            key = self._key(name, purpose)
            if key is None:
                return None
            keys[name] = key
        return seal(keys, frames, self._clock())

    def open(self, frames: Sequence[Any], purpose: str, guard: ReplayGuard) -> tuple[str | None, list[Any]]:
        """The role that signed the message (None without keys) and its own frames, after its
        envelope is verified (with keys) or set aside (without: nothing to verify with); raises
        Unauthenticated."""
        if self.keys is None:
            return None, list(frames[1:]) if is_enveloped(frames) else list(frames)
        if (own := self.keys.role) is not None and self.keys.own_key() is None:
            raise Unauthenticated(f"no control key here yet ({self.keys.describe()} does not exist)")
        if own is None and self.keys.token() is None:
            raise Unauthenticated(f"no control token here yet ({self.keys.describe()} does not exist)")
        return unseal(lambda name: self._key(name, purpose), frames, self._clock(), guard)

    def check_speaker(self, user_id: str | None, signer: str | None, role: str, role_id: int) -> None:
        """Raise Unauthenticated unless the sender may speak as ``role-role_id``: with Curve
        identities, by its connection's key; with role keys, by the key its MAC was made with."""
        if self.curve_identities:
            speaker = speaker_of(user_id) if user_id else None
            if speaker is None or not speaker.allows(role, role_id):
                raise Unauthenticated(
                    f"a heartbeat as {role}-{role_id} over a connection with client key {user_id!r}, "
                    "which may not speak as it (docs/deployment.md, 'One key per role')"
                )
        if self.keys is not None and signer != role:
            raise Unauthenticated(
                f"a heartbeat as {role}-{role_id} signed with the {signer}'s control key, which may not "
                "speak as it (docs/deployment.md, 'The control token')"
            )
