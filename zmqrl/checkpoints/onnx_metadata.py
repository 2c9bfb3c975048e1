"""The metadata of a model ``zmqrl export`` writes: its format, written and read side by side so
the two cannot drift apart (what each key holds: docs/export.md).

A model file is data from wherever it came from, as a checkpoint is (:mod:`zmqrl.code_trust`):
every value is read as a string, parsed as strict JSON and checked for type and bounds before use,
and a malformed one raises :class:`OnnxModelError` naming its key. No torch and no onnxruntime here:
the exporter writes with it, :mod:`zmqrl.checkpoints.onnx_policy` reads with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl import strictjson
from zmqrl.checkpoints.onnx_inputs import CORE_INPUTS, CORE_OUTPUTS, InputSpec, graph_inputs, observation_text
from zmqrl.spec import ALLOWED_DTYPES, MAX_CORE_SIZE, SampleSpec
from zmqrl.types import MAX_KEYS, RECORD, ObsEntry, check_key

# The graph's one output; its input is one observation array, or one per key of a Dict
# observation (``onnx_inputs``, which names the one: INPUT).
OUTPUT = "action"
# Names a Dict observation's key cannot have: the graph's output's, and a recurrent graph's state's.
RESERVED_NAMES = (OUTPUT, *CORE_INPUTS, *CORE_OUTPUTS)
# Metadata keys (the model's metadata_props, every value a string): see docs/export.md.
# zmqrl.observation holds {"shape", "dtype"}, or for a Dict observation {KEYS: [{"name", "shape",
# "dtype"}, ...]}: the same format, whose readers before Dict exports refuse the second as malformed.
FORMAT_KEY = "zmqrl.format"
AGENT_KEY = "zmqrl.agent"
OBSERVATION_KEY = "zmqrl.observation"
ACTION_KEY = "zmqrl.action"
ENV_KEY = "zmqrl.env"
FINGERPRINT_KEY = "zmqrl.fingerprint"
WEIGHTS_VERSION_KEY = "zmqrl.weights_version"
CHECKPOINT_KEY = "zmqrl.checkpoint"
# A recurrent policy's LSTM width (its state's inputs and outputs: onnx_inputs.CORE_INPUTS).
CORE_KEY = "zmqrl.core"
# The layout of the graph and its metadata; a reader refuses any other. A recurrent policy's
# graph has its state as inputs and outputs too: format 2, which a reader of format 1 (before
# recurrent exports) refuses with "export format '2'", rather than failing at its first run.
EXPORT_FORMAT = 1
RECURRENT_FORMAT = 2
# zmqrl.observation's list of a Dict observation's keys.
KEYS = "keys"
# Longest metadata value read (the env section and fingerprint are a few hundred bytes).
MAX_METADATA_CHARS = 65536


class OnnxModelError(ValueError):
    """The file is no ONNX model, or not one ``zmqrl export`` wrote; the message says which and why."""


@dataclass(frozen=True)
class ActionSpec:
    """The graph's output: int64 ``(B,)`` actions in ``0..n-1`` (``n`` set), or float32
    ``(B, *shape)`` actions, inside ``low``/``high`` (None where a side has no bound)."""

    dtype: str
    shape: tuple[int, ...]
    n: int | None = None
    low: tuple[float | None, ...] | None = None
    high: tuple[float | None, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if self.n is not None:
            out["n"] = self.n
        if self.low is not None and self.high is not None:
            out["low"], out["high"] = list(self.low), list(self.high)
        return out


@dataclass(frozen=True)
class OnnxMetadata:
    """What an exported model says about itself (the values of its zmqrl.* metadata keys)."""

    agent: str  # the agent.kind it was trained as (dqn, sac, appo, r2d2)
    obs_shape: tuple[int, ...]  # () for a Dict observation (obs_keys)
    obs_dtype: str  # the env's observation dtype: the graph's input type ("record": obs_keys)
    action: ActionSpec
    env: dict[str, Any]  # the config's env section, to build the env it plays
    fingerprint: dict[str, Any]  # the run fingerprint (zmqrl.runtime.run_fingerprint)
    weights_version: int
    checkpoint: str  # the name of the checkpoint file it was exported from
    # A Dict observation's keys (name, shape, dtype; no bounds), one input each, in order; ().
    obs_keys: tuple[ObsEntry, ...] = ()
    core: int = 0  # a recurrent policy's LSTM width (its state: h and c); 0 for none

    @property
    def format(self) -> int:
        return RECURRENT_FORMAT if self.core else EXPORT_FORMAT

    def observation(self) -> dict[str, Any]:
        """The ``zmqrl.observation`` value: the one input's shape and dtype, or each key's."""
        if self.obs_keys:
            return {KEYS: [{"name": e.key, "shape": list(e.shape), "dtype": e.dtype} for e in self.obs_keys]}
        return {"shape": list(self.obs_shape), "dtype": self.obs_dtype}

    def inputs(self) -> list[InputSpec]:
        """The graph's inputs as this metadata describes them (name, dtype, shape after the batch)."""
        return graph_inputs(self.obs_shape, self.obs_dtype, self.obs_keys, self.core)

    def outputs(self) -> list[str]:
        """The graph's outputs: the action, then a recurrent policy's state after the step."""
        return [OUTPUT, *(CORE_OUTPUTS if self.core else ())]

    def observation_text(self) -> str:
        """What the model takes, as messages say it: ``[4] float32``, or each key's dtype and shape."""
        return observation_text(self.obs_shape, self.obs_dtype, self.obs_keys)

    def to_props(self) -> dict[str, str]:
        """The metadata as ONNX metadata_props: every value a string, JSON where it is structured."""
        core = {CORE_KEY: str(self.core)} if self.core else {}
        return {
            FORMAT_KEY: str(self.format),
            **core,
            AGENT_KEY: self.agent,
            OBSERVATION_KEY: strictjson.dumps(self.observation()),
            ACTION_KEY: strictjson.dumps(self.action.to_dict()),
            ENV_KEY: strictjson.dumps(self.env),
            FINGERPRINT_KEY: strictjson.dumps(self.fingerprint),
            WEIGHTS_VERSION_KEY: str(self.weights_version),
            CHECKPOINT_KEY: self.checkpoint,
        }


