"""Replay for the learner: ``make_replay`` builds the configured buffer behind ``zmqrl.core.Replay``.

Modules, from the bottom up:

Each kind of replay is one class implementing ``zmqrl.core.Replay`` itself, every add
all-or-nothing by checking everything that can fail before its first write (storage.py):

* ``storage``: the preallocated thread-safe ring every kind shares (``Ring``, ``DenseRows``) and
  ``UniformReplay``;
* ``sumtree``, ``priorities`` and ``prioritized``: ``PrioritizedReplay`` (proportional, Ape-X) on
  that ring, with the bounds that keep any one row or peer from dominating its draws and the
  importance exponent's ``BetaSchedule``;
* ``frame_pool`` and ``frames``: ``FramePool`` (image planes stored once each, by content) and
  the kinds that keep stacked frames in it (``SharedFramesReplay``, ``SharedFramesPrioritizedReplay``);
* ``factory``: ``make_replay`` and ``replay_footprint`` (sizing, the log line, refusals);
* ``ratelimit``: the replay-ratio limiter between the learner's ingest and training threads;
* ``rollout_queue``: what an on-policy learner has instead of replay, a bounded first-in,
  first-out queue of rollouts, and its limiter (room to insert, a batch to take).
"""

from zmqrl.replay.factory import (
    PRIORITY_BYTES_PER_ROW,
    SHARED_PLANES_PER_ROW,
    make_replay,
    replay_footprint,
)
from zmqrl.replay.frame_pool import FramePool, FramePoolFull
from zmqrl.replay.frames import SharedFramesPrioritizedReplay, SharedFramesReplay
from zmqrl.replay.priorities import (
    DEFAULT_ALPHA,
    DEFAULT_MAX_DRAW_RATIO,
    DEFAULT_MAX_INITIAL_PRIORITY_RATIO,
    DEFAULT_MAX_PRIORITY,
    DEFAULT_PRIORITY_EPS,
    INITIAL_MAX_PRIORITY,
    BetaSchedule,
    PriorityBounds,
)
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.ratelimit import NoLimit, RateLimiter, make_rate_limiter
from zmqrl.replay.rollout_queue import QueueLimiter, RolloutQueue
from zmqrl.replay.storage import UniformReplay
from zmqrl.replay.sumtree import SumTree

# What sits between a learner's ingest and its training: a replay ratio (or none), or the queue's room.
Limiter = RateLimiter | NoLimit | QueueLimiter

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_DRAW_RATIO",
    "DEFAULT_MAX_INITIAL_PRIORITY_RATIO",
    "DEFAULT_MAX_PRIORITY",
    "DEFAULT_PRIORITY_EPS",
    "INITIAL_MAX_PRIORITY",
    "PRIORITY_BYTES_PER_ROW",
    "SHARED_PLANES_PER_ROW",
    "BetaSchedule",
    "FramePool",
    "FramePoolFull",
    "Limiter",
    "NoLimit",
    "PrioritizedReplay",
    "PriorityBounds",
    "QueueLimiter",
    "RateLimiter",
    "RolloutQueue",
    "SharedFramesPrioritizedReplay",
    "SharedFramesReplay",
    "SumTree",
    "UniformReplay",
    "make_rate_limiter",
    "make_replay",
    "replay_footprint",
]
