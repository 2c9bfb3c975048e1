"""What the decoder checks once per layout: array descriptors, the protocol's columns of each
experience kind, and a samples or rollouts message's structure against the run's spec.

A peer sends the same few layouts (names, dtypes, shapes) over and over, one per batch size, so
:mod:`zmqrl.transport.decoding` caches each layout that passed and calls in here only for one it
has not seen: what runs for every message stays in the decoder, what runs once per layout is
here. Everything raises :class:`~zmqrl.transport.messages.WireError` through ``fail``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from zmqrl.spec import ALLOWED_DTYPES, MAX_NDIM, SampleSpec
from zmqrl.transport.array_checks import is_dtype
from zmqrl.transport.fields import (
    LE_DTYPES,
    MAX_ARRAYS,
    MAX_EPISODES,
    MAX_MESSAGE_BYTES,
    fail,
    py_int,
    short,
    str_field,
)
from zmqrl.transport.header import DESCRIPTOR_KEYS, check_keys
from zmqrl.transport.messages import PRIORITY_FIELD, SamplesMsg
from zmqrl.types import BATCH_FIELDS, CORE_STATE_FIELD, ROLLOUT_FIELDS, RolloutBatch, SequenceBatch, describe


class ArrayDesc(NamedTuple):
    """One validated array descriptor from a header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


# --------------------------------------------------------------------------------------------
# Descriptors and the protocol's columns (any run)
# --------------------------------------------------------------------------------------------


def check_descriptors(arrays: list[Any]) -> list[ArrayDesc]:
    """The "arrays" list of a header (a list already): each descriptor's exact keys, a known
    dtype, a bounded shape, and every array's exact byte length, the total bounded."""
    if len(arrays) > MAX_ARRAYS:
        fail(f"too many arrays: {len(arrays)} > {MAX_ARRAYS}")
    out: list[ArrayDesc] = []
    total = 0
    for i, d in enumerate(arrays):
        if type(d) is not dict:
            fail(f"array descriptor {i} must be a map, got {short(d)}")
        check_keys(d, DESCRIPTOR_KEYS, f"array descriptor {i}")
        name = str_field(d["name"], f"array {i} name")
        dtype = d["dtype"]
        if type(dtype) is not str or dtype not in ALLOWED_DTYPES:
            fail(f"array {name!r}: dtype {short(dtype)} not allowed")
        shape = d["shape"]
        if type(shape) is not list:
            fail(f"array {name!r}: shape must be a list, got {short(shape)}")
        if len(shape) > MAX_NDIM:
            fail(f"array {name!r}: {len(shape)} dimensions > {MAX_NDIM}")
        # Python ints cannot overflow, and each dim is capped, so this product stays small.
        nbytes = LE_DTYPES[dtype].itemsize
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= MAX_MESSAGE_BYTES:
                fail(f"array {name!r}: bad dimension {short(dim)}")
            nbytes *= dim
        total += nbytes
        if total > MAX_MESSAGE_BYTES:
            fail(f"arrays larger than {MAX_MESSAGE_BYTES} bytes in total")
        out.append(ArrayDesc(name, dtype, tuple(shape), nbytes))
    return out


def check_sample_columns(descs: list[ArrayDesc]) -> None:
    """The protocol-fixed part of a samples message's layout (the spec-dependent part is later)."""
    names = tuple(d.name for d in descs)
    if names not in (BATCH_FIELDS, (*BATCH_FIELDS, PRIORITY_FIELD)):
        fail(
            f"samples arrays must be {list(BATCH_FIELDS)} (optionally then {PRIORITY_FIELD!r}) in that order,"
            f" got {[short(n) for n in names]}"
        )
    lead = None
    for d in descs:
        if not d.shape:
            fail(f"samples column {d.name!r} has no batch dimension")
        if lead is None:
            lead = d.shape[0]
        elif d.shape[0] != lead:
            fail(f"samples column {d.name!r} has {d.shape[0]} rows, expected {lead}")
    for d in (descs[2], descs[4], *descs[5:]):  # reward, discount, priority
        if d.dtype != "float32" or len(d.shape) != 1:
            fail(f"samples column {d.name!r} must be float32 of shape (B,), got {d.dtype} {list(d.shape)}")