def action_spec(spec: SampleSpec) -> ActionSpec:
    """The exported graph's output, from the run's spec (continuous bounds as the env declares them)."""
    if spec.num_actions is not None:
        return ActionSpec("int64", (), n=int(spec.num_actions))
    size = math.prod(spec.action_shape)

    def bounds(value: float | tuple[float, ...] | None, default: float) -> tuple[float | None, ...]:
        array = np.broadcast_to(np.asarray(default if value is None else value, np.float64), (size,))
        return tuple(float(x) if math.isfinite(x) else None for x in array.tolist())

    low, high = bounds(spec.action_low, -math.inf), bounds(spec.action_high, math.inf)
    return ActionSpec("float32", tuple(spec.action_shape), low=low, high=high)


# ------------------------------------------------------------------------------------ reading


def read_metadata(props: Mapping[str, str], source: str) -> OnnxMetadata:
    """The model's zmqrl metadata, every value checked; :class:`OnnxModelError` naming the key
    otherwise (nothing in it is imported or called)."""
    if FORMAT_KEY not in props:
        raise OnnxModelError(
            f"{source}: not a zmqrl export (its metadata has no {FORMAT_KEY}); make one with zmqrl export"
        )
    if props[FORMAT_KEY] not in (str(EXPORT_FORMAT), str(RECURRENT_FORMAT)):
        raise OnnxModelError(
            f"{source}: export format {props[FORMAT_KEY][:20]!r}, this zmqrl reads {EXPORT_FORMAT} and "
            f"{RECURRENT_FORMAT}; export the checkpoint again with this version"
        )
    key = ""
    try:
        key = CORE_KEY
        core = _core(props, props[FORMAT_KEY] == str(RECURRENT_FORMAT))
        key = OBSERVATION_KEY
        obs_shape, obs_dtype, obs_keys = _observation(_json(props, key, dict))
        key = ACTION_KEY
        action = _action(_json(props, key, dict))
        key = WEIGHTS_VERSION_KEY
        version = int(_text(props, key))
        key = ENV_KEY
        env = _json(props, key, dict)
        key = FINGERPRINT_KEY
        fingerprint = _json(props, key, dict)
        key = AGENT_KEY
        agent = _text(props, key)
    except (TypeError, ValueError) as exc:
        raise OnnxModelError(f"{source}: malformed zmqrl metadata {key} ({exc})") from None
    return OnnxMetadata(
        agent=agent,
        obs_shape=obs_shape,
        obs_dtype=obs_dtype,
        action=action,
        env=env,
        fingerprint=fingerprint,
        weights_version=version,
        checkpoint=props.get(CHECKPOINT_KEY, "")[:256],
        obs_keys=obs_keys,
        core=core,
    )


