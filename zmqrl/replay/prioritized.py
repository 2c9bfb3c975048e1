"""Proportional prioritized replay (``PrioritizedReplay``, as in Ape-X) on the ring storage.

Row ``i`` is drawn with probability ``v_i / sum(v)``, ``v_i = (p_i + priority_eps) ** alpha``,
kept in a sum tree (sumtree.py) so that drawing a batch and re-prioritising it are both
``O(batch * log capacity)``. Ids and bounded actor priorities are explained on the class,
importance weights on ``sample_prioritized``, the bounds every stored priority passes in
priorities.py. An add is all-or-nothing as the ring's are (storage.py): the new rows' weights
are computed and checked before the first write, so the tree's update cannot refuse them.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.typing import DTypeLike

from zmqrl.core import Sampled
from zmqrl.replay.priorities import (
    DEFAULT_ALPHA,
    DEFAULT_MAX_DRAW_RATIO,
    DEFAULT_MAX_INITIAL_PRIORITY_RATIO,
    DEFAULT_MAX_PRIORITY,
    DEFAULT_PRIORITY_EPS,
    INITIAL_MAX_PRIORITY,
    BetaSchedule,
    PriorityBounds,
    PriorityTable,
    checked_priorities,
    checked_update,
)
from zmqrl.replay.storage import FloatArray, Ring
from zmqrl.types import Batch, TransitionBatch

__all__ = ["INITIAL_MAX_PRIORITY", "PrioritizedReplay"]
# `_ordinal` value of a slot that has never held a row: no real insertion ordinal is negative.
_NO_ORDINAL: Final = -1


class PrioritizedReplay(Ring):
    """Proportional prioritized replay (Schaul et al. 2016) on the ring storage (storage.py).

    Row ``i`` is drawn with probability ``P(i) = v_i / sum(v)``, ``v_i = (p_i + priority_eps) **
    alpha``, where ``p_i`` is the raw priority (``|TD error|``) last given for the row; ``alpha =
    0`` is uniform sampling. ``sample`` anneals the importance exponent by the learner's update
    count (``beta``, a ``BetaSchedule``).

    Ids: ``sample_prioritized`` returns each row's *insertion ordinal* (its position in the
    all-time insertion order: the value of ``total_added`` when it was written), not its ring
    slot. The slot is ``id % capacity``, and ``_ordinal[slot]`` records which ordinal the slot
    holds now, so ``update_priorities`` can recognise (and skip) a row that the ingest thread
    overwrote while the trainer was computing its TD error: a slot index alone cannot tell the
    old row from the new one, and would hand the new row a priority it never earned.

    To keep ``slot == ordinal % capacity`` this class places rows by ordinal: a batch larger than
    the capacity keeps its newest rows (as ``UniformReplay``) but at the slots their ordinals map to,
    and ``restore`` into an empty buffer re-bases the ring so restored rows carry the ordinals they
    had in the run that saved them. The stored set is always the contiguous ring segment ending at
    ``_pos``, so ``snapshot`` (oldest first) works unchanged.

    Bounded priorities (priorities.py): every priority stored, actor-sent or the learner's own,
    is capped at ``max_priority_cap`` and its weight at ``max_draw_ratio`` times the mean weight
    of the rows stored, so no row is drawn more than about that many times as often as the
    average row whatever a peer sent (the learner's TD errors come from peer data too). Actor
    priorities are also clipped to ``max_initial_priority_ratio * max_priority``, where
    ``max_priority`` (what rows without a priority get) is the largest priority the *learner*
    computed, starting at ``INITIAL_MAX_PRIORITY``. Rows some bound lowered are counted in
    ``clipped_priorities``.

    One lock guards ring, tree, ordinals and RNG; it is held only for numpy calls and the sum
    tree's batched kernels (microseconds per batch where compiled, see sumtree.py).
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: DTypeLike,
        action_shape: tuple[int, ...],
        action_dtype: DTypeLike,
        seed: int | None = None,
        *,
        alpha: float = DEFAULT_ALPHA,
        priority_eps: float = DEFAULT_PRIORITY_EPS,
        max_initial_priority_ratio: float = DEFAULT_MAX_INITIAL_PRIORITY_RATIO,
        max_priority: float = DEFAULT_MAX_PRIORITY,
        max_draw_ratio: float = DEFAULT_MAX_DRAW_RATIO,
        beta: BetaSchedule | None = None,
    ) -> None:
        bounds = PriorityBounds(
            alpha, priority_eps, max_initial_priority_ratio, max_priority, max_draw_ratio
        )  # first: it checks the settings before anything is allocated
        super().__init__(capacity, obs_shape, obs_dtype, action_shape, action_dtype, seed)
        self._priorities = PriorityTable(self._capacity, bounds)  # sum tree, bounds, counters
        self._ordinal: npt.NDArray[np.int64] = np.full(self._capacity, _NO_ORDINAL, dtype=np.int64)
        # Ordinal of the next row written. Equals total_added except after restoring into a
        # non-empty buffer (see `restore`); invariant: _pos == _next_ordinal % capacity.
        self._next_ordinal = 0
        self.beta = beta or BetaSchedule()  # importance exponent by update count (``sample``)

    @property
    def alpha(self) -> float:
        """Priority exponent: 0 is uniform, 1 fully proportional."""
        return self._priorities.bounds.alpha

    @property
    def priority_eps(self) -> float:
        """Added to every raw priority so that no stored row has zero probability."""
        return self._priorities.bounds.eps

    @property
    def max_priority(self) -> float:
        """Largest raw priority the learner has given (``update_priorities``, capped at
        ``max_priority_cap``; never decreases, at least ``INITIAL_MAX_PRIORITY`` unless the cap is
        lower): what rows without one get. Actor priorities never move it."""
        return self._priorities.bounds.max_measured

    @property
    def max_initial_priority_ratio(self) -> float:
        """Actor-sent priorities are clipped to this times ``max_priority``."""
        return self._priorities.bounds.initial_ratio

    @property
    def max_priority_cap(self) -> float:
        """The absolute cap on any raw priority stored (``replay.max_priority``)."""
        return self._priorities.bounds.cap

    @property
    def max_draw_ratio(self) -> float:
        """No row is written with a weight above this times the mean weight stored."""
        return self._priorities.bounds.draw_ratio

    @property
    def clipped_priorities(self) -> int:
        """Priorities stored lowered by a bound (actor-sent, or the learner's own)."""
        return self._priorities.clipped

    @property
    def stale_priority_updates(self) -> int:
        """Rows whose ``update_priorities`` was skipped because their slot had been overwritten."""
        return self._priorities.stale_updates

    def _stats_locked(self) -> dict[str, float | int]:
        return {**super()._stats_locked(), **self._priorities.stats()}

    @property
    def total_priority(self) -> float:
        """Sum of the transformed priorities ``(p + eps) ** alpha`` of all stored rows."""
        with self._lock:
            return self._priorities.tree.total

    @property
    def nbytes(self) -> int:
        """Bytes preallocated: the columns plus the sum tree and the per-slot ordinals."""
        return super().nbytes + self._priorities.tree.nbytes + int(self._ordinal.nbytes)

    # ------------------------------------------------------------------ insertion
    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        """Insert ``batch`` with raw priorities ``(B,)`` (e.g. actor-side ``|TD error|``).

        ``None`` gives every row ``max_priority``, so a new row is sampled at least once soon
        (Schaul et al.). Every priority is bounded (see the class docstring). Rows beyond the
        capacity are dropped oldest-first. Raises ValueError, with nothing changed, for
        priorities of the wrong shape, negative, or not finite.
        """
        rows, b = self._checked(batch)
        raw = None if priorities is None else checked_priorities(priorities, b)
        if b == 0:
            return
        with self._lock:
            self._place_locked(rows, b, raw, self._next_ordinal, rebase=False, total_floor=None)

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot``; restored rows get ``max_priority``.

        Priorities are not part of a snapshot (they are stale by the time a learner resumes with
        retrained weights anyway); max priority makes every restored row drawn early, which
        re-measures its TD error. Into an empty buffer with ``total_added`` given, the ring is
        re-based so the rows get the ordinals they had when saved (``total_added - n`` onward).
        Into a non-empty buffer the rows are appended with the next ordinals and ``total_added``
        is only raised as the counter (as in ``UniformReplay``): ids then run behind it.
        """
        rows, b = self._checked(batch)
        with self._lock:
            rebase = self._size == 0 and total_added is not None and total_added >= b
            first = total_added - b if rebase and total_added is not None else self._next_ordinal
            self._place_locked(rows, b, None, first, rebase=rebase, total_floor=total_added)

    def _place_locked(
        self,
        batch: TransitionBatch,
        b: int,
        raw: FloatArray | None,
        first: int,
        *,
        rebase: bool,
        total_floor: int | None,
    ) -> None:
        """Write the batch as ordinals ``first ..`` (the surviving rows at the slots their ordinals
        map to), with their priorities. ``rebase``: the ring restarts there.

        All or nothing without an undo: the weights are computed and checked (finite, >= 0: what
        the tree refuses) and the rows staged (shared frames intern their planes, all or nothing)
        before the first write; what follows cannot raise."""
        cap = self._capacity
        start = max(0, b - cap)
        m = b - start
        ordinals = np.arange(first + start, first + b, dtype=np.int64)
        slots = ordinals % cap
        # A bound that overflowed is refused here, before any write.
        values, clipped = self._priorities.weights_locked(None if raw is None else raw[start:], m, self._size)
        pos = (first + start) % cap
        staged = self._rows.stage(batch, start, pos) if m else ()  # the last step that may raise
        self._priorities.write_locked(slots, values, clipped)
        if m:
            self._rows.write(batch, start, pos, staged)
        self._ordinal[slots] = ordinals
        self._next_ordinal = first + b
        self._pos = self._next_ordinal % cap
        self._size = min(cap, self._size + m)
        self._total_added = (first if rebase else self._total_added) + b
        if total_floor is not None:
            self._total_added = max(self._total_added, total_floor)

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, updates: int = 0) -> Sampled:
        """A batch drawn by priority for the learner's update number ``updates``, with importance
        weights at the exponent ``beta(updates)``; reports ``per_beta`` and ``per_importance_min``
        (the most a row's loss was scaled down: near 0 means a few rows dominate sampling)."""
        beta = self.beta(updates)
        batch, ids, importance = self.sample_prioritized(batch_size, beta)
        metrics = {"per_beta": beta, "per_importance_min": float(importance.min())}
        return Sampled(batch, importance=importance, ids=ids, metrics=metrics)

    def sample_prioritized(
        self, batch_size: int, beta: float
    ) -> tuple[TransitionBatch, npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """``(batch, ids, weights)``: rows drawn in proportion to priority, with replacement.

        Stratified: ``[0, total)`` is cut into ``batch_size`` equal segments with one uniform draw
        in each, which lowers the variance of a batch's composition versus independent draws
        (the scheme of Schaul et al.). ``ids`` are insertion ordinals (int64) for
        ``update_priorities``. ``weights`` (float32) are ``(N * P(i)) ** -beta`` with ``N`` the
        number of stored rows, divided by the largest weight *in this batch* so that they only
        ever scale the loss down. Schaul et al. divide by the largest weight over the whole
        buffer instead; the batch maximum (as e.g. Dopamine does) needs no min-tree, and the two
        differ only by a per-batch factor that a gradient step's learning rate absorbs.
        """
        if not (np.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be finite and >= 0, got {beta}")
        with self._lock:
            self._check_size(batch_size)
            slots, ids, weights = self._priorities.draw_locked(
                self._rng, batch_size, self._ordinal, self._size, beta
            )
            batch = self._rows.gather(slots)
        return batch, ids, weights.astype(np.float32)

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """Set raw priorities ``|TD error|`` for rows by the ids ``sample`` returned (None: none).

        Rows overwritten since they were sampled are skipped (counted in
        ``stale_priority_updates``). A repeated id (sampling is with replacement) takes its last
        priority. These are the learner's own measurements: they alone raise ``max_priority``,
        and they are bounded like any priority (a peer's reward or observations made them).
        Raises ValueError, with nothing changed, for ids that are not non-negative integers,
        mismatched lengths, or priorities that are negative or not finite.
        """
        if ids is None:
            return
        ids, raw = checked_update(ids, td_errors)
        with self._lock:
            self._priorities.update_locked(ids, raw, self._ordinal, self._size)

    def priorities_of(self, ids: np.ndarray) -> npt.NDArray[np.float64]:
        """Transformed priorities ``(p + eps) ** alpha`` of rows by id; NaN for overwritten ids
        (for tests and diagnostics)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        with self._lock:
            slots = ids % self._capacity
            out = self._priorities.tree.get(slots)
            out[self._ordinal[slots] != ids] = np.nan
        return out
