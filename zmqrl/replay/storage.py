"""Replay's ring: what every replay kind shares (``Ring``, ``DenseRows``) and ``UniformReplay``.

The learner's ingest thread adds batches that arrive from actors while its main thread samples
training batches, so both operations take one internal lock. The lock is held only while numpy
copies rows in or out (never across a Python loop over rows), so the two threads contend for
microseconds per call.

Rows live in one preallocated array per ``TransitionBatch`` column (``DenseRows``), sized up front
so the learner can print the eventual footprint (``nbytes``) at start. The OS commits zeroed pages
lazily, so resident memory grows as the buffer fills. ``next_obs`` is stored separately from
``obs``, which doubles observation memory; that is the price of accepting n-step transitions from
many actors in any order. For stacked image frames, ``replay.share_frames`` (frames.py) stores
each distinct plane once instead, found by content, which needs no ordering either.

Every mutation is all-or-nothing, by checking before writing rather than by saving an undo copy:
an add first checks everything that can fail (the batch's type, every column's shape and dtype,
priorities) and converts each column to the stored dtype, then stages what needs staging
(``DenseRows.stage``: nothing; shared frames intern their planes, all or nothing across their frame
pools), and only then writes. The write copies same-dtype arrays into preallocated ones, sets the
sum tree's leaves to values already checked, and moves counters: nothing in it can raise, so once
it starts the add completes. A failed add therefore never reaches the first write.
"""

from __future__ import annotations

import threading
from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.typing import DTypeLike

from zmqrl.core import Sampled
from zmqrl.types import Batch, TransitionBatch

# Dtypes of the scalar columns; fixed by the TransitionBatch contract.
REWARD_DTYPE = np.dtype(np.float32)
DISCOUNT_DTYPE = np.dtype(np.float32)

# Casting allowed when a batch column's dtype differs from the buffer's: same-kind casts
# (int64 -> int32 actions, float64 -> float32 rewards) are harmless, but e.g. float obs into a
# uint8 buffer would silently wrap values, so that is rejected.
_CASTING: Final = "same_kind"

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Shapes = tuple[tuple[int, ...], ...]
Dtypes = tuple[np.dtype[np.generic], ...]


class DenseRows:
    """The rows themselves: one preallocated array per column, in BATCH_FIELDS order."""

    def __init__(self, capacity: int, row_shapes: Shapes, dtypes: Dtypes) -> None:
        self.columns: tuple[np.ndarray, ...] = tuple(
            np.zeros((capacity, *shape), dtype=dtype) for shape, dtype in zip(row_shapes, dtypes, strict=True)
        )

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)

    def stage(self, batch: TransitionBatch, start: int, pos: int) -> tuple[np.ndarray, ...]:
        """Whatever writing ``batch[start:]`` from slot ``pos`` needs that could fail, done so that
        a failure changes nothing. Dense rows need nothing: the columns are already converted."""
        return ()

    def write(self, batch: TransitionBatch, start: int, pos: int, staged: tuple[np.ndarray, ...]) -> None:
        """Copy rows ``batch[start:]`` (at most ``capacity``, already the stored dtypes) into the
        ring from slot ``pos`` on, wrapping once: at most two slice copies per column."""
        cap = self.columns[0].shape[0]
        m = batch.size - start
        first = min(m, cap - pos)  # rows that fit before the end of the ring
        rest = m - first
        for store, col in zip(self.columns, batch, strict=True):
            store[pos : pos + first] = col[start : start + first]
            if rest:
                store[:rest] = col[start + first :]

    def gather(self, rows: np.ndarray) -> TransitionBatch:
        """Copies of the stored rows ``rows`` (ring slots)."""
        return TransitionBatch(*(c[rows] for c in self.columns))