def _core(props: Mapping[str, str], recurrent: bool) -> int:
    """The LSTM width a recurrent export (format 2) declares, and that no other does."""
    if not recurrent:
        if CORE_KEY in props:
            raise ValueError(f"set in a format {EXPORT_FORMAT} export, which has no state")
        return 0
    text = _text(props, CORE_KEY)
    if not text.isdigit() or not 1 <= int(text) <= MAX_CORE_SIZE:
        raise ValueError(f"{text[:20]!r} is not a width from 1 to {MAX_CORE_SIZE}")
    return int(text)


def _text(props: Mapping[str, str], key: str) -> str:
    value = props.get(key)
    if not isinstance(value, str):
        raise ValueError("missing")
    if len(value) > MAX_METADATA_CHARS:
        raise ValueError(f"longer than {MAX_METADATA_CHARS} characters")
    return value


def _json(props: Mapping[str, str], key: str, kind: type) -> Any:
    value = json.loads(_text(props, key), parse_constant=_no_constant)  # JSONDecodeError: a ValueError
    if not isinstance(value, kind):
        raise ValueError(f"not a JSON {'object' if kind is dict else kind.__name__}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no strict JSON")


def _observation(data: dict[str, Any]) -> tuple[tuple[int, ...], str, tuple[ObsEntry, ...]]:
    """``(shape, dtype, ())`` of one observation array, or ``((), "record", keys)`` of a Dict
    observation: every key an identifier, listed once, described by its name, shape and dtype alone."""
    if KEYS not in data:
        return _shape(data.get("shape")), _dtype(data.get("dtype")), ()
    items = data[KEYS]
    if set(data) != {KEYS} or not isinstance(items, list) or not 1 <= len(items) <= MAX_KEYS:
        raise ValueError(f"a Dict observation is described by {KEYS!r} alone, a list of 1 to {MAX_KEYS} keys")
    keys: list[ObsEntry] = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"name", "shape", "dtype"}:
            raise ValueError(f"a key is described by its name, shape and dtype alone, got {str(item)[:100]}")
        name = check_key(item["name"])
        if name in (*RESERVED_NAMES, *(e.key for e in keys)):
            raise ValueError(f"key {name!r} is listed twice, or is the name of the graph's state or output")
        try:
            keys.append(ObsEntry(name, _shape(item["shape"]), _dtype(item["dtype"])))
        except ValueError as exc:
            raise ValueError(f"key {name!r}: {exc}") from None
    return (), RECORD, tuple(keys)


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and d >= 1 for d in value) or len(value) > 8:
        raise ValueError(f"shape {value!r} is not a list of positive integers")
    return tuple(value)


def _dtype(value: Any) -> str:
    if value not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {value!r} is not one of {', '.join(sorted(ALLOWED_DTYPES))}")
    return str(value)


def _action(data: dict[str, Any]) -> ActionSpec:
    dtype = _dtype(data.get("dtype"))
    shape = () if data.get("shape") == [] else _shape(data.get("shape"))
    if dtype == "int64":
        n = data.get("n")
        if type(n) is not int or n < 1 or shape != ():
            raise ValueError(f"discrete actions need a positive n and shape [], got {data!r}")
        return ActionSpec(dtype, shape, n=n)
    if dtype != "float32" or not shape:
        raise ValueError(f"actions are int64 or float32 (B, ...), got {dtype} of shape {list(shape)}")
    size = math.prod(shape)
    sides = []
    for side in ("low", "high"):
        values = data.get(side)
        if not isinstance(values, list) or len(values) != size:
            raise ValueError(f"action {side} must list {size} bounds")
        if not all(v is None or (type(v) in (int, float) and math.isfinite(v)) for v in values):
            raise ValueError(f"action {side} holds something other than numbers and null")
        sides.append(tuple(None if v is None else float(v) for v in values))
    return ActionSpec(dtype, shape, low=sides[0], high=sides[1])
