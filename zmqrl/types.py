"""Plain data that crosses module boundaries: transition batches, rollouts, weights, episode stats.

These are NamedTuples rather than dicts so that a misspelt column is an AttributeError at the
point of use, not a silent KeyError three processes away.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class TransitionBatch(NamedTuple):
    """A column-major batch of n-step transitions, as stored in replay and sent on the wire.

    The learner's bootstrap target is ``reward + discount * V(next_obs)``: ``discount`` already
    folds in both the n-step horizon (``gamma ** k`` for a window of k real steps) and termination
    (0 when the episode terminated inside the window), so the learner never needs ``n`` or ``gamma``.
    """

    obs: np.ndarray  # (B, *obs_shape), the env's observation dtype
    action: np.ndarray  # (B,) int64 for discrete actions; (B, act_dim) float32 for continuous
    reward: np.ndarray  # (B,) float32: sum_{i<k} gamma**i * r_{t+i}
    next_obs: np.ndarray  # (B, *obs_shape): the observation k steps later
    discount: np.ndarray  # (B,) float32: gamma**k, or 0.0 if the episode terminated in the window

    @property
    def size(self) -> int:
        """Number of transitions (``len()`` would count the five columns: it is a tuple)."""
        return int(self.reward.shape[0])


# Column names in wire order; the wire format and replay buffer both iterate this.
BATCH_FIELDS: tuple[str, ...] = TransitionBatch._fields


class RolloutBatch(NamedTuple):
    """R fixed-length on-policy rollouts of T steps, one row per (sub-)env: what an on-policy actor
    sends and the learner's rollout queue holds (no replay; see ``zmqrl.agents.appo``).

    Steps are stored as they happened, with the episode boundaries marked: after a step that
    ``terminated`` or was ``truncated``, the next observation of the row is the new episode's first.
    A terminated step bootstraps nothing; a truncated one bootstraps from the observation the
    episode was cut at, which the reset replaced in ``obs``: those are ``final_obs``, one per
    truncated step in row-major order (``final_obs[k]`` belongs to the k-th True of
    ``truncated.reshape(-1)``). A step is never both: termination wins and the actor sends it as
    terminated only.

    A recurrent policy's rollouts (``agent.core: lstm``) also carry ``core_state``: each row's
    LSTM state ``(h, c)`` before its first step, which the learner unrolls the row from (zeroing
    it after every done step, as the actor did). None for a feed-forward policy.
    """

    obs: np.ndarray  # (R, T + 1, *obs_shape): obs[:, t] acted on at step t; obs[:, T] bootstraps the row
    action: np.ndarray  # (R, T) int64 for discrete actions; (R, T, act_dim) float32 for continuous
    reward: np.ndarray  # (R, T) float32: the env's reward of each step
    terminated: np.ndarray  # (R, T) bool: the episode ended at this step (no bootstrap)
    truncated: np.ndarray  # (R, T) bool: the episode was cut at this step (bootstrap from final_obs)
    logp: np.ndarray  # (R, T) float32: log-probability of the action under the policy that acted
    final_obs: np.ndarray  # (K, *obs_shape): the observation each truncated step was cut at
    core_state: np.ndarray | None = None  # (R, 2, H) float32: h, c before step 0 (recurrent only)

    @property
    def rows(self) -> int:
        """Rollouts in the batch (R)."""
        return int(self.reward.shape[0])

    @property
    def length(self) -> int:
        """Steps per rollout (T)."""
        return int(self.reward.shape[1]) if self.reward.ndim == 2 else 0

    @property
    def size(self) -> int:
        """Env transitions (R * T): what counters, replay ratios and env-step axes count, as a
        ``TransitionBatch``'s size counts its transitions."""
        return int(self.reward.size)


# Column names in wire order of a rollouts message; a recurrent run's message adds CORE_STATE_FIELD
# after them.
ROLLOUT_FIELDS: tuple[str, ...] = RolloutBatch._fields[:7]
CORE_STATE_FIELD = "core_state"


def rollout_columns(batch: RolloutBatch) -> list[np.ndarray]:
    """The batch's arrays in wire order: ``ROLLOUT_FIELDS``, then ``core_state`` if it has one."""
    columns = list(batch[:7])
    if batch.core_state is not None:
        columns.append(batch.core_state)
    return columns


class SequenceBatch(NamedTuple):
    """R fixed-length windows of one episode each, with the recurrent core's state at each window's
    start: what a recurrent replay actor (R2D2, ``agent.kind: r2d2``) sends and its replay holds.

    A window has L = burn_in + T positions. Windows of an episode start every T steps, the first at
    step ``-burn_in``, so consecutive windows overlap by ``burn_in`` steps and every step of the
    episode is learned from in exactly one window (at its positions ``>= burn_in``). Positions that
    lie outside the episode are padding: a window never crosses an episode boundary, so the learner
    unrolls it from ``core_state`` without resets. ``mask`` says what each position is: 0 padding
    (its obs a copy of the nearest real one, so every obs is one the env can produce), 1 a step
    that only warms the state (burn-in), 2 a step learned from. ``obs`` has one more position: the
    observation after the window's last step (the next window's, or the episode's final one,
    which a truncated episode bootstraps from).
    """

    obs: np.ndarray  # (R, L + 1, *obs_shape): obs[:, t] acted on at position t; obs[:, L] follows the last
    action: np.ndarray  # (R, L) int64: the action taken at each position (0 on padding)
    reward: np.ndarray  # (R, L) float32: the env's reward of each step (0 on padding)
    terminated: np.ndarray  # (R, L) bool: the episode terminated at this step (its last real one)
    mask: np.ndarray  # (R, L) uint8: 0 padding, 1 burn-in, 2 learned (see the class docstring)
    core_state: np.ndarray  # (R, 2, H) float32: the core's (h, c) before the window's first real step

    @property
    def rows(self) -> int:
        """Windows in the batch (R)."""
        return int(self.reward.shape[0])

    @property
    def size(self) -> int:
        """Env steps learned from (mask 2): each step of an episode is learned in one window only,
        so this counts env transitions as a ``TransitionBatch``'s size does (counters, env-step axes)."""
        return int(np.count_nonzero(self.mask == SEQUENCE_LEARNED))


