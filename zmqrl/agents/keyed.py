"""Dict observations in the acting networks: one encoder per key, in numpy. No torch here.

A run whose env observes a ``gymnasium.spaces.Dict`` hands the agents records
(``zmqrl.types``): one structured row per observation, a field per key. The acting table
(``zmqrl.agents.layers.ActingNet``) then has :class:`Field` inputs and its torso becomes keyed:

- each key in order goes through its encoder: a 3-D key ``(C, H, W)`` through the conv torso that
  ``agent.torso`` names (when it names one), its parameters under ``torso.<key>.`` (so
  ``torso.<key>.convs.0.weight``, ``torso.<key>.fc.0.weight``); every other key, and image keys
  under the ``mlp`` torso, is flattened to float32 and has no parameters;
- the encoders' features are concatenated in key order and go through the MLP of
  ``hidden_sizes`` with the net's activation (``torso.0.weight``, ``torso.2.weight``, ...), then
  the heads read it.

Why the MLP after the concatenation for a CNN torso too (a plain CNN run's heads read the CNN's
features directly): without it the heads would be linear in the vector keys and nothing would mix
what the image shows with what the vectors say. The MLP's names are numbered as the plain MLP
torso's, which no key can take (a key is an identifier), and a keyed run under ``mlp`` with no
image key has exactly a plain MLP's parameters: flattening each key and concatenating them in order
is flattening the record's values.

The torch side (``zmqrl.agents.keyed_nets``) reads the same fields out of the records' bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zmqrl.agents.torsos import CONV_TORSOS, ConvTorso, cnn_problem, conv_features
from zmqrl.spec import SampleSpec
from zmqrl.types import ACTION_MASK_KEY, field_layout


@dataclass(frozen=True)
class Field:
    """One key of the records a keyed net reads: its dtype and shape, and where its bytes start in
    a record (``zmqrl.types.field_layout``), which is how the torch side finds it."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        """Values per observation."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes per observation."""
        return self.size * np.dtype(self.dtype).itemsize


def obs_fields(spec: SampleSpec) -> tuple[Field, ...]:
    """The keyed inputs of a Dict observation's spec, in key order; () for a plain observation
    (the tables' way of saying "not keyed")."""
    if not spec.obs_entries:
        return ()
    return tuple(Field(*layout) for layout in field_layout(spec.obs_np_dtype))


def mask_field(fields: tuple[Field, ...]) -> Field | None:
    """The field of a masked run's records that holds the legal actions (``action_mask``), or None.
    The networks keep it beside their inputs: the mask is one of them (the net reads which moves
    are open), and it is also what their outputs obey (``zmqrl.agents.masks.mask_torch``)."""
    return next((f for f in fields if f.key == ACTION_MASK_KEY), None)


def encoder(field: Field, torso: str) -> ConvTorso | None:
    """The conv torso that encodes ``field`` (a 3-D key when ``torso`` names a CNN), or None: the
    key is flattened."""
    conv = CONV_TORSOS.get(torso)
    return conv if conv is not None and len(field.shape) == 3 else None


def encoded_width(fields: tuple[Field, ...], torso: str) -> int:
    """Width of the concatenated encoder features (what the MLP after them reads)."""
    widths = ((conv.hidden if (conv := encoder(f, torso)) else f.size) for f in fields)
    return sum(widths)


def encoder_layout(prefix: str, fields: tuple[Field, ...], torso: str) -> dict[str, tuple[int, ...]]:
    """The encoders' parameters, in key order: a conv torso's under ``<prefix>.<key>``."""
    layout: dict[str, tuple[int, ...]] = {}
    for field in fields:
        if (conv := encoder(field, torso)) is not None:
            layout.update(conv.layout(f"{prefix}.{field.key}", field.shape))
    return layout


def encode(
    arrays: Mapping[str, np.ndarray], obs: np.ndarray, prefix: str, fields: tuple[Field, ...], torso: str
) -> np.ndarray:
    """The concatenated encoder features ``(B, encoded_width)`` float32 of records ``(B,)``."""
    if obs.dtype.names is None:
        raise ValueError(
            f"a keyed network takes records (a Dict observation's keys {[f.key for f in fields]}), "
            f"got a {obs.dtype} array of shape {obs.shape}"
        )
    parts = []
    for field in fields:
        values = obs[field.key]
        if (conv := encoder(field, torso)) is not None:
            parts.append(conv_features(values, dict(arrays), f"{prefix}.{field.key}", conv))
        else:
            parts.append(values.reshape(len(obs), -1).astype(np.float32))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def numpy_cheap(fields: tuple[Field, ...], torso: str) -> bool:
    """Whether every image key's CNN runs cheaply in numpy (what decides numpy acting)."""
    return all(conv.numpy_acting for f in fields if (conv := encoder(f, torso)) is not None)


def torso_problem(torso: str, spec: SampleSpec) -> str | None:
    """Why ``agent.torso`` cannot take this env's observations, or None: a CNN needs (C, H, W)
    frames big enough for its kernels; on a Dict observation, at least one such key, each 3-D key
    big enough. The MLP takes any shape, flattened."""
    if torso not in CONV_TORSOS:
        return None
    fields = obs_fields(spec)
    if not fields:
        return cnn_problem(torso, tuple(spec.obs_shape))
    images = [f for f in fields if len(f.shape) == 3]
    if not images:
        keys = ", ".join(f"{f.key} {list(f.shape)}" for f in fields)
        return (
            f"agent.torso '{torso}' encodes the image keys (C, H, W) of a Dict observation, and this "
            f"env's has none ({keys}): use agent.torso 'mlp'"
        )
    for field in images:
        if problem := cnn_problem(torso, field.shape):
            return f"Dict observation key {field.key!r}: {problem}"
    return None
