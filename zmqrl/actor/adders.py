"""The actor's adder: what its steps become on the wire (Acme's adders, in our terms).

An actor's collector (``Sampler``, ``RolloutCollector``) writes each step into the adder's step
log and each ended episode into ``Adder.finished``. The log is what differs between agent
families (``NStepLog``: n-step transitions; ``RolloutLog``: fixed-length rollouts;
``SequenceLog``: R2D2's overlapping windows with their core state); the rest is
the adder's: a samples message per batch (sequence number, oldest weights version, episodes),
Ape-X initial priorities, and the batches held until the learner is heard from. The role sends
what the adder hands it; the adder never calls back into it. The actor's loop, in short::

    collected = collector.collect(budget)           # steps go into adder.log
    if collected is Collected.BATCH_READY and not learner_heard and not adder.hold():
        wait_for_the_learner()
    while learner_heard and (msg := adder.pop()) is not None:
        send(msg)
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Generic, Protocol, TypeVar, cast

import numpy as np

from zmqrl.agents import PriorityFn
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import Batch, EpisodeStat, TransitionBatch

# The heartbeat's "recent_return" is the mean return of this many last episodes.
RECENT_EPISODES = 20

log = logging.getLogger("zmqrl.actor")


class StepLog(Protocol):
    """Steps in, batches out: ``take`` the ready batch and the oldest weights version acted with."""

    @property
    def ready(self) -> bool: ...

    def take(self) -> tuple[Batch, int]: ...


L = TypeVar("L", bound=StepLog)


class Adder(Generic[L]):
    """Turns the steps in ``log`` into samples messages, and holds them until the learner is heard.

    ``hold_limit``: how many batches it may hold before then (the builder's to say).
    ``priorities``: the agent's Ape-X initial priorities, computed when a message is handed over
    (so a held batch is scored under the learner's weights by then); None: messages carry none.
    """

    def __init__(
        self, actor_id: int, log: L, *, hold_limit: int = 0, priorities: PriorityFn | None = None
    ) -> None:
        self.actor_id = actor_id
        self.log = log
        self.hold_limit = hold_limit
        self.held: list[SamplesMsg] = []  # batches taken before the learner was heard from, oldest first
        self.finished: list[EpisodeStat] = []  # episodes ended since the last message (collectors append)
        self.priority_seconds = 0.0
        self._priority_fn = priorities
        self._seq = 0
        self._episodes = 0  # ended episodes already in messages
        self._recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        self._bad_priorities_logged = False

    @property
    def ready(self) -> bool:
        return self.log.ready

    def hold(self) -> bool:
        """Keep the ready batch until the learner is heard from; False when ``hold_limit`` batches
        are held already (the caller waits for the learner, then sends them with ``pop``)."""
        if len(self.held) >= self.hold_limit:
            return False
        if not self.held:
            log.info(
                "collecting up to %d batches until the learner's weights (and run fingerprint) arrive",
                self.hold_limit,
            )
        self.held.append(self._message())
        return True

    def pop(self) -> SamplesMsg | None:
        """The next message to send, with its priorities under the weights held now: the oldest
        held batch, else the ready one; None when there is neither."""
        if self.held:
            msg = self.held.pop(0)
        elif self.log.ready:
            msg = self._message()
        else:
            return None
        if self._priority_fn is not None:  # given only to an n-step adder: its batches are transitions
            msg.priorities = self._priorities(cast(TransitionBatch, msg.batch))
        return msg

    def episode_counters(self) -> dict[str, float | int]:
        """The episode counters of the actor's heartbeats."""
        returns = [*self._recent, *(stat.ret for stat in self.finished)][-RECENT_EPISODES:]
        return {
            "episodes": self._episodes + len(self.finished),
            "recent_return": float(np.mean(returns)) if returns else float("nan"),
        }

    def _message(self) -> SamplesMsg:
        batch, version = self.log.take()
        finished = list(self.finished)
        msg = SamplesMsg(self.actor_id, self._seq, version, batch, finished)
        self._seq += 1
        self._episodes += len(finished)
        self._recent.extend(stat.ret for stat in finished)
        self.finished.clear()  # the collectors append to this very list
        return msg

    def _priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """The Ape-X initial priorities of ``batch`` under the weights held now, as float32 (B,), or
        None when there are none or they are unusable (NaN, inf, negative: the learner then gives
        the rows its max priority)."""
        assert self._priority_fn is not None
        started = time.perf_counter()
        raw = self._priority_fn(batch)
        self.priority_seconds += time.perf_counter() - started
        if raw is None:
            return None
        priorities = np.ascontiguousarray(raw, dtype=np.float32)
        if priorities.shape != (batch.size,):
            raise ValueError(
                f"initial_priorities returned shape {priorities.shape}, expected ({batch.size},)"
            )
        if not (priorities.min() >= 0.0 and priorities.max() < np.inf):
            if not self._bad_priorities_logged:
                log.warning("initial priorities not finite and >= 0; sending batches without them")
                self._bad_priorities_logged = True
            return None
        return priorities