# Column names in wire order of a sequences message (replay snapshots store them so too).
SEQUENCE_FIELDS: tuple[str, ...] = SequenceBatch._fields
# SequenceBatch.mask's values.
SEQUENCE_PADDING, SEQUENCE_BURN_IN, SEQUENCE_LEARNED = 0, 1, 2

# What an actor sends and a learner trains on: n-step transitions (replay), rollouts (on-policy) or
# sequences (recurrent replay).
Batch = TransitionBatch | RolloutBatch | SequenceBatch


class Weights(NamedTuple):
    """A versioned snapshot of the acting network: what the learner publishes to actors."""

    version: int  # strictly increasing per run; 0 means "initial, never published"
    arrays: dict[str, np.ndarray]  # parameter name -> array (float32, C-contiguous)


class EpisodeStat(NamedTuple):
    """One finished training episode, reported by the actor that played it."""

    ret: float  # undiscounted return
    length: int  # env steps


# --------------------------------------------------------------------------------------------
# Dict observations as records
# --------------------------------------------------------------------------------------------
# Dict observations as records: one numpy structured row per observation, one field per key.
#
# A ``gymnasium.spaces.Dict`` of Box entries (an image beside a vector, say) becomes, at the env's
# edge (``zmqrl.envs.records``), one *record* per observation: a numpy structured array whose fields
# are the keys, each in its own dtype and shape (a uint8 image stays bytes, a float32 vector stays
# float32). Why records rather than a dict of arrays: every part that only moves observation rows
# around (the actor's n-step windows, rollouts and sequences, replay and its shared memory, the
# rollout queue, sampling) indexes, stacks and copies records as it does plain arrays, with no code
# of its own. The parts that look inside an observation are few and key-aware: the wire carries one
# array per key (``obs.<key>``, each checked against its own bounds), replay snapshots store one
# array per key, and the networks read each key through their own encoder. Towards torch a batch of
# records crosses as its bytes (:func:`as_bytes`, a ``(..., itemsize)`` uint8 view, zero-copy) and
# the network takes the fields back out (``zmqrl.agents.keyed_nets``), so staging, CUDA-graph buffers and
# device copies move one tensor, as they do for any other observation.
#
# The record is aligned (``align=True``): each field starts at a multiple of its own size, so a
# field of the bytes can be viewed as its dtype without a copy.

# What a Dict observation's keys may be called: they name wire columns (``obs.<key>``) and
# parameters (``torso.<key>.*``), so they are plain identifiers of bounded length.
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The key of a Dict observation's legal actions, as the convention names it (PettingZoo's classic
# games, many board and text envs): beside several other keys it travels as a field of the records
# (``SampleSpec.action_mask``), which the agents and the decoder read by this name.
ACTION_MASK_KEY = "action_mask"
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


def as_mask_flags(obs: Mapping[str, Any]) -> dict[str, Any]:
    """``obs`` (a masked Dict observation, one or a batch) with its mask as uint8 0/1 flags, as
    ``zmqrl.envs.action_masks.mask_space`` declares them (an env's int8, bool or float mask
    alike); without one, as is."""
    if ACTION_MASK_KEY not in obs:
        return dict(obs)
    flags = (np.asarray(obs[ACTION_MASK_KEY]) != 0).astype(np.uint8)
    return {key: flags if key == ACTION_MASK_KEY else value for key, value in obs.items()}


def records_batch(obs: Any, dtype: np.dtype[Any]) -> tuple[np.ndarray, bool]:
    """What a deployed policy is given, as the records batch ``(B,)`` of ``dtype`` it acts on, and
    whether it was one observation: the env's Dict (``{key: array}``, one or a batch; an
    ``action_mask`` as any 0/1 array) or records (one or ``(B,)``, fields read by name).
    ValueError naming the keys for anything else."""
    names = list(dtype.names or ())
    if isinstance(obs, Mapping):
        records = to_records(as_mask_flags(obs), dtype)
    else:
        given = np.asarray(obs)
        if given.dtype.names is None or set(given.dtype.names) != set(names):
            raise ValueError(
                f"takes a Dict observation with the keys {names} ({{key: array}}, or records), "
                f"got a {describe(given.dtype)} array"
            )
        records = to_records({key: given[key] for key in names}, dtype, given.shape)
    if records.ndim > 1:
        raise ValueError(f"takes one observation or a batch (B,) of them, got records shaped {records.shape}")
    single = records.ndim == 0
    return (records[None] if single else records), single