def check_rollout_columns(descs: list[ArrayDesc]) -> None:
    """The protocol-fixed part of a rollouts message's layout: R >= 1 rows of T >= 1 steps, every
    step column (R, T, ...) with obs one step longer, and final_obs rows shaped like obs's. What
    T, R and K must be for the run is the spec's (``check_structure``), not the protocol's. A
    recurrent run's message adds ``core_state`` last: float32 [R, 2, H], H >= 1."""
    names = tuple(d.name for d in descs)
    if names not in (ROLLOUT_FIELDS, (*ROLLOUT_FIELDS, CORE_STATE_FIELD)):
        want = f"{list(ROLLOUT_FIELDS)} (and {CORE_STATE_FIELD!r})"
        fail(f"rollouts arrays must be {want} in that order, got {[short(n) for n in names]}")
    if len(descs) > len(ROLLOUT_FIELDS):
        state = descs[-1]
        shape = state.shape
        if state.dtype != "float32" or len(shape) != 3 or shape[0] != descs[0].shape[0] or shape[1:2] != (2,):
            got = f"{state.dtype} {list(shape)}"
            fail(f"rollouts column 'core_state' must be float32 [R, 2, H] (R the rows of obs), got {got}")
        if shape[2] < 1:
            fail("rollouts column 'core_state' must have H >= 1 units")
    obs, final_obs = descs[0], descs[6]
    if len(obs.shape) < 2 or obs.shape[0] < 1 or obs.shape[1] < 2:
        fail(f"rollouts column 'obs' must be [R, T + 1, ...] with R >= 1 and T >= 1, got {list(obs.shape)}")
    lead = (obs.shape[0], obs.shape[1] - 1)
    for d in descs[1:6]:  # action, reward, terminated, truncated, logp
        if d.shape[:2] != lead:
            want = f"[R, T, ...] = {list(lead)} (obs is [R, T + 1, ...])"
            fail(f"rollouts column {d.name!r} is {list(d.shape)}, expected {want}")
    for d, dtype in zip(descs[2:6], ("float32", "bool", "bool", "float32"), strict=True):
        if d.dtype != dtype or len(d.shape) != 2:
            fail(f"rollouts column {d.name!r} must be {dtype} of shape [R, T], got {d.dtype} {list(d.shape)}")
    if (
        final_obs.dtype != obs.dtype
        or len(final_obs.shape) != len(obs.shape) - 1
        or final_obs.shape[1:] != obs.shape[2:]
    ):
        row = "".join(f", {dim}" for dim in obs.shape[2:])
        got = f"{final_obs.dtype} {list(final_obs.shape)}"
        fail(f"rollouts column 'final_obs' must be {obs.dtype} [K{row}] like obs's rows, got {got}")


# --------------------------------------------------------------------------------------------
# A samples message's structure against the run's spec
# --------------------------------------------------------------------------------------------


def check_structure(msg: Any, spec: SampleSpec) -> None:
    """The kind this run trains on, the columns' types, shapes and dtypes against the spec, the
    batch size, and the episode records' count and types (not their values against the spec:
    the decoder's per-message check, which runs for every message, does that)."""
    if not isinstance(msg, SamplesMsg):
        fail(f"expected a samples message, got {type(msg).__name__}")
    for what in ("actor_id", "seq", "weights_version"):
        py_int(getattr(msg, what), what)
    batch = msg.batch
    if spec.sequence_length is not None or isinstance(batch, SequenceBatch):
        pass  # windows: the columns are zmqrl.transport.sequence_checks' (the decoder ran it first)
    elif isinstance(batch, RolloutBatch):
        if spec.rollout_length is None:
            fail("rollouts refused: this run trains on transitions (samples messages), not on rollouts")
        _check_rollout_structure(msg, spec)
    else:
        if (steps := spec.rollout_length) is not None:
            fail(f"samples refused: this run trains on rollouts of {steps} steps, not on transitions")
        _check_transition_structure(msg, spec)
    episodes = msg.episodes
    if len(episodes) > MAX_EPISODES:
        fail(f"too many episodes: {len(episodes)} > {MAX_EPISODES}")
    for ret, length in episodes:
        if isinstance(ret, (bool, np.bool_)) or not isinstance(ret, (int, float, np.number)):
            fail(f"episode return must be a number, got {short(ret)}")
        if py_int(length, "episode length") < 0:
            fail("episode length must be >= 0")


