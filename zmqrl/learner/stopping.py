"""When a run ends, and why: one small object that the learner process and serial mode both ask.

A run ends at ``learner.max_updates``, ``learner.max_seconds`` after the learner started (its wait
for replay included), once the target return held (``learner.stop_at_target``: the learner's own
evaluations, or the supervisor's word for a separate evaluator's), or once every actor reached
``actor.max_steps`` (no data will come any more). The loops that drive a trainer differ in cadence
(threads and sockets, or turns in one thread); what ends the run, and which reason is kept when two
hold at once, is decided here. The object reads no clock and does no I/O: callers pass the time
and the counts.
"""

from __future__ import annotations

import math

from zmqrl.config import LearnerConfig
from zmqrl.transport.control import TARGET_HELD

# Why a run reached its end, as the final stats' "ended" says (a stopped or failed run says its state).
ENDED_MAX_UPDATES = "max_updates"
ENDED_MAX_SECONDS = "max_seconds"
ENDED_MAX_STEPS = "actor max_steps"  # every actor reached actor.max_steps
ENDED_TARGET_HELD = TARGET_HELD  # learner.stop_at_target: the target return held target_hold times
# Each reason as a run's summary says it.
_WORDS = {
    ENDED_MAX_UPDATES: "learner.max_updates reached",
    ENDED_MAX_SECONDS: "learner.max_seconds passed",
    ENDED_MAX_STEPS: "every actor reached actor.max_steps",
    ENDED_TARGET_HELD: "the target return held",
}


def ended_words(state: str, ended: object) -> str:
    """A learner's end for a summary: its state, and for a finished run which limit ended it (a
    run cut by max_seconds with 0 updates otherwise reads like one that trained to its end)."""
    why = _WORDS.get(ended) if state == "finished" and isinstance(ended, str) else None
    return f"{state} ({why})" if why else state


def stops_at_target(learner: LearnerConfig) -> bool:
    """Whether this run ends once the target is held (validated: it then has a target_return)."""
    return learner.stop_at_target and learner.target_return is not None


class StopPolicy:
    """Decides the end of a run from its counts; the first reason found is the one kept (the final
    evaluation of a run that reached max_updates may hold the target too: it still ended at
    max_updates)."""

    def __init__(self, learner: LearnerConfig) -> None:
        self.max_updates = learner.max_updates
        self.max_seconds = learner.max_seconds
        self.at_target = stops_at_target(learner)
        self.deadline = math.inf  # set by start()
        self.ended: str | None = None  # the reason, once the run is at its end

    def start(self, now: float) -> None:
        """Start the ``max_seconds`` clock (``now``: a monotonic time, as later calls pass)."""
        self.deadline = now + self.max_seconds if self.max_seconds else math.inf

    def end(self, reason: str) -> None:
        """The run is at its end for ``reason`` (kept unless another came first)."""
        if self.ended is None:
            self.ended = reason

    def check(self, updates: int, now: float) -> str | None:
        """Why the run ends at ``updates`` and ``now``, or None while it goes on: an end already
        decided, then max_updates, then max_seconds."""
        if self.ended is None and updates >= self.max_updates:
            self.ended = ENDED_MAX_UPDATES
        elif self.ended is None and now > self.deadline:
            self.ended = ENDED_MAX_SECONDS
        return self.ended

    def evaluated(self, holding: bool) -> bool:
        """After an evaluation (``holding``: the target held ``target_hold`` times in a row): whether
        the run ends now for it, with ``learner.stop_at_target``."""
        if self.at_target and holding and self.ended is None:
            self.ended = ENDED_TARGET_HELD
            return True
        return False

    def end_requested(self, reason: str) -> bool:
        """The supervisor asks to end the run for ``reason`` (every actor done, or a separate
        evaluator held the target); whether this run acts on it: the target only with its own
        ``learner.stop_at_target``, so a run whose config does not ask for it never ends early."""
        if reason == ENDED_MAX_STEPS or (reason == ENDED_TARGET_HELD and self.at_target):
            self.end(reason)
            return True
        return False
