"""The run fingerprint check: whether this process's settings agree with the learner's.

A learner trains on whatever arrives that passes wire validation. An actor started by hand with
another ``agent.n_step`` or ``agent.gamma`` sends batches of the right shapes whose rewards and
discounts mean something else, and the learner's targets are silently wrong. So the learner
publishes its run fingerprint (a flat map of the settings both sides must share, computed from the
config by zmqrl/runtime/run_fingerprint.py, which also says what is in it) with every weights
message, and an actor compares it with its own before it imports anything: a mismatch ends the
actor (exit 2) with one line naming the keys. This module only carries and compares the maps, so
the transport needs neither the config nor the agent registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zmqrl.errors import ConfigError

# How a value absent on one side is shown in a mismatch message.
ABSENT = "<absent>"
# Longest rendering of one value in a mismatch message (foreign values may be 256 characters).
SHOWN_VALUE_MAX = 60


class FingerprintMismatch(ConfigError):
    """This process's settings differ from the learner's; the message is one line naming the keys.

    A ConfigError (so a ValueError): the user fixes it by changing a setting, and the CLI turns
    it into exit 2 with that one line wherever in a role's ``run()`` it is raised. ``keys`` lists
    the differing keys (sorted); ``mine`` / ``theirs`` are the two full maps.
    """

    def __init__(
        self, mine: Mapping[str, Any], theirs: Mapping[str, Any], there: str = "the learner"
    ) -> None:
        self.keys = fingerprint_mismatch(mine, theirs)
        self.mine = dict(mine)
        self.theirs = dict(theirs)
        parts = [f"{_key(k)} {_show(mine, k)} here, {_show(theirs, k)} at {there}" for k in self.keys]
        super().__init__(f"run settings differ from {there}'s: " + "; ".join(parts))


def fingerprint_mismatch(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ, sorted; a key present on one side only differs too.

    Numbers compare by value (``1`` equals ``1.0``: other encoders may shrink floats), but a bool
    never equals a number, and lists compare item by item.
    """
    keys = set(mine) | set(theirs)
    return sorted(k for k in keys if k not in mine or k not in theirs or not _same(mine[k], theirs[k]))


def check_fingerprint(mine: Mapping[str, Any], theirs: Mapping[str, Any], there: str = "the learner") -> None:
    """Raise :class:`FingerprintMismatch` unless the two maps agree.

    An actor runs this on every weights message, and the maps nearly always agree: that case
    walks the keys once, without the sorted set of ``fingerprint_mismatch``."""
    if len(mine) == len(theirs) and all(k in theirs and _same(v, theirs[k]) for k, v in mine.items()):
        return
    if fingerprint_mismatch(mine, theirs):
        raise FingerprintMismatch(mine, theirs, there)


# Types whose values agree exactly when they are equal, if both sides have the same one.
_PLAIN = frozenset((str, int, float, bool))


def _same(a: Any, b: Any) -> bool:
    if type(a) is type(b) and type(a) in _PLAIN:  # what the rules below give, in one test
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, list) or isinstance(b, list):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _key(key: str) -> str:
    """A key as it appears in the one-line message: foreign keys may hold newlines or be long."""
    text = key if key.isprintable() else repr(key)
    return text if len(text) <= SHOWN_VALUE_MAX else text[: SHOWN_VALUE_MAX - 3] + "..."


def _show(side: Mapping[str, Any], key: str) -> str:
    if key not in side:
        return ABSENT
    text = repr(side[key])
    return text if len(text) <= SHOWN_VALUE_MAX else text[: SHOWN_VALUE_MAX - 3] + "..."
