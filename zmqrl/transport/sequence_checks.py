"""What a ``"sequences"`` message (R2D2's windows, ``zmqrl.types.SequenceBatch``) must be: its
protocol-fixed columns (once per layout), its layout against the run's spec, and the rules of its
flags (per batch). The value checks it shares with the other kinds (observations within bounds,
actions in range, per-step rewards, the core state's bounds) stay in
:mod:`zmqrl.transport.decoding`, which calls in here, so one reader holds each rule.

Every check raises :class:`~zmqrl.transport.messages.WireError` through ``fail``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.array_checks import is_dtype
from zmqrl.transport.fields import fail, short
from zmqrl.transport.layouts import ArrayDesc
from zmqrl.transport.messages import SamplesMsg
from zmqrl.types import SEQUENCE_BURN_IN, SEQUENCE_FIELDS, SEQUENCE_LEARNED, SequenceBatch, describe

# The step columns after obs, with their dtypes: each (R, L).
_STEP_DTYPES = (("action", "int64"), ("reward", "float32"), ("terminated", "bool"), ("mask", "uint8"))


def check_sequence_columns(descs: list[ArrayDesc]) -> None:
    """The protocol-fixed layout: SEQUENCE_FIELDS in order, R >= 1 windows of L >= 1 positions,
    obs ``[R, L + 1, ...]``, every step column ``[R, L]`` of its dtype, core_state float32
    ``[R, 2, H]`` with H >= 1. What L, H and the obs row must be is the spec's."""
    names = tuple(d.name for d in descs)
    if names != SEQUENCE_FIELDS:
        fail(
            f"sequences arrays must be {list(SEQUENCE_FIELDS)} in that order, got {[short(n) for n in names]}"
        )
    obs, state = descs[0], descs[-1]
    if len(obs.shape) < 2 or obs.shape[0] < 1 or obs.shape[1] < 2:
        fail(f"sequences column 'obs' must be [R, L + 1, ...] with R >= 1 and L >= 1, got {list(obs.shape)}")
    lead = (obs.shape[0], obs.shape[1] - 1)
    for d, (_, dtype) in zip(descs[1:5], _STEP_DTYPES, strict=True):
        if d.shape != lead or d.dtype != dtype:
            fail(f"sequences column {d.name!r} must be {dtype} {list(lead)}, got {d.dtype} {list(d.shape)}")
    if (
        state.dtype != "float32"
        or len(state.shape) != 3
        or state.shape[:2] != (lead[0], 2)
        or state.shape[2] < 1
    ):
        fail(
            f"sequences column 'core_state' must be float32 [R, 2, H >= 1], "
            f"got {state.dtype} {list(state.shape)}"
        )


def check_sequence_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The kind this run trains on (sequences, or not), and the columns against the spec: the
    window's length, the obs row, the core's size, the number of windows. No priorities: the
    learner gives new windows its largest."""
    batch = msg.batch
    if spec.sequence_length is None:
        fail("sequences refused: this run's agent does not learn from sequences (agent.kind r2d2 does)")
    if not isinstance(batch, SequenceBatch):
        fail(f"{'rollouts' if hasattr(batch, 'logp') else 'samples'} refused: this run trains on sequences")
    columns: list[np.ndarray] = []
    for name in SEQUENCE_FIELDS:
        col = getattr(batch, name, None)
        if not isinstance(col, np.ndarray):
            fail(f"sequences column {name!r} is not a numpy array")
        columns.append(col)
    reward = columns[2]
    if reward.ndim != 2:
        fail(f"reward must have shape (R, L), got {reward.shape}")
    rows, length = reward.shape
    if length != spec.sequence_length:
        fail(
            f"windows of {length} positions, this run's have {spec.sequence_length} "
            "(agent.burn_in + agent.sequence_length)"
        )
    if not 1 <= rows <= spec.max_batch:
        fail(f"{rows} windows outside [1, {spec.max_batch}]")
    want: list[tuple[str, tuple[int, ...], str | np.dtype[Any]]] = [
        ("obs", (rows, length + 1, *spec.obs_shape), spec.obs_np_dtype)
    ]
    want += [(name, (rows, length), dtype) for name, dtype in _STEP_DTYPES]
    want.append(("core_state", (rows, 2, spec.core_size), "float32"))
    for (name, shape, dtype), col in zip(want, columns, strict=True):
        if col.shape != shape or not is_dtype(col, dtype):
            expected = dtype if isinstance(dtype, str) else describe(dtype)
            fail(f"{name} is {describe(col.dtype)} {col.shape}, expected {expected} {shape}")
    if msg.priorities is not None:
        fail("sequences carry no priority array")


def check_sequence_flags(batch: SequenceBatch, spec: SampleSpec) -> None:
    """Each window's mask and termination as an actor makes them: mask bytes 0, 1 (burn-in
    positions only) or 2 (after them only); the real positions one unbroken run with at least one
    learned step (a window never crosses an episode's boundary); terminated bool bytes, only on
    the run's last step. A mask 2 in the burn-in would put steps the learner never learns from
    into the counts; a hole would hide a second episode inside a window."""
    mask, terminated = batch.mask, batch.terminated
    burn_in = spec.burn_in
    if (
        mask.size
        and (
            mask[:, :burn_in].max(initial=0) > SEQUENCE_BURN_IN or mask[:, burn_in:] == SEQUENCE_BURN_IN
        ).any()
    ):
        fail("mask is 1 (burn-in) only in the first agent.burn_in positions and 0 or 2 after them")
    if mask.max(initial=0) > SEQUENCE_LEARNED:
        fail("mask values are 0 (padding), 1 (burn-in) or 2 (learned)")
    if not (mask == SEQUENCE_LEARNED).any(axis=1).all():
        fail("every window has at least one learned step (mask 2)")
    real = (mask > 0).astype(np.int8)
    edges = np.diff(real, axis=1, prepend=0, append=0)
    if ((edges == 1).sum(axis=1) != 1).any():
        fail(
            "a window's real steps (mask > 0) are one unbroken run: windows never cross an episode's boundary"
        )
    if terminated.size and terminated.view(np.uint8).max() > 1:
        fail("terminated has bool bytes other than 0 and 1")
    last = edges[:, 1:] == -1  # position t is the run's last real step
    if (terminated & ~last).any():
        fail("terminated is set only on a window's last real step (the episode's end)")