class Ring:
    """What every replay kind shares: the ring's counters, checks, snapshots, RNG and lock.

    Each kind (``UniformReplay``, ``PrioritizedReplay``, and their shared-frames forms) implements
    ``zmqrl.core.Replay``'s ``add``, ``sample`` and ``update_priorities`` itself.
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
        # Row shape and dtype each column of an added batch must have, in BATCH_FIELDS order.
        self._row_shapes: Shapes = (obs_shape, action_shape, (), obs_shape, ())
        obs, action = np.dtype(obs_dtype), np.dtype(action_dtype)
        self._dtypes: Dtypes = (obs, action, REWARD_DTYPE, obs, DISCOUNT_DTYPE)
        self._rows = self._make_rows()
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pos = 0  # next row to write
        self._size = 0  # rows holding data, <= capacity
        self._total_added = 0

    def _make_rows(self) -> DenseRows:
        return DenseRows(self._capacity, self._row_shapes, self._dtypes)

    @property
    def capacity(self) -> int:
        """Maximum number of stored transitions."""
        return self._capacity

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes preallocated for the rows (the buffer never grows beyond this)."""
        return self._rows.nbytes

    @property
    def total_added(self) -> int:
        """All-time number of transitions passed to ``add``, including overwritten ones."""
        return self._total_added

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)}/{self.capacity} rows)"

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch:
        """The stored transitions, oldest first (at most the newest ``max_rows``), as copies: what a
        checkpoint keeps so that a resumed learner does not start from an empty buffer."""
        with self._lock:
            order = (np.arange(self._size) + (self._pos - self._size)) % self._capacity
            if max_rows is not None:
                order = order[max(0, len(order) - max_rows) :]
            return self._rows.gather(order)

    def rng_state(self) -> dict[str, object]:
        return dict(self._rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, object]) -> None:
        self._rng.bit_generator.state = state

    def stats(self) -> dict[str, float | int]:
        """Kind-specific counters for reports, read together under the lock (``_stats_locked``)."""
        with self._lock:
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, float | int]:
        return {}

    def _checked(self, batch: Batch) -> tuple[TransitionBatch, int]:
        """``batch`` with every column in the stored dtype, and its row count; TypeError or
        ValueError, with nothing changed, unless every column's shape fits and its dtype casts
        safely. Conversion happens here, before the lock, so writing only copies.

        Replay stores only n-step transitions: rollouts of an on-policy agent go to the learner's
        rollout queue (``zmqrl.replay.rollout_queue``), never here. The learner has already
        validated wire input, so the rest only guards against programming errors that would
        otherwise broadcast or cast silently into storage.
        """
        if not isinstance(batch, TransitionBatch):
            raise TypeError(f"replay stores TransitionBatch rows, not {type(batch).__name__}")
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
        columns = (c if c.dtype == d else c.astype(d) for c, d in zip(batch, self._dtypes, strict=True))
        return TransitionBatch(*columns), b

    def _check_size(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")


class UniformReplay(Ring):
    """Fixed-capacity FIFO ring of transitions with uniform sampling (with replacement).

    When full, each ``add`` overwrites the oldest rows; actor priorities are ignored.
    """

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        """Insert a batch, overwriting the oldest rows when full; a batch larger than the capacity
        keeps only its newest ``capacity`` rows. All or nothing (module docstring)."""
        rows, b = self._checked(batch)
        if b:
            with self._lock:
                self._append_locked(rows, b, None)

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot`` (appended in order, as if just received); ``total_added``
        only raises the counter. All or nothing, like ``add``."""
        rows, b = self._checked(batch)
        with self._lock:
            self._append_locked(rows, b, total_added)

    def _append_locked(self, batch: TransitionBatch, b: int, total_floor: int | None) -> None:
        cap, pos = self._capacity, self._pos
        start = max(0, b - cap)  # rows of the batch that survive
        m = b - start
        if m:
            staged = self._rows.stage(batch, start, pos)  # the last step that may raise
            self._rows.write(batch, start, pos, staged)
        self._pos = (pos + m) % cap
        self._size = min(cap, self._size + m)
        self._total_added = max(self._total_added + b, total_floor or 0)

    def sample(self, batch_size: int, updates: int = 0) -> Sampled:
        """``batch_size`` transitions drawn uniformly with replacement (copies), no importance
        weights or ids. ValueError when the buffer is empty or ``batch_size`` < 1."""
        with self._lock:
            self._check_size(batch_size)
            idx = self._rng.integers(0, self._size, size=batch_size)
            # Rows 0..size-1 are exactly the stored rows: the ring fills from 0 and never shrinks.
            batch = self._rows.gather(idx)
        return Sampled(batch, importance=None, ids=None, metrics={})

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """No-op: uniform sampling has no priorities to refresh."""
