"""The learner's counters, and what the ingest side hands to reporting, under one lock."""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from zmqrl.types import EpisodeStat

# Batches over which the reported policy lag is averaged.
RECENT_LAGS = 100


class LearnerCounters:
    """Counts shared by the ingest side (which adds) and the training side (which reads).

    ``updates`` is written by the training side only. Everything else changes under ``lock``,
    together with replay, so that a checkpoint taken under the same lock sees them agree.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.updates = 0
        self.samples = 0  # transitions inserted into replay
        self.batches = 0
        self.episodes = 0
        self.stale_batches = 0  # dropped for exceeding learner.max_policy_lag
        self.stale_samples = 0
        self.episode_queue: deque[EpisodeStat] = deque(maxlen=10_000)  # finished, not yet logged
        self.lags: deque[int] = deque(maxlen=10_000)  # policy lag per batch since the last log point
        self.recent_lags: deque[int] = deque(maxlen=RECENT_LAGS)  # for the progress line and stats
        # Counts restored from a checkpoint come with the training seconds they took: rates divide
        # counts by the time over which they were made, also across a learner restart.
        self.restored_seconds = 0.0
        self.started: float | None = None  # monotonic start of this process's training

    def start_clock(self) -> None:
        self.started = time.monotonic()

    def training_seconds(self) -> float:
        """Seconds over which the counters were made: this process's, plus those restored."""
        here = time.monotonic() - self.started if self.started is not None else 0.0
        return self.restored_seconds + here

    def take_for_report(self) -> tuple[list[EpisodeStat], list[int]]:
        """Episodes and lags since the last call (each reported once)."""
        with self.lock:
            episodes = list(self.episode_queue)
            self.episode_queue.clear()
            lags = list(self.lags)
            self.lags.clear()
        return episodes, lags

    def recent_lag(self) -> float:
        with self.lock:
            return sum(self.recent_lags) / len(self.recent_lags) if self.recent_lags else math.nan

    def to_checkpoint(self) -> dict[str, float | int]:
        """Caller holds ``lock`` (so the counts agree with a replay snapshot taken with them)."""
        return {
            "updates": self.updates,
            "samples": self.samples,
            "batches": self.batches,
            "episodes": self.episodes,
            "seconds": self.training_seconds(),
        }

    def restore(self, counters: dict[str, float | int]) -> None:
        self.updates = int(counters["updates"])
        self.samples = int(counters["samples"])
        self.batches = int(counters.get("batches", 0))
        self.episodes = int(counters["episodes"])
        self.restored_seconds = float(counters.get("seconds", 0.0))
