"""How raw priorities become sum-tree weights that no one row, and no one peer, can push far.

Every priority prioritized replay stores comes from data a peer chose: an actor's initial
priorities directly, and the learner's own ``|TD error|`` of a row whose reward, observations or
discount a peer sent. A clip relative to a reference bounds nothing once the reference itself
can be pushed (the first release clipped actor priorities to 10x the largest TD error the
learner had measured, and one row of reward 3e38 measured 3e38). So every weight written to the
tree passes two bounds whose references one peer cannot move much:

* ``max_priority``, absolute: a raw priority above it counts as it (``replay.max_priority``).
  It also keeps the tree's float64 sums exact enough: a leaf of 3e38 ** 0.6 made every other
  row's weight vanish below the total's last bit.
* ``max_draw_ratio``, relative to the buffer's mean weight (``replay.max_draw_ratio``): no row is
  written with a weight above that many times the mean weight of the rows stored, so no row is
  drawn more than about that many times as often as the average row. One row moves the mean by
  at most ``max_draw_ratio / size`` of itself; rows making up a fraction ``f`` of the buffer take
  at most about ``max_draw_ratio * f`` of the draws, whatever priorities they were given.

On top, actor-sent priorities keep their own clip (``max_initial_priority_ratio`` times the
largest priority the learner has measured), which caps how urgent a fresh row can claim to be
next to what the learner has seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from zmqrl.replay.sumtree import all_finite_nonnegative, make_sum_tree

FloatArray = npt.NDArray[np.float64]
IdArray = npt.NDArray[np.int64]

# Prioritized replay defaults: Ape-X (Horgan et al. 2018) uses alpha = 0.6; the epsilon only has to
# keep a zero-|TD error| row drawable, so it is tiny relative to typical TD errors.
DEFAULT_ALPHA: Final = 0.6
DEFAULT_PRIORITY_EPS: Final = 1e-6
# Raw priority that rows inserted without one get before any priority has been seen (Schaul et al.).
INITIAL_MAX_PRIORITY: Final = 1.0
# Actor-sent priorities are clipped to this many times ``max_measured`` (the largest priority the
# learner itself has computed): room for an actor's genuine surprise, but no actor can claim more
# than ~10**alpha times the weight of a fresh unmeasured row.
DEFAULT_MAX_INITIAL_PRIORITY_RATIO: Final = 10.0
# The absolute cap on any raw priority (|TD error|, in reward units). TD errors of rewards clipped
# to +-1 stay below ~100 (1 / (1 - gamma) at gamma 0.99), CartPole's too; unclipped rewards of
# thousands may want more (replay.max_priority).
DEFAULT_MAX_PRIORITY: Final = 1e3
# No row's weight above this many times the mean weight of the rows stored (replay.max_draw_ratio).
DEFAULT_MAX_DRAW_RATIO: Final = 10.0


@dataclass(frozen=True)
class BetaSchedule:
    """Importance-sampling exponent, annealed linearly from ``start`` to 1 over ``updates`` updates.

    Early on the priorities are rough and the bias of prioritized sampling matters little; by the
    end of training, when unbiased updates matter most, the correction is full (Schaul et al.).
    The defaults are ReplayConfig's.
    """

    start: float = 0.4  # replay.beta
    updates: int = 100_000  # replay.beta_updates

    def __call__(self, updates: int) -> float:
        frac = min(1.0, max(0, updates) / self.updates) if self.updates > 0 else 1.0
        return self.start + frac * (1.0 - self.start)


class PriorityBounds:
    """The transform ``(p + eps) ** alpha`` and the bounds above, with the learner's running max.

    Holds no rows: the buffer passes the tree's total and its size (the mean weight) with each
    call, under its own lock. The ``for_*`` methods return the weights and how many of them a
    bound lowered, and change nothing, so a buffer's failed add has nothing here to undo.
    """

    def __init__(
        self,
        alpha: float = DEFAULT_ALPHA,
        priority_eps: float = DEFAULT_PRIORITY_EPS,
        max_initial_priority_ratio: float = DEFAULT_MAX_INITIAL_PRIORITY_RATIO,
        max_priority: float = DEFAULT_MAX_PRIORITY,
        max_draw_ratio: float = DEFAULT_MAX_DRAW_RATIO,
    ) -> None:
        for name, value, least in (
            ("alpha", alpha, 0.0),
            ("priority_eps", priority_eps, 0.0),
            ("max_initial_priority_ratio", max_initial_priority_ratio, 1.0),
            ("max_draw_ratio", max_draw_ratio, 1.0),
        ):
            if not (np.isfinite(value) and value >= least):
                raise ValueError(f"{name} must be finite and >= {least:g}, got {value}")
        if not (np.isfinite(max_priority) and max_priority > 0):
            raise ValueError(f"max_priority must be finite and > 0, got {max_priority}")
        self.alpha = float(alpha)
        self.eps = float(priority_eps)
        self.initial_ratio = float(max_initial_priority_ratio)
        self.cap = float(max_priority)
        self.draw_ratio = float(max_draw_ratio)
        # Largest raw priority the learner has measured (after the cap): what rows without a
        # priority get. Never lowered; actor-sent priorities never raise it.
        self.max_measured = min(INITIAL_MAX_PRIORITY, self.cap)

    def transform(self, raw: FloatArray) -> FloatArray:
        """Raw priorities -> tree weights ``(p + eps) ** alpha`` (no bound applied)."""
        out: FloatArray = (raw + self.eps) ** self.alpha
        return out

    def weight_limit(self, total: float, size: int) -> float:
        """The largest weight a row may be written with now: ``max_draw_ratio`` times the mean
        weight of the ``size`` rows stored (their tree ``total``), and never above the absolute
        cap's weight. An empty buffer's reference is the weight of ``INITIAL_MAX_PRIORITY``."""
        mean = total / size if size > 0 and total > 0 else self._weight(INITIAL_MAX_PRIORITY)
        return min(self.draw_ratio * mean, self._weight(self.cap))

    def for_actor(self, raw: FloatArray, total: float, size: int) -> tuple[FloatArray, int]:
        """Weights for actor-sent raw priorities (checked finite and >= 0), and how many a bound
        lowered."""
        return self._limit(raw, min(self.cap, self.initial_ratio * self.max_measured), total, size)

    def for_learner(self, raw: FloatArray, total: float, size: int) -> tuple[FloatArray, int]:
        """Weights for the learner's measured raw priorities (checked finite and >= 0), and how
        many a bound lowered; then call :meth:`measured` with the live rows' priorities."""
        return self._limit(raw, self.cap, total, size)

    def for_unmeasured(self, n: int, total: float, size: int) -> FloatArray:
        """Weights for ``n`` rows inserted without a priority: ``max_measured``'s, bounded."""
        return np.full(n, min(self._weight(self.max_measured), self.weight_limit(total, size)))

    def measured(self, raw: FloatArray) -> None:
        """Raise ``max_measured`` to the largest of ``raw`` (the learner's, live rows), capped."""
        if raw.size:
            self.max_measured = max(self.max_measured, min(float(raw.max()), self.cap))

    def _limit(self, raw: FloatArray, raw_cap: float, total: float, size: int) -> tuple[FloatArray, int]:
        limit = self.weight_limit(total, size)
        values = self.transform(np.minimum(raw, raw_cap))
        lowered = (raw > raw_cap) | (values > limit)
        n = int(np.count_nonzero(lowered))
        return (np.minimum(values, limit) if n else values), n

    def _weight(self, raw: float) -> float:
        return float((raw + self.eps) ** self.alpha)


