"""The ``zmqrl.core.Replay`` interface over the storage classes: what ``make_replay`` returns.

The storage classes keep the APIs their own tests pin down (``sample(n) -> TransitionBatch``,
``sample_prioritized(n, beta)``, ``add_with_priorities``). Two thin wrappers give every kind the
one interface the learner is written against, so it never asks which kind it holds: the uniform
one turns a draw into a ``Sampled`` with no importance weights, the prioritized one anneals the
importance exponent by the learner's update count and hands new priorities back. Neither holds
mutable state: every call goes straight to the storage, whose lock makes it safe from the ingest
and training threads at once and whose transactions make each add all-or-nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from zmqrl.core import Sampled
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.storage import UniformReplay
from zmqrl.types import Batch, TransitionBatch

S = TypeVar("S", bound=UniformReplay)


@dataclass(frozen=True)
class BetaSchedule:
    """Importance-sampling exponent, annealed linearly from ``start`` to 1 over ``updates`` updates.

    Early on the priorities are rough and the bias of prioritized sampling matters little; by the
    end of training, when unbiased updates matter most, the correction is full (Schaul et al.).
    """

    start: float  # replay.beta
    updates: int  # replay.beta_updates

    def __call__(self, updates: int) -> float:
        frac = min(1.0, max(0, updates) / self.updates) if self.updates > 0 else 1.0
        return self.start + frac * (1.0 - self.start)


def transitions(batch: Batch) -> TransitionBatch:
    """``batch``, which replay stores only as n-step transitions: rollouts of an on-policy agent
    go to the learner's rollout queue (``zmqrl.replay.rollout_queue``), never here."""
    if not isinstance(batch, TransitionBatch):
        raise TypeError(f"replay stores TransitionBatch rows, not {type(batch).__name__}")
    return batch


class _Buffer(Generic[S]):
    """What every kind passes straight through to its storage."""

    def __init__(self, storage: S) -> None:
        self._storage = storage

    @property
    def storage(self) -> S:
        """The storage object itself, for diagnostics and tests (e.g. ``priorities_of``)."""
        return self._storage

    def __len__(self) -> int:
        return len(self._storage)

    @property
    def capacity(self) -> int:
        return self._storage.capacity

    @property
    def nbytes(self) -> int:
        return self._storage.nbytes

    @property
    def total_added(self) -> int:
        return self._storage.total_added

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch:
        return self._storage.snapshot(max_rows)

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        self._storage.restore(batch, total_added)

    def rng_state(self) -> dict[str, object]:
        return self._storage.rng_state()

    def set_rng_state(self, state: dict[str, object]) -> None:
        self._storage.set_rng_state(state)

    def stats(self) -> dict[str, float | int]:
        return self._storage.stats()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._storage).__name__}, {len(self)}/{self.capacity} rows)"


class UniformBuffer(_Buffer[UniformReplay]):
    """``UniformReplay`` or ``SharedFramesReplay`` behind ``Replay``: priorities are ignored."""

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        self._storage.add(transitions(batch))  # actor priorities mean nothing to a uniform buffer

    def sample(self, batch_size: int, updates: int) -> Sampled:
        return Sampled(self._storage.sample(batch_size), importance=None, ids=None, metrics={})

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """No-op: uniform sampling has no priorities to refresh."""


class PrioritizedBuffer(_Buffer[PrioritizedReplay]):
    """``PrioritizedReplay`` or ``SharedFramesPrioritizedReplay`` behind ``Replay``.

    ``sample`` draws by priority with importance weights at the exponent ``beta(updates)``, and
    reports ``per_beta`` and ``per_importance_min`` (the most a row's loss was scaled down: near 0
    means a few rows dominate sampling).
    """

    def __init__(self, storage: PrioritizedReplay, beta: BetaSchedule) -> None:
        super().__init__(storage)
        self._beta = beta

    @property
    def beta(self) -> BetaSchedule:
        return self._beta

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        self._storage.add_with_priorities(transitions(batch), priorities)

    def sample(self, batch_size: int, updates: int) -> Sampled:
        beta = self._beta(updates)
        batch, ids, importance = self._storage.sample_prioritized(batch_size, beta)
        metrics = {"per_beta": beta, "per_importance_min": float(importance.min())}
        return Sampled(batch, importance=importance, ids=ids, metrics=metrics)

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """New raw priorities ``|TD error|`` for the rows of a ``Sampled`` (None: nothing to do)."""
        if ids is not None:
            self._storage.update_priorities(ids, td_errors)
