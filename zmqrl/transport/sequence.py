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
* ``s > last + 1``: ``s - last - 1`` batches **lost**.
* ``s == 0`` (after anything): a **restart** (a new incarnation of the actor); the baseline resets.
* ``0 < s <= last`` and ``last - s <= REORDER_WINDOW``: **reordered** (late or duplicated); the
  baseline stays. A batch that arrives after its gap was counted is counted both lost (when the
  gap was seen) and reordered (when it arrives).
* ``s < last - REORDER_WINDOW``: a restart whose first ``s`` messages were lost: ``restarts + 1``,
  ``lost + s``, and the baseline becomes ``s``.

At most ``max_actors`` ids are tracked, so random ``actor_id`` values from a hostile peer cannot
grow memory without bound; messages from further ids still count in the totals, as
``untracked_batches``. Safe to call from the ingest thread while another thread reads the stats.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

# Most actor ids tracked one by one; beyond it messages are only counted in the totals.
MAX_TRACKED_ACTORS = 4096
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


class SequenceTracker:
    """Counts lost, reordered and restarted samples streams per ``actor_id`` (see module doc)."""

    def __init__(self, max_actors: int = MAX_TRACKED_ACTORS, reorder_window: int = REORDER_WINDOW) -> None:
        self.max_actors = max_actors
        self.reorder_window = reorder_window
        self._actors: dict[int, ActorSeqStats] = {}
        self._untracked_batches = 0
        self._untracked_samples = 0
        self._lock = threading.Lock()

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
        stats = self._actors.get(actor_id)
        if stats is None:
            if len(self._actors) >= self.max_actors:
                self._untracked_batches += 1
                self._untracked_samples += samples
                return
            stats = self._actors[actor_id] = ActorSeqStats(last_seq=seq)
        elif seq == 0:
            stats.restarts += 1
            stats.last_seq = 0
        elif seq > stats.last_seq:
            stats.lost += seq - stats.last_seq - 1
            stats.last_seq = seq
        elif stats.last_seq - seq <= self.reorder_window:
            stats.reordered += 1
        else:
            stats.restarts += 1
            stats.lost += seq
            stats.last_seq = seq
        stats.batches += 1
        stats.samples += samples

    def per_actor(self) -> dict[int, dict[str, int]]:
        """A copy of every tracked actor's counters, by actor id (ascending)."""
        with self._lock:
            return {a: asdict(s) for a, s in sorted(self._actors.items())}

    def totals(self) -> dict[str, int]:
        """Sums over all actors, for TensorBoard and heartbeat counters."""
        with self._lock:
            actors = list(self._actors.values())
            return {
                "lost_batches": sum(s.lost for s in actors),
                "reordered_batches": sum(s.reordered for s in actors),
                "actor_restarts": sum(s.restarts for s in actors),
                "tracked_actors": len(actors),
                "untracked_batches": self._untracked_batches,
                "untracked_samples": self._untracked_samples,
            }
