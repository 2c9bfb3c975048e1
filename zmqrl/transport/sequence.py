"""Per-actor accounting of samples messages by their ``seq``: lost, reordered and restarted.

Every actor numbers its samples messages 0, 1, 2, ... (``seq``), counting only messages it really
handed to ZeroMQ, and starts again at 0 when its process starts. Over one TCP connection ZeroMQ
neither reorders nor duplicates, so on a healthy run every count here but ``batches``/``samples``
stays 0; a non-zero count points at a peer that reconnected and lost its queue, a foreign or buggy
client, or two live actors sharing one ``actor_id``.

The rules, applied to each valid message of actor ``a`` with sequence number ``s`` (``last`` is the
highest ``seq`` seen from ``a`` in its current incarnation):

* first message ever seen from ``a``: the baseline. Nothing counts as lost before it, because the
  learner (or a restarted learner) may join an actor's stream at any point.
* ``s == last + 1``: in order.
* ``s > last + 1``: ``s - last - 1`` batches **lost** (at most ``MAX_SEQ_GAP``: see below).
* ``s == 0`` (after anything): a **restart** (a new incarnation of the actor); the baseline resets.
* ``0 < s <= last`` and ``last - s <= REORDER_WINDOW``: **reordered** (late or duplicated); the
  baseline stays. A batch that arrives after its gap was counted is counted both lost (when the
  gap was seen) and reordered (when it arrives).
* ``s < last - REORDER_WINDOW``: a restart whose first ``s`` messages were lost: ``restarts + 1``,
  ``lost + s`` (when ``s <= MAX_SEQ_GAP``), and the baseline becomes ``s``.

Bounds, because every field here comes from a peer: a forward jump larger than ``MAX_SEQ_GAP``
cannot be messages lost in ZeroMQ's queues (a few high-water marks' worth at most), so it counts as
a **restart** (a sender that started over at a far number, or a forged ``seq``), not as a loss;
every counter saturates at ``COUNTER_MAX`` (int64, what a heartbeat can carry) instead of growing
past it. Only the run's own ids are tracked one by one: ``0 <= actor_id < tracked_ids`` (the
learner passes ``actor.num_actors`` plus ``EXTRA_TRACKED_IDS`` for replicas scaled past the config);
messages from any other id are counted only in the totals, as one "other" bucket
(``untracked_batches``/``untracked_samples``), so random ids from a hostile peer grow neither memory
nor ``stats.json``. Safe to call from the ingest thread while another thread reads the stats.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Protocol

# Ids tracked one by one when the caller does not say how many actors the run has (tests, benches).
MAX_TRACKED_ACTORS = 4096
# Ids past actor.num_actors still tracked one by one: replicas scaled past the config (compose
# --scale) claim the next free ids.
EXTRA_TRACKED_IDS = 16
# The largest forward jump in seq counted as lost messages. What can really be lost between two
# messages of one sender is what ZeroMQ queues hold when a connection drops (transport.samples_hwm,
# 64 by default, on each side); a million is far past any queue, and anything beyond it is a sender
# that started over or a forged seq.
MAX_SEQ_GAP = 1 << 20
# Counters saturate here: the most a heartbeat counter (int64) can carry.
COUNTER_MAX = 2**63 - 1
# How far below the highest seq a message may arrive and still count as reordered, not a restart.
REORDER_WINDOW = 64


@dataclass
class ActorSeqStats:
    """What one actor id's samples messages looked like, for ``stats.json`` and logs."""

    batches: int = 0  # valid messages received
    samples: int = 0  # transitions in them
    lost: int = 0  # seq numbers skipped (messages that never arrived)
    reordered: int = 0  # messages at or below the highest seq already seen (late or duplicate)
    restarts: int = 0  # new incarnations (seq back to 0, or far back)
    last_seq: int = -1  # highest seq of the current incarnation


