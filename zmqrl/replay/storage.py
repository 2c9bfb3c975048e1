"""Replay storage: the preallocated, thread-safe ring buffer (``UniformReplay``) and the
transaction machinery (``Undo``) that every replay kind's adds go through.

The learner's ingest thread adds batches that arrive from actors while its main thread samples
training batches, so both operations take one internal lock. The lock is held only while numpy
copies rows in or out (never across a Python loop over rows), so the two threads contend for
microseconds per call.

Storage is one preallocated array per ``TransitionBatch`` column, sized up front so the learner can
print the eventual footprint (``nbytes``) at start. The OS commits zeroed pages lazily, so resident
memory grows as the buffer fills; a too-large capacity still fails late, but is visible early.
``next_obs`` is stored separately from ``obs``, which doubles observation memory; that is the
price of accepting n-step transitions from many actors in any order. For stacked image frames,
``SharedFramesReplay`` / ``SharedFramesPrioritizedReplay`` (``replay.share_frames``, frames.py)
store each distinct plane once instead, found by content, which needs no ordering either.

Every mutation is all-or-nothing. Input is validated before anything changes, and an add is a
transaction (``Undo``): it saves what it will overwrite (the rows at its slots, the counters, the
sum-tree leaves and ordinals), writes, and either commits or, if anything raised on the way, puts
all of it back, including the frame pool's references, so a failed add leaves the buffer exactly
as it was. Saving costs one extra copy of the overwritten rows. The subclasses (prioritized.py,
frames.py) extend the transaction through the ``_begin_locked`` / ``_commit_locked`` /
``_discard_locked`` / ``_rollback_locked`` hooks rather than writing their own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt
from numpy.typing import DTypeLike

from zmqrl.types import TransitionBatch

# Dtypes of the scalar columns; fixed by the TransitionBatch contract.
REWARD_DTYPE = np.dtype(np.float32)
DISCOUNT_DTYPE = np.dtype(np.float32)

# Casting allowed when a batch column's dtype differs from the buffer's: same-kind casts
# (int64 -> int32 actions, float64 -> float32 rewards) are harmless, but e.g. float obs into a
# uint8 buffer would silently wrap values, so that is rejected.
_CASTING: Final = "same_kind"

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass
class Undo:
    """What one add is about to change, kept until the add has fully succeeded.

    ``_begin_locked`` records it, the add writes, and then either ``_commit_locked`` finishes the
    add (shared frames release the overwritten rows' planes only then) or, if anything raised on
    the way, ``_rollback_locked`` puts every saved value back. A subclass that has more to put back
    records it in its own subclass of ``Undo``, named by its ``_UNDO`` (frames.py's ``FramesUndo``).
    """

    slots: IntArray  # ring slots the add writes
    rows: tuple[np.ndarray, ...]  # each column's contents at ``slots`` before the add
    scalars: dict[str, int]  # the counters named in ``_SCALARS``, before the add
    leaves: FloatArray | None = None  # prioritized: sum-tree leaves at ``slots``
    ordinals: IntArray | None = None  # prioritized: ``_ordinal`` at ``slots``


class UniformReplay:
    """Fixed-capacity FIFO ring buffer of transitions with uniform sampling (with replacement).

    When full, each ``add`` overwrites the oldest rows. ``zmqrl.replay.make_replay`` puts it
    behind the ``zmqrl.core.Replay`` interface (buffers.py).
    """

    # Counters an add may change: saved and restored with the rows (see ``Undo``).
    _SCALARS: ClassVar[tuple[str, ...]] = ("_pos", "_size", "_total_added")
    # What ``_begin_locked`` records an add in: a subclass with more to undo names its own.
    _UNDO: ClassVar[type[Undo]] = Undo

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: DTypeLike,
        action_shape: tuple[int, ...],
        action_dtype: DTypeLike,
        seed: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        obs_shape = tuple(int(d) for d in obs_shape)
        action_shape = tuple(int(d) for d in action_shape)
        # Row shape and dtype each column of an added batch must have, in BATCH_FIELDS order.
        self._row_shapes: tuple[tuple[int, ...], ...] = (obs_shape, action_shape, (), obs_shape, ())
        self._dtypes: tuple[np.dtype[np.generic], ...] = (
            np.dtype(obs_dtype),
            np.dtype(action_dtype),
            REWARD_DTYPE,
            np.dtype(obs_dtype),
            DISCOUNT_DTYPE,
        )
        self._columns: tuple[np.ndarray, ...] = self._allocate(self._capacity)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pos = 0  # next row to write
        self._size = 0  # rows holding data, <= capacity
        self._total_added = 0

    def _allocate(self, capacity: int) -> tuple[np.ndarray, ...]:
        """Storage: one preallocated array per column, in BATCH_FIELDS order."""
        return tuple(
            np.zeros((capacity, *shape), dtype=dtype)
            for shape, dtype in zip(self._row_shapes, self._dtypes, strict=True)
        )

    def _gather_locked(self, rows: np.ndarray) -> TransitionBatch:
        """Copies of the stored rows ``rows`` (ring slots); the caller holds the lock."""
        return TransitionBatch(*(c[rows] for c in self._columns))

    @property
    def capacity(self) -> int:
        """Maximum number of stored transitions."""
        return self._capacity

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes preallocated for all columns (the buffer never grows beyond this)."""
        return sum(c.nbytes for c in self._columns)

    @property
    def total_added(self) -> int:
        """All-time number of transitions passed to ``add``, including overwritten ones."""
        return self._total_added

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch:
        """The stored transitions, oldest first (at most the newest ``max_rows``), as copies: what a
        checkpoint keeps so that a resumed learner does not start from an empty buffer."""
        with self._lock:
            order = (np.arange(self._size) + (self._pos - self._size)) % self._capacity
            if max_rows is not None:
                order = order[max(0, len(order) - max_rows) :]
            return self._gather_locked(order)

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot`` (appended in order, as if just received); ``total_added``
        only raises the counter. One transaction, like ``add``."""
        b = self._validate(batch)
        with self._lock:
            self._insert_locked(batch, b, total_added)

    def rng_state(self) -> dict[str, object]:
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, object]) -> None:
        self._rng.bit_generator.state = state

    def stats(self) -> dict[str, float | int]:
        """Kind-specific counters for reports, read together under the lock (``_stats_locked``)."""
        with self._lock:
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, float | int]:
        """Hook: a plain ring has no counters of its own; subclasses extend ``super()``'s."""
        return {}

    def _validate(self, batch: TransitionBatch) -> int:
        """Check every column's shape (and that its dtype casts safely); return the batch size.

        The learner has already validated wire input, so this only guards against programming
        errors that would otherwise broadcast or cast silently into storage.
        """
        if batch.reward.ndim != 1:
            raise ValueError(f"reward column must be 1-D, got shape {batch.reward.shape}")
        b = int(batch.reward.shape[0])
        for name, col, dtype, row_shape in zip(
            TransitionBatch._fields, batch, self._dtypes, self._row_shapes, strict=True
        ):
            if col.shape[0:1] != (b,) or col.shape[1:] != row_shape:
                raise ValueError(f"column {name!r} has shape {col.shape}, expected ({b}, *{row_shape})")
            if not np.can_cast(col.dtype, dtype, casting=_CASTING):
                raise ValueError(f"column {name!r} has dtype {col.dtype}, buffer stores {dtype}")
        return b

    def add(self, batch: TransitionBatch) -> None:
        """Insert a batch, overwriting the oldest rows when full.

        A batch larger than the capacity keeps only its newest ``capacity`` rows. Each column is
        written with at most two slice copies (before and after the wrap point).
        """
        b = self._validate(batch)
        if b == 0:
            return
        with self._lock:
            self._insert_locked(batch, b, None)

    def _insert_locked(self, batch: TransitionBatch, b: int, total_floor: int | None) -> None:
        """Append the batch's newest ``capacity`` rows at ``_pos`` as one transaction."""
        cap = self._capacity
        start = max(0, b - cap)  # rows of the batch that survive
        m = b - start
        pos = self._pos
        undo = self._begin_locked((pos + np.arange(m)) % cap)
        try:
            if m:
                self._write_rows_locked(batch, start, pos, undo)
            self._pos = (pos + m) % cap
            self._size = min(cap, self._size + m)
            self._total_added += b
            if total_floor is not None:
                self._total_added = max(self._total_added, total_floor)
            self._commit_locked(undo)
        except BaseException:
            self._rollback_locked(undo)
            raise

    # ------------------------------------------------------------------ transactions
    def _begin_locked(self, slots: IntArray) -> Undo:
        """Save what an add writing ``slots`` will change."""
        return self._UNDO(
            slots=slots,
            rows=tuple(c.take(slots, axis=0) for c in self._columns),  # take: ~2x faster than c[slots]
            scalars={name: getattr(self, name) for name in self._SCALARS},
        )

    def _rollback_locked(self, undo: Undo) -> None:
        """Put back everything ``undo`` saved: the buffer is as it was before the add began."""
        for store, old in zip(self._columns, undo.rows, strict=True):
            store[undo.slots] = old
        for name, value in undo.scalars.items():
            setattr(self, name, value)
        self._discard_locked(undo)

    def _commit_locked(self, undo: Undo) -> None:
        """Hook: the last step of a successful add (shared frames release overwritten planes)."""

    def _discard_locked(self, undo: Undo) -> None:
        """Hook: undo a failed add's effects outside the columns (shared frames: interned planes)."""

    def _write_rows_locked(self, batch: TransitionBatch, start: int, pos: int, undo: Undo) -> None:
        """Copy rows ``batch[start:]`` (at most ``capacity``) into the ring from slot ``pos`` on,
        wrapping once; the caller holds the lock and updates ``_pos``/``_size``/counters."""
        cap = self._capacity
        m = batch.size - start
        first = min(m, cap - pos)  # rows that fit before the end of the ring
        rest = m - first
        for store, col in zip(self._columns, batch, strict=True):
            store[pos : pos + first] = col[start : start + first]
            if rest:
                store[:rest] = col[start + first :]

    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` transitions drawn uniformly with replacement; the arrays are copies.

        Raises ValueError when the buffer is empty or ``batch_size`` < 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty replay buffer")
            idx = self._rng.integers(0, self._size, size=batch_size)
            # Rows 0..size-1 are exactly the stored rows: the ring fills from 0 and never shrinks.
            return self._gather_locked(idx)
