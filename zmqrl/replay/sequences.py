"""Replay of fixed-length windows with their core state (R2D2): ``SequenceReplay``, one kind that
implements ``zmqrl.core.Replay`` over ``zmqrl.types.SequenceBatch`` rows, uniform or prioritized.

A row is one window (``burn_in + sequence_length`` positions): ``replay.capacity``, sampling,
priorities and snapshots count windows, while ``len``, ``capacity`` and ``total_added`` count the
env steps learned from (``SequenceBatch.size``), as every replay counts its transitions: the
learner compares ``len`` with ``learner.min_replay_size`` and its replay-ratio limiter counts what
was inserted in the same unit, so both mean env steps for every agent (in windows, a limiter that
counts steps inserted would hold the actors back while the trainer still waits for windows).

Prioritized, a window is drawn in proportion to ``(p + eps) ** alpha`` with the bounds of
``zmqrl.replay.priorities`` (the transitions' rules, the same settings), ``p`` the learner's mix of
max and mean |TD error| over the window (``zmqrl.agents.losses.r2d2_loss``); a new window gets the
largest priority the learner has measured. Ids are insertion ordinals, so a priority for a window
overwritten since it was drawn is skipped, as ``PrioritizedReplay`` does.

Every mutation is all-or-nothing: a batch is checked against the spec's shapes and dtypes, and its
weights computed and checked, before the first write; what follows cannot raise.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from zmqrl.core import Sampled
from zmqrl.replay.priorities import (
    BetaSchedule,
    PriorityBounds,
    PriorityTable,
    checked_priorities,
    checked_update,
)
from zmqrl.spec import SampleSpec
from zmqrl.types import SEQUENCE_FIELDS, SEQUENCE_LEARNED, Batch, SequenceBatch

# Ordinal of a slot that never held a window.
_NO_ORDINAL = -1


def sequence_columns(spec: SampleSpec) -> dict[str, tuple[tuple[int, ...], str | np.dtype[Any]]]:
    """Each column's row shape and dtype for the spec's windows."""
    length, core = spec.sequence_length, spec.core_size
    if length is None:
        raise ValueError("a sequence replay needs the spec's sequence_length")
    return {
        "obs": ((length + 1, *spec.obs_shape), spec.obs_np_dtype),
        "action": ((length,), "int64"),
        "reward": ((length,), "float32"),
        "terminated": ((length,), "bool"),
        "mask": ((length,), "uint8"),
        "core_state": ((2, core), "float32"),
    }


def sequence_row_bytes(spec: SampleSpec, prioritized: bool) -> int:
    """Bytes one stored window takes (with its priority bookkeeping)."""
    row = sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in sequence_columns(spec).values()
    )
    return row + (32 if prioritized else 0)


class SequenceReplay:
    """A ring of ``capacity`` windows, drawn uniformly or (``prioritized``) by priority."""

    def __init__(
        self,
        capacity: int,
        spec: SampleSpec,
        seed: int | None = None,
        *,
        prioritized: bool = False,
        bounds: PriorityBounds | None = None,
        beta: BetaSchedule | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._columns = sequence_columns(spec)
        self._length = int(spec.sequence_length or 1) - spec.burn_in  # learned steps of a full window
        self._capacity = capacity
        self._data = {
            name: np.zeros((capacity, *shape), dtype) for name, (shape, dtype) in self._columns.items()
        }
        self.prioritized = prioritized
        self.beta = beta or BetaSchedule()
        # The sum tree, bounds and counters, as prioritized transitions keep them.
        self._priorities = (
            PriorityTable(capacity, bounds or PriorityBounds(), "window") if prioritized else None
        )
        self._ordinal = np.full(capacity, _NO_ORDINAL, np.int64)
        self._next = 0  # ordinal of the next window written (slot: ordinal % capacity)
        self._size = 0  # windows stored
        self._learned = np.zeros(capacity, np.int64)  # each slot's learned steps
        self._steps = 0  # learned steps stored (len)
        self._total_added = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the Replay contract
    def __len__(self) -> int:
        """Learned env steps stored (see the module docstring)."""
        return self._steps

    @property
    def windows(self) -> int:
        """Windows stored."""
        return self._size

    @property
    def capacity(self) -> int:
        """The most learned steps it can hold: every window full."""
        return self._capacity * self._length

    @property
    def nbytes(self) -> int:
        tree = self._priorities.tree.nbytes if self._priorities is not None else 0
        return sum(a.nbytes for a in self._data.values()) + self._ordinal.nbytes + self._learned.nbytes + tree

    @property
    def total_added(self) -> int:
        return self._total_added

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        """Insert windows (oldest overwritten when full). ``priorities``: the actor's raw ones
        ``(R,)``, else each gets the learner's largest. TypeError or ValueError, with nothing
        changed, for a batch that is not windows of this run's shape."""
        rows = self._checked(batch)
        raw = None if priorities is None else checked_priorities(priorities, rows.rows)
        with self._lock:
            self._place_locked(rows, raw, self._next)

    def sample(self, batch_size: int, updates: int = 0) -> Sampled:
        """``batch_size`` windows, with replacement: uniform, or by priority with importance
        weights at ``beta(updates)``."""
        beta = self.beta(updates)
        with self._lock:
            if self._size == 0 or batch_size < 1:
                raise ValueError(f"cannot sample {batch_size} windows from {self._size}")
            if self._priorities is None:
                slots = self._rng.integers(self._size, size=batch_size)
                slots = (self._next - self._size + slots) % self._capacity
                return Sampled(self._gather(slots), None, None, {})
            slots, ids, weights = self._priorities.draw_locked(
                self._rng, batch_size, self._ordinal, self._size, beta
            )
            batch = self._gather(slots)
        metrics = {"per_beta": beta, "per_importance_min": float(weights.min())}
        return Sampled(batch, weights.astype(np.float32), ids, metrics)

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """New raw priorities ``(R,)`` for the windows ``sample`` drew (by id); those overwritten
        since are skipped. ValueError, nothing changed, for bad ids or priorities."""
        if ids is None or self._priorities is None:
            return
        ids, raw = checked_update(ids, td_errors)
        with self._lock:
            self._priorities.update_locked(ids, raw, self._ordinal, self._size)

    def snapshot(self, max_rows: int | None = None) -> SequenceBatch:
        """The newest ``max_rows`` windows (all by default), oldest first, as copies."""
        with self._lock:
            n = self._size if max_rows is None else min(self._size, max(0, max_rows))
            slots = (self._next - n + np.arange(n)) % self._capacity
            return self._gather(slots)

    def restore(self, batch: Any, total_added: int | None = None) -> None:
        """Refill from a ``snapshot``: the windows get the learner's largest priority (re-measured
        when first drawn); ``total_added`` raises the counter to what the saved run had."""
        rows = self._checked(batch)
        with self._lock:
            self._place_locked(rows, None, self._next)
            if total_added is not None:
                self._total_added = max(self._total_added, int(total_added))

    def rng_state(self) -> dict[str, object]:
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, object]) -> None:
        self._rng.bit_generator.state = state

    def stats(self) -> dict[str, float | int]:
        return {} if self._priorities is None else self._priorities.stats()

    # ------------------------------------------------------------------ inside
    def _checked(self, batch: Any) -> SequenceBatch:
        if not isinstance(batch, SequenceBatch):
            raise TypeError(f"a sequence replay holds SequenceBatch windows, not {type(batch).__name__}")
        rows = batch.reward.shape[0] if batch.reward.ndim else -1
        for name, column in zip(SEQUENCE_FIELDS, batch, strict=True):
            shape, dtype = self._columns[name]
            if not isinstance(column, np.ndarray) or column.shape != (rows, *shape) or column.dtype != dtype:
                got = f"{getattr(column, 'dtype', type(column).__name__)} {getattr(column, 'shape', '')}"
                raise ValueError(f"sequence column {name!r} is {got}, this replay holds {dtype} (R, {shape})")
        return batch

    def _place_locked(self, batch: SequenceBatch, raw: np.ndarray | None, first: int) -> None:
        """Write the windows as ordinals ``first ..`` (the newest ``capacity`` if more)."""
        b, cap = batch.rows, self._capacity
        skip = max(0, b - cap)
        m = b - skip
        if m == 0:
            return
        ordinals = np.arange(first + skip, first + b, dtype=np.int64)
        slots = ordinals % cap
        if self._priorities is not None:  # raises for a bound that overflowed, before any write
            raw = None if raw is None else raw[skip:]
            values, clipped = self._priorities.weights_locked(raw, m, self._size)
        learned = np.count_nonzero(batch.mask[skip:] == SEQUENCE_LEARNED, axis=1)
        # Nothing below raises: shapes and dtypes were checked, the weights too.
        live = self._ordinal[slots] != _NO_ORDINAL
        self._steps += int(learned.sum()) - int(self._learned[slots][live].sum())
        self._learned[slots] = learned
        for name, column in zip(SEQUENCE_FIELDS, batch, strict=True):
            self._data[name][slots] = column[skip:]
        if self._priorities is not None:
            self._priorities.write_locked(slots, values, clipped)
        self._ordinal[slots] = ordinals
        self._next = first + b
        self._size = min(cap, self._size + m)
        self._total_added += int(np.count_nonzero(batch.mask == SEQUENCE_LEARNED))

    def _gather(self, slots: np.ndarray) -> SequenceBatch:
        return SequenceBatch(*(self._data[name][slots] for name in SEQUENCE_FIELDS))