class SequenceCounts(Protocol):
    """What reports read of the accounting: a tracker's own, or the copy a learner keeps of its
    intake process's (zmqrl/learner/intake.py)."""

    def per_actor(self) -> dict[int, dict[str, int]]: ...

    def totals(self) -> dict[str, int]: ...


class SequenceTracker:
    """Counts lost, reordered and restarted samples streams per ``actor_id`` (see module doc)."""

    def __init__(self, tracked_ids: int = MAX_TRACKED_ACTORS, reorder_window: int = REORDER_WINDOW) -> None:
        self.tracked_ids = tracked_ids
        self.reorder_window = reorder_window
        self._actors: dict[int, ActorSeqStats] = {}
        self._untracked_batches = 0
        self._untracked_samples = 0
        self._lock = threading.Lock()

    @classmethod
    def for_run(cls, num_actors: int) -> SequenceTracker:
        """The tracker of a run with ``num_actors`` actors (ids past them, up to
        ``EXTRA_TRACKED_IDS`` more, are scaled replicas; the rest go to the "other" bucket)."""
        return cls(tracked_ids=num_actors + EXTRA_TRACKED_IDS)

    def observe(self, actor_id: int, seq: int, samples: int) -> None:
        """Account one valid samples message (``samples`` transitions)."""
        with self._lock:
            self._observe(actor_id, seq, samples)

    def observe_all(self, messages: list[tuple[int, int, int]]) -> None:
        """Account valid messages as ``(actor_id, seq, samples)`` in the order received, under one
        taking of the lock (a group's messages; the same counts as ``observe`` one by one)."""
        with self._lock:
            for actor_id, seq, samples in messages:
                self._observe(actor_id, seq, samples)

    def _observe(self, actor_id: int, seq: int, samples: int) -> None:
        """One message, the lock held."""
        if not 0 <= actor_id < self.tracked_ids:
            self._untracked_batches = _saturating(self._untracked_batches, 1)
            self._untracked_samples = _saturating(self._untracked_samples, samples)
            return
        stats = self._actors.get(actor_id)
        if stats is None:
            stats = self._actors[actor_id] = ActorSeqStats(last_seq=seq)
        elif seq == 0:
            stats.restarts = _saturating(stats.restarts, 1)
            stats.last_seq = 0
        elif seq > stats.last_seq:
            gap = seq - stats.last_seq - 1
            if gap > MAX_SEQ_GAP:
                stats.restarts = _saturating(stats.restarts, 1)  # started over far ahead: nothing lost
            else:
                stats.lost = _saturating(stats.lost, gap)
            stats.last_seq = seq
        elif stats.last_seq - seq <= self.reorder_window:
            stats.reordered = _saturating(stats.reordered, 1)
        else:
            stats.restarts = _saturating(stats.restarts, 1)
            if seq <= MAX_SEQ_GAP:  # the new incarnation's first ``seq`` messages never arrived
                stats.lost = _saturating(stats.lost, seq)
            stats.last_seq = seq
        stats.batches = _saturating(stats.batches, 1)
        stats.samples = _saturating(stats.samples, samples)

    def per_actor(self) -> dict[int, dict[str, int]]:
        """A copy of every tracked actor's counters, by actor id (ascending)."""
        with self._lock:
            return {a: asdict(s) for a, s in sorted(self._actors.items())}

    def totals(self) -> dict[str, int]:
        """Sums over all actors, for TensorBoard and heartbeat counters."""
        with self._lock:
            actors = list(self._actors.values())
            return {
                "lost_batches": min(sum(s.lost for s in actors), COUNTER_MAX),
                "reordered_batches": min(sum(s.reordered for s in actors), COUNTER_MAX),
                "actor_restarts": min(sum(s.restarts for s in actors), COUNTER_MAX),
                "tracked_actors": len(actors),
                "untracked_batches": self._untracked_batches,
                "untracked_samples": self._untracked_samples,
            }


def _saturating(count: int, add: int) -> int:
    """``count + add``, held at ``COUNTER_MAX`` rather than past what a heartbeat can carry."""
    return min(count + add, COUNTER_MAX)