def checked_priorities(priorities: npt.ArrayLike, n: int) -> npt.NDArray[np.float64]:
    """Priorities as float64 ``(n,)``; ValueError unless all finite and >= 0 (every prioritized
    replay kind checks them so, before writing anything)."""
    raw = np.asarray(priorities, dtype=np.float64)
    if raw.shape != (n,):
        raise ValueError(f"priorities must have shape ({n},), got {raw.shape}")
    if not all_finite_nonnegative(raw):
        raise ValueError("priorities must be finite and >= 0")
    return raw


def checked_update(ids: npt.ArrayLike, td_errors: npt.ArrayLike) -> tuple[IdArray, FloatArray]:
    """``update_priorities``' ids as flat int64 (ValueError unless integers; int64 ids, what
    ``sample`` gives the learner on its hot path, are not converted) and their checked priorities."""
    ids = np.asarray(ids)
    if ids.dtype != np.int64:
        if ids.dtype.kind not in "iu" and ids.size:
            raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
    return ids.ravel(), checked_priorities(td_errors, ids.size)


class PriorityTable:
    """A prioritized replay's sum tree, the bounds every weight in it passed, and their counters:
    transitions and R2D2 windows keep priorities alike. No lock and no rows: the replay calls the
    ``*_locked`` methods under its lock, with its row count ``size`` and ``ordinal`` (the insertion
    ordinal each slot holds, so that a priority for a row overwritten since is skipped). What can
    raise does so before changing anything: a replay's mutation stays all-or-nothing."""

    def __init__(self, capacity: int, bounds: PriorityBounds, rows: str = "row") -> None:
        self.bounds = bounds
        self.tree = make_sum_tree(capacity)  # compiled where built (sumtree.py)
        self.clipped = 0  # priorities stored lowered by a bound (actor-sent, or the learner's own)
        self.stale_updates = 0  # learner priorities skipped: their row had been overwritten
        self._rows = rows  # what a row is, for messages

    def weights_locked(self, raw: FloatArray | None, n: int, size: int) -> tuple[FloatArray, int]:
        """Weights of ``n`` rows about to be written (actor priorities ``raw`` or, None, the
        learner's largest), bounded, and how many a bound lowered; ValueError if one overflowed."""
        total = self.tree.total
        if raw is None:
            values, clipped = self.bounds.for_unmeasured(n, total, size), 0
        else:
            values, clipped = self.bounds.for_actor(raw, total, size)
        if not all_finite_nonnegative(values):
            raise ValueError("priority weights must be finite and >= 0")
        return values, clipped

    def write_locked(self, slots: npt.ArrayLike, values: FloatArray, clipped: int) -> None:
        self.tree.update(slots, values)  # cannot raise: weights_locked checked them
        self.clipped += clipped

    def draw_locked(
        self, rng: np.random.Generator, n: int, ordinal: IdArray, size: int, beta: float
    ) -> tuple[IdArray, IdArray, FloatArray]:
        """``n`` slots drawn by weight, stratified, their ids and importance weights (float64; see
        ``PrioritizedReplay.sample_prioritized``)."""
        total = self.tree.total
        if not total > 0:
            raise ValueError(f"cannot sample: every stored {self._rows} has priority zero")
        slots, values = self.tree.sample_stratified(rng.random(n))
        weights = (values * (size / total)) ** (-float(beta))
        weights /= weights.max()
        return slots, ordinal[slots], weights

    def update_locked(self, ids: IdArray, raw: FloatArray, ordinal: IdArray, size: int) -> None:
        """The learner's priorities (checked) by id; only these raise ``max_measured``."""
        values, clipped = self.bounds.for_learner(raw, self.tree.total, size)
        # First: it raises (negative ids, values that overflowed) before writing anything.
        live, n_live = self.tree.update_current(ids, values, ordinal)
        if n_live:
            self.bounds.measured(raw if n_live == ids.size else raw[live])
        self.stale_updates += ids.size - n_live
        self.clipped += clipped

    def stats(self) -> dict[str, float | int]:
        return {
            "clipped_priorities": self.clipped,
            "stale_priority_updates": self.stale_updates,
            "max_priority": self.bounds.max_measured,
        }
