"""Which role a CurveZMQ client key may speak as on the control plane, read from the key's name.

With keys, the supervisor's authenticator answers every handshake with the client key's name (its
file name in ``keys_dir/authorized/``, without ``.key``) as the connection's ZAP User-Id, and every
heartbeat that arrives over that connection carries it. A heartbeat claims a role and an id
(``learner-0``, ``actor-3``); it is taken only when the key's name may speak as that:

==========================================  =====================================================
key name                                    may speak as
==========================================  =====================================================
``learner``, ``learner.NAME``               the learner
``evaluator``, ``evaluator.NAME``           the evaluator
``actor``, ``actor.NAME``                   any actor (replicas sharing one key: a StatefulSet)
``actor-3``, ``actor-3.NAME``               actor 3 only (one key per replica)
anything else (``client``, ``host-a``)      no role: data channels and ``zmqrl status`` only
==========================================  =====================================================

So an actor's key can never end the run as ``learner-0 finished``, however the actor is subverted.
``NAME`` tells keys of one role apart (one per host, so one host can be revoked alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zmqrl.transport.keys import DEFAULT_CLIENT, SECRET_SUFFIX

# The roles that heartbeat to a supervisor, and so need a key bound to them when the run uses keys.
SPEAKING_ROLES = ("learner", "actor", "evaluator")
# role, then an optional "-ID", then an optional ".ANYTHING" (client names allow '.', '_', '-').
_SPEAKER = re.compile(r"(learner|actor|evaluator)(?:-(0|[1-9][0-9]{0,8}))?(?:\.[A-Za-z0-9._-]+)?")


@dataclass(frozen=True)
class Speaker:
    """What one key name may speak as: a role, and one id of it or (None) any."""

    role: str
    id: int | None

    def allows(self, role: str, role_id: int) -> bool:
        return role == self.role and (self.id is None or self.id == role_id)


def speaker_of(key_name: str) -> Speaker | None:
    """The role (and id) a key of this name may speak as; None for a key bound to no role."""
    match = _SPEAKER.fullmatch(key_name)
    if match is None:
        return None
    return Speaker(match.group(1), int(match.group(2)) if match.group(2) is not None else None)


def may_speak_as(key_name: str, role: str, role_id: int) -> bool:
    speaker = speaker_of(key_name)
    return speaker is not None and speaker.allows(role, role_id)


def speaking_problem(key_name: str, role: str, role_id: int) -> str | None:
    """Why a process holding key ``key_name`` cannot heartbeat as ``role-role_id``, with the fix;
    None when it can."""
    if may_speak_as(key_name, role, role_id):
        return None
    return (
        f"client key {key_name!r} may not speak as {role}-{role_id} on the control plane (the supervisor "
        f"would drop every heartbeat): give the {role} a key named for its role, e.g. "
        f"`zmqrl keys KEYS_DIR --client {role}` and transport.key_name={role} "
        "(docs/deployment.md, 'One key per role')"
    )


def role_key_name(keys_dir: Path, key_name: str, role: str, role_id: int) -> str:
    """The client pair a role uses: ``key_name`` when the user chose one (anything but the default
    ``client``); otherwise the pair named for this replica (``actor-3``), then for its role
    (``actor``), when ``keys_dir`` holds one; else ``client``."""
    if key_name != DEFAULT_CLIENT or role not in SPEAKING_ROLES:
        return key_name
    for name in (f"{role}-{role_id}", role):
        if (keys_dir / f"{name}{SECRET_SUFFIX}").is_file():
            return name
    return key_name
