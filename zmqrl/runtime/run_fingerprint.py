"""The run fingerprint of this process's config: the settings an actor must share with its learner.

Every role computes it from its own config and spaces when it starts: the learner publishes it
with every weights message and stores it in its checkpoints, an actor or evaluator compares it with
the learner's (zmqrl/transport/fingerprint.py, which only carries and compares the flat map and so
needs neither the config nor the agent registry).

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
* ``actor.rollout_length``: on-policy agents only, the steps of every rollout on the wire (a
  learner refuses rollouts of any other length).

The map is plain msgpack data (strings, ints, finite floats, bools, short lists of those) so a
client in another language can build and compare it; docs/protocol.md lists the keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from zmqrl.agents.registry import get_agent
from zmqrl.config import Config
from zmqrl.spec import SampleSpec
from zmqrl.transport.wire import MAX_STRING, Fingerprint, FingerprintScalar, FingerprintValue

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
    if spec.obs_entries:  # Dict observations: each key's dtype and shape (plain runs keep their fingerprint)
        out["obs.keys"] = [f"{e.key} {e.dtype} {list(e.shape)}" for e in spec.obs_entries]
    out["action.shape"] = list(spec.action_shape)
    out["action.dtype"] = spec.action_dtype
    if spec.num_actions is not None:
        out["action.n"] = int(spec.num_actions)
    if spec.action_mask:  # only then: unmasked runs keep the fingerprint they always had
        out["action.mask"] = True
    if spec.action_low is not None and spec.action_high is not None:
        out["action.low"] = [_bound(x) for x in _as_tuple(spec.action_low)]
        out["action.high"] = [_bound(x) for x in _as_tuple(spec.action_high)]
    agent = cfg.agent
    # Which agent fields change the acting network or a transition's meaning: the plugin says
    # (those of them its config has; see AgentPlugin.fingerprint_fields).
    plugin = get_agent(agent.kind)
    for name in plugin.fingerprint_fields:
        if hasattr(agent, name):
            out[f"agent.{name}"] = _value(getattr(agent, name))
    if plugin.on_policy:  # every rollout on the wire has exactly this many steps
        out["actor.rollout_length"] = cfg.actor.rollout_length
    return out


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
