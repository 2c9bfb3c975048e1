"""Dict observations as records: one numpy structured row per observation, one field per key.

A ``gymnasium.spaces.Dict`` of Box entries (an image beside a vector, say) becomes, at the env's
edge (``zmqrl.envs.records``), one *record* per observation: a numpy structured array whose fields
are the keys, each in its own dtype and shape (a uint8 image stays bytes, a float32 vector stays
float32). Why records rather than a dict of arrays: every part that only moves observation rows
around (the actor's n-step windows, rollouts and sequences, replay and its shared memory, the
rollout queue, sampling) indexes, stacks and copies records as it does plain arrays, with no code
of its own. The parts that look inside an observation are few and key-aware: the wire carries one
array per key (``obs.<key>``, each checked against its own bounds), replay snapshots store one
array per key, and the networks read each key through their own encoder. Towards torch a batch of
records crosses as its bytes (:func:`as_bytes`, a ``(..., itemsize)`` uint8 view, zero-copy) and
the network takes the fields back out (``zmqrl.agents.keyed``), so staging, CUDA-graph buffers and
device copies move one tensor, as they do for any other observation.

The record is aligned (``align=True``): each field starts at a multiple of its own size, so a
field of the bytes can be viewed as its dtype without a copy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# What a Dict observation's keys may be called: they name wire columns (``obs.<key>``) and
# parameters (``torso.<key>.*``), so they are plain identifiers of bounded length.
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Most keys one Dict observation may have (each is a wire column of obs and of next_obs).
MAX_KEYS = 16
# ``SampleSpec.obs_dtype`` of a run whose observations are records.
RECORD = "record"


@dataclass(frozen=True)
class ObsEntry:
    """One key of a Dict observation: its shape, dtype and declared bounds (as ``SampleSpec``
    takes them for a plain observation: a scalar or one per component, flattened; None: none)."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    low: float | tuple[float, ...] | None = None
    high: float | tuple[float, ...] | None = None


def check_key(key: Any) -> str:
    """``key`` if it may name a Dict observation's entry; ValueError saying why not."""
    if type(key) is not str or not KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"a Dict observation's key must be an identifier of at most 64 characters "
            f"([A-Za-z_][A-Za-z0-9_]*), got {key!r}"
        )
    return key


def record_dtype(entries: Sequence[ObsEntry]) -> np.dtype[Any]:
    """The records' numpy dtype: one field per entry, in order, aligned."""
    return np.dtype([(e.key, e.dtype, e.shape) for e in entries], align=True)


def is_record(arr: Any) -> bool:
    """Whether ``arr`` is an array of records (a structured dtype)."""
    return isinstance(arr, np.ndarray) and arr.dtype.names is not None


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """Records ``(*lead,)`` as their bytes ``(*lead, itemsize)`` uint8, zero-copy where the array
    is C-contiguous (a copy otherwise); any other array as it is. What crosses to torch."""
    if arr.dtype.names is None:
        return arr
    lead = arr.shape
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8).reshape(*lead, arr.dtype.itemsize)


def from_bytes(raw: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """The inverse of :func:`as_bytes`: ``(*lead, itemsize)`` uint8 as records of ``dtype``."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.shape[-1:] != (dtype.itemsize,):
        raise ValueError(f"record bytes must end in {dtype.itemsize}, got shape {raw.shape}")
    return raw.view(dtype).reshape(raw.shape[:-1])


def to_records(
    obs: Mapping[str, Any], dtype: np.dtype[Any], lead: tuple[int, ...] | None = None
) -> np.ndarray:
    """Records of ``dtype`` from a Dict observation (``{key: array}``), one or a batch: ``lead``
    the leading dims (None: inferred from the first key's array against its field's shape).
    ValueError when a key is missing or extra or an array does not fit its field."""
    names = dtype.names or ()
    if set(obs) != set(names):
        raise ValueError(f"a Dict observation must have the keys {list(names)}, got {sorted(map(str, obs))}")
    if lead is None:
        first = np.asarray(obs[names[0]])
        field_shape = dtype.fields[names[0]][0].shape  # type: ignore[index]
        extra = first.ndim - len(field_shape)
        if extra < 0 or first.shape[extra:] != field_shape:
            raise ValueError(
                f"key {names[0]!r} must be {list(field_shape)} (or a batch of them), got {list(first.shape)}"
            )
        lead = first.shape[:extra]
    out = np.empty(lead, dtype)
    for name in names:
        value = np.asarray(obs[name])
        field_shape = dtype.fields[name][0].shape  # type: ignore[index]
        if value.shape != (*lead, *field_shape):
            raise ValueError(f"key {name!r} must be {list((*lead, *field_shape))}, got {list(value.shape)}")
        out[name] = value
    return out


def field_layout(dtype: np.dtype[Any]) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
    """``(key, dtype name, shape, byte offset)`` of each field, in order: where a record's bytes
    hold each key (what the torch side reads them with)."""
    out = []
    for name in dtype.names or ():
        sub, offset = dtype.fields[name][:2]  # type: ignore[index]
        out.append((name, sub.base.name, tuple(sub.shape), int(offset)))
    return tuple(out)


def describe(dtype: np.dtype[Any]) -> str:
    """A dtype as errors name it: ``float32``, or ``record {image: uint8 [1, 7, 7], goal: float32 [2]}``."""
    if dtype.names is None:
        return dtype.name
    return (
        "record {"
        + ", ".join(f"{key}: {kind} {list(shape)}" for key, kind, shape, _ in field_layout(dtype))
        + "}"
    )
