"""The run fingerprint: the settings an actor must share with its learner, as one flat map.

A learner trains on whatever arrives that passes wire validation. An actor started by hand with
another ``agent.n_step`` or ``agent.gamma`` sends batches of the right shapes whose rewards and
discounts mean something else, and the learner's targets are silently wrong. So the learner
publishes this map with every weights message, and an actor compares it with its own before it
imports anything: a mismatch ends the actor (exit 2) with one line naming the keys.

What is in it, and why (everything else may differ between the two sides):

* ``env.*``: the env id, its kwargs and the preprocessing settings that change what a transition
  means (frame skip, reward clipping, life-loss terminals, frame size and stack).
  ``env.max_episode_steps`` and ``env.atari.noop_max`` are left out: truncation and start states
  do not change the learner's target.
* ``obs.*`` / ``action.*``: the spaces, as the learner's :class:`SampleSpec` sees them (shape,
  dtype, number of discrete actions, continuous bounds).
* ``agent.*``: the kind, the acting network's sizes (the fields that change its parameters: each
  agent plugin's ``fingerprint_fields``), and the actors' n-step processor (``n_step``,
  ``gamma``). Optimiser and target-network settings live only on the learner and are left out.

The map is plain msgpack data (strings, ints, finite floats, bools, short lists of those) so a
client in another language can build and compare it; docs/protocol.md lists the keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zmqrl.agents.registry import get_agent
from zmqrl.errors import ConfigError
from zmqrl.spec import SampleSpec
from zmqrl.transport.wire import MAX_STRING, Fingerprint, FingerprintScalar, FingerprintValue

if TYPE_CHECKING:
    from zmqrl.config import Config

# Atari preprocessing settings that change observations, rewards or dynamics (not noop_max).
ATARI_FIELDS = (
    "frame_skip",
    "screen_size",
    "grayscale",
    "frame_stack",
    "terminal_on_life_loss",
    "clip_rewards",
)

# env.kwargs longer than this as canonical JSON are sent as a digest, to stay within MAX_STRING.
KWARGS_TEXT_MAX = 200

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


def run_fingerprint(cfg: Config, spec: SampleSpec) -> Fingerprint:
    """The flat map of settings that must agree between a learner and its actors."""
    out: Fingerprint = {
        "env.id": cfg.env.id,
        "env.kwargs": _kwargs_text(cfg.env.kwargs),
        "env.preprocess": cfg.env.preprocess,
    }
    if cfg.env.preprocess == "atari":
        for name in ATARI_FIELDS:
            out[f"env.atari.{name}"] = _value(getattr(cfg.env.atari, name))
    out["obs.shape"] = list(spec.obs_shape)
    out["obs.dtype"] = spec.obs_dtype
    out["action.shape"] = list(spec.action_shape)
    out["action.dtype"] = spec.action_dtype
    if spec.num_actions is not None:
        out["action.n"] = int(spec.num_actions)
    if spec.action_low is not None and spec.action_high is not None:
        out["action.low"] = [_bound(x) for x in _as_tuple(spec.action_low)]
        out["action.high"] = [_bound(x) for x in _as_tuple(spec.action_high)]
    agent = cfg.agent
    # Which agent fields change the acting network or a transition's meaning: the plugin says
    # (those of them its config has; see AgentPlugin.fingerprint_fields).
    for name in get_agent(agent.kind).fingerprint_fields:
        if hasattr(agent, name):
            out[f"agent.{name}"] = _value(getattr(agent, name))
    return out


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


def _value(value: Any) -> FingerprintValue:
    """A config value as a fingerprint value: scalars as they are, sequences as lists."""
    if isinstance(value, (list, tuple)):
        return [_scalar(v) for v in value]
    return _scalar(value)


def _scalar(value: Any) -> FingerprintScalar:
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)[:MAX_STRING]


def _as_tuple(bounds: float | tuple[float, ...]) -> tuple[float, ...]:
    return bounds if isinstance(bounds, tuple) else (bounds,)


def _bound(x: float) -> FingerprintScalar:
    """Finite bounds as floats; +-inf as the strings "inf" / "-inf" (the wire carries finite floats only)."""
    if math.isfinite(x):
        return float(x)
    return "inf" if x > 0 else "-inf"


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    """``env.kwargs`` as canonical JSON (sorted keys, no spaces), or ``sha256:<hex>`` of it if long."""
    text = json.dumps(dict(kwargs), sort_keys=True, separators=(",", ":"), default=str)
    if len(text) <= KWARGS_TEXT_MAX:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _key(key: str) -> str:
    """A key as it appears in the one-line message: foreign keys may hold newlines or be long."""
    text = key if key.isprintable() else repr(key)
    return text if len(text) <= SHOWN_VALUE_MAX else text[: SHOWN_VALUE_MAX - 3] + "..."


def _show(side: Mapping[str, Any], key: str) -> str:
    if key not in side:
        return ABSENT
    text = repr(side[key])
    return text if len(text) <= SHOWN_VALUE_MAX else text[: SHOWN_VALUE_MAX - 3] + "..."
