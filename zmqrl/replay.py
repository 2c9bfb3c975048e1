"""Replay storage for the learner: a preallocated, thread-safe, uniform ring buffer.

The learner's ingest thread adds batches that arrive from actors while its main thread samples
training batches, so both operations take one internal lock. The lock is held only while numpy
copies rows in or out (never across a Python loop over rows), so the two threads contend for
microseconds per call.

Storage is one preallocated array per ``TransitionBatch`` column, sized up front so the learner can
print the eventual footprint (``nbytes``) at start. The OS commits zeroed pages lazily, so resident
memory grows as the buffer fills; a too-large capacity still fails late, but is visible early.
``next_obs`` is stored separately from ``obs`` (no frame sharing), which doubles observation
memory; that is the price of accepting n-step transitions from many actors in any order.
"""

from __future__ import annotations

import threading
from typing import Final

import numpy as np
from numpy.typing import DTypeLike

from zmqrl.types import TransitionBatch

# Dtypes of the scalar columns; fixed by the TransitionBatch contract.
REWARD_DTYPE = np.dtype(np.float32)
DISCOUNT_DTYPE = np.dtype(np.float32)

# Casting allowed when a batch column's dtype differs from the buffer's: same-kind casts
# (int64 -> int32 actions, float64 -> float32 rewards) are harmless, but e.g. float obs into a
# uint8 buffer would silently wrap values, so that is rejected.
_CASTING: Final = "same_kind"


class UniformReplay:
    """Fixed-capacity FIFO ring buffer of transitions with uniform sampling (with replacement).

    Satisfies ``zmqrl.core.ReplayBuffer``. When full, each ``add`` overwrites the oldest rows.
    """

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
        # Column order matches BATCH_FIELDS so that a whole batch can be zipped against it.
        self._columns: tuple[np.ndarray, ...] = (
            np.zeros((capacity, *obs_shape), dtype=np.dtype(obs_dtype)),
            np.zeros((capacity, *action_shape), dtype=np.dtype(action_dtype)),
            np.zeros((capacity,), dtype=REWARD_DTYPE),
            np.zeros((capacity, *obs_shape), dtype=np.dtype(obs_dtype)),
            np.zeros((capacity,), dtype=DISCOUNT_DTYPE),
        )
        # Row shape each column must have (everything after the batch axis), for cheap validation.
        self._row_shapes: tuple[tuple[int, ...], ...] = tuple(c.shape[1:] for c in self._columns)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pos = 0  # next row to write
        self._size = 0  # rows holding data, <= capacity
        self._total_added = 0

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
            return TransitionBatch(*(col[order] for col in self._columns))

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot`` (appended in order, as if just received)."""
        if batch.size:
            self.add(batch)
        if total_added is not None:
            self._total_added = max(self._total_added, total_added)

    def rng_state(self) -> dict[str, object]:
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, object]) -> None:
        self._rng.bit_generator.state = state

    def _validate(self, batch: TransitionBatch) -> int:
        """Check every column's shape (and that its dtype casts safely); return the batch size.

        The learner has already validated wire input, so this only guards against programming
        errors that would otherwise broadcast or cast silently into storage.
        """
        if batch.reward.ndim != 1:
            raise ValueError(f"reward column must be 1-D, got shape {batch.reward.shape}")
        b = int(batch.reward.shape[0])
        for name, col, store, row_shape in zip(
            TransitionBatch._fields, batch, self._columns, self._row_shapes, strict=True
        ):
            if col.shape[0:1] != (b,) or col.shape[1:] != row_shape:
                raise ValueError(f"column {name!r} has shape {col.shape}, expected ({b}, *{row_shape})")
            if not np.can_cast(col.dtype, store.dtype, casting=_CASTING):
                raise ValueError(f"column {name!r} has dtype {col.dtype}, buffer stores {store.dtype}")
        return b

    def add(self, batch: TransitionBatch) -> None:
        """Insert a batch, overwriting the oldest rows when full.

        A batch larger than the capacity keeps only its newest ``capacity`` rows. Each column is
        written with at most two slice copies (before and after the wrap point).
        """
        b = self._validate(batch)
        if b == 0:
            return
        cap = self._capacity
        start = max(0, b - cap)  # rows of the batch that survive
        m = b - start
        with self._lock:
            pos = self._pos
            first = min(m, cap - pos)  # rows that fit before the end of the ring
            rest = m - first
            for store, col in zip(self._columns, batch, strict=True):
                store[pos : pos + first] = col[start : start + first]
                if rest:
                    store[:rest] = col[start + first :]
            self._pos = (pos + m) % cap
            self._size = min(cap, self._size + m)
            self._total_added += b

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
            cols = [c[idx] for c in self._columns]
        return TransitionBatch(*cols)