def _columns(batch: Any, names: tuple[str, ...], kind: str) -> list[np.ndarray]:
    cols: list[np.ndarray] = []
    for name in names:
        col = getattr(batch, name, None)
        if not isinstance(col, np.ndarray):
            fail(f"{kind} column {name!r} is not a numpy array")
        cols.append(col)
    return cols


def _check_layout(want: tuple[tuple[str, np.ndarray, tuple[int, ...], str | np.dtype[Any]], ...]) -> None:
    for name, col, shape, dtype in want:
        if col.shape != shape or not is_dtype(col, dtype):
            expected = dtype if isinstance(dtype, str) else describe(dtype)
            fail(f"{name} is {describe(col.dtype)} {col.shape}, expected {expected} {shape}")


def _check_transition_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    obs, action, reward, next_obs, discount = _columns(msg.batch, BATCH_FIELDS, "samples")
    if reward.ndim != 1:
        fail(f"reward must have shape (B,), got {reward.shape}")
    n = reward.shape[0]
    if not 1 <= n <= spec.max_batch:
        fail(f"batch size {n} outside [1, {spec.max_batch}]")
    _check_layout(
        (
            ("obs", obs, (n, *spec.obs_shape), spec.obs_np_dtype),
            ("action", action, (n, *spec.action_shape), spec.action_dtype),
            ("reward", reward, (n,), "float32"),
            ("next_obs", next_obs, (n, *spec.obs_shape), spec.obs_np_dtype),
            ("discount", discount, (n,), "float32"),
        )
    )
    priorities = getattr(msg, "priorities", None)
    if priorities is not None:
        shaped = isinstance(priorities, np.ndarray) and priorities.shape == (n,)
        if not shaped or not is_dtype(priorities, "float32"):
            fail(f"priority must be float32 of shape ({n},)")


def _check_rollout_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    obs, action, reward, terminated, truncated, logp, final_obs = _columns(
        msg.batch, ROLLOUT_FIELDS, "rollouts"
    )
    if reward.ndim != 2:
        fail(f"reward must have shape (R, T), got {reward.shape}")
    rows, steps = reward.shape
    if steps != spec.rollout_length:
        fail(f"rollouts of {steps} steps, this run's have {spec.rollout_length} (actor.rollout_length)")
    if not 1 <= rows <= spec.max_batch:
        fail(f"{rows} rollouts outside [1, {spec.max_batch}]")
    k = final_obs.shape[0] if final_obs.ndim else 0
    _check_layout(
        (
            ("obs", obs, (rows, steps + 1, *spec.obs_shape), spec.obs_np_dtype),
            ("action", action, (rows, steps, *spec.action_shape), spec.action_dtype),
            ("reward", reward, (rows, steps), "float32"),
            ("terminated", terminated, (rows, steps), "bool"),
            ("truncated", truncated, (rows, steps), "bool"),
            ("logp", logp, (rows, steps), "float32"),
            ("final_obs", final_obs, (k, *spec.obs_shape), spec.obs_np_dtype),
        )
    )
    if getattr(msg, "priorities", None) is not None:
        fail("rollouts carry no priority array")
    state = getattr(msg.batch, CORE_STATE_FIELD, None)
    if not spec.core_size:
        if state is not None:
            fail("rollouts with a core_state refused: this run's policy has no recurrent core (agent.core)")
        return
    if state is None:
        fail(f"rollouts without a core_state refused: this run's policy is recurrent ({spec.core_size})")
    if not isinstance(state, np.ndarray):
        fail("rollouts column 'core_state' is not a numpy array")
    _check_layout(((CORE_STATE_FIELD, state, (rows, 2, spec.core_size), "float32"),))
