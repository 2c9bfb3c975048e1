"""Ingest: what happens to a checked group of samples before it is in replay (the weights-version
check, the replay ratio, policy lag, the insert), and the learner's counters it adds to.

Receiving, decoding and checking happen before, in the learner's intake process (or, in serial
mode, in line); what is left here is cheap per group and runs on the training thread, between
updates, as the replay ratio admits it (zmqrl/learner/main.py, zmqrl/serial.py).

The counters live here because ingest is what moves them: it counts samples, batches, episodes
and stale drops under the replay lock, and the training side only reads them (and counts its
updates), for reporting and checkpoints.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from zmqrl.config import Config
from zmqrl.core import Replay
from zmqrl.replay import Limiter, NoLimit
from zmqrl.runtime.testhooks import Faults
from zmqrl.spec import SampleSpec
from zmqrl.transport.channels import ZERO_COPY_MIN_OBS_BYTES, BadMessages
from zmqrl.transport.messages import MessageInfo
from zmqrl.transport.sample_channel import SampleGroup
from zmqrl.transport.wire import SamplesMsg, WireError
from zmqrl.types import EpisodeStat

log = logging.getLogger("zmqrl.learner")

# Longest single wait on the replay-ratio limiter, so waiting threads still see stops.
LIMITER_WAIT_SECONDS = 0.1
# Most messages merged into one replay add (small rows, no replay ratio): the learner's intake
# merges what arrives while the learner trains, up to this many, so that the fixed cost of a
# group's insert on the training thread (its decode, admission, lags, replay transaction) is
# shared by more rows the more there are (128 x 64 CartPole rows are 8,192).
INGEST_GROUP_MESSAGES = 128

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


def group_limit(spec: SampleSpec, limiter: Limiter | None = None) -> int:
    """Messages ingest merges into one replay add: several for small rows, one for rows that
    arrive zero-copy by default (merging would copy them; see SampleReceiver), and one under a
    replay ratio or an on-policy queue (``limiter`` not NoLimit: a group waits for room for all
    its rows at once, and room is at most the limiter's tolerance)."""
    if limiter is not None and not isinstance(limiter, NoLimit):
        return 1
    return INGEST_GROUP_MESSAGES if spec.obs_bytes < ZERO_COPY_MIN_OBS_BYTES else 1


def largest_add(spec: SampleSpec, max_message_mb: int) -> int:
    """The most rows one replay add of ingest can carry, whatever peers send: a group's messages,
    each within the spec's batch limit and with an observation column of at most
    ``transport.max_message_mb`` (a larger frame never reaches the learner). Shared-frame replay's
    worst-case memory depends on it (zmqrl.replay.factory.replay_footprint)."""
    per_message = min(spec.max_batch, max_message_mb * 2**20 // max(1, spec.obs_bytes))
    return max(1, per_message) * group_limit(spec)


def warn_if_queues_hide_lag(cfg: Config) -> None:
    """With a replay ratio, every queued transition is inserted late: say so when the OS's TCP
    buffers are left at their (large) default."""
    if cfg.learner.samples_per_insert is not None and not cfg.transport.samples_buffer_kb:
        log.warning(
            "learner.samples_per_insert is set but transport.samples_buffer_kb is 0: transitions "
            "waiting in the OS's TCP buffers will be inserted long after they were acted (see "
            "policy_lag); consider --set transport.samples_buffer_kb=4 --set transport.samples_hwm=1"
        )


class Ingest:
    """Admits valid samples messages into replay, all or nothing, and counts them.

    A batch waits for the replay-ratio limiter (backpressure: while it waits the socket is not
    read, so the actors' queues fill and their sends block); a batch acted with weights more than
    ``max_policy_lag`` versions older than those published is dropped and counted instead.

    One check needs the learner's state, so it is made here rather than by the receiver: a batch
    stamped with a weights version above the newest published one (no actor can hold it: a
    forged stamp, which would otherwise pass any ``max_policy_lag`` with a negative lag) is a bad
    message: counted in the receiver's tally (``bad`` of ``accept_group``), logged, dropped alone.
    """

    def __init__(
        self,
        replay: Replay,
        limiter: Limiter,
        counters: LearnerCounters,
        *,
        spec: SampleSpec,
        published_version: Callable[[], int],
        min_replay_size: int,
        max_policy_lag: int | None,
        faults: Faults | None = None,
    ) -> None:
        self.spec = spec
        # Messages refused here when no receiver's tally is given (serial mode, benchmarks).
        self.bad = BadMessages("learner ingest", log)
        self.replay = replay
        self.limiter = limiter
        self.counters = counters
        self._published_version = published_version
        self._min_replay_size = min_replay_size
        self._max_policy_lag = max_policy_lag
        self.replay_ready = threading.Event()  # set once replay holds min_replay_size transitions
        # A test's faulty replay add (zmqrl.runtime.testhooks) in place of replay's own, when given.
        self._faulty_add = faults.replay_add(lambda *a: self.replay.add(*a)) if faults is not None else None
        self.note_replay_size()

    def accept(self, msg: SamplesMsg, stop: threading.Event | None = None) -> bool:
        """Insert (or drop as stale or bad) one message; False if ``stop`` was set while it waited."""
        return self.accept_group(SampleGroup.of([msg]), stop)

    def accept_group(
        self, group: SampleGroup, stop: threading.Event | None = None, bad: BadMessages | None = None
    ) -> bool:
        """Insert a group's messages as one replay add (dropping, and counting, any too stale, and
        any bad one in ``bad``, default ``self.bad``); False if ``stop`` was set while it waited
        for the replay ratio (without ``stop``: once the ratio refused it for LIMITER_WAIT_SECONDS).

        Under a replay ratio, give it groups of one message: a group waits for room for all of
        its rows at once, and room is at most the limiter's tolerance.
        """
        admitted = self.admit(group, bad)
        if admitted is None:
            return True
        while not self.insert(admitted, LIMITER_WAIT_SECONDS):
            if stop is None or stop.is_set():
                return False
        return True

    def admit(self, group: SampleGroup, bad: BadMessages | None = None) -> SampleGroup | None:
        """``group`` less its messages stamped with a weights version above the newest published
        (recorded in ``bad``, default ``self.bad``); None if none is left. Once per group: what is
        admitted may then wait for the replay ratio (``insert``) as long as it takes."""
        return self._admitted(group, bad or self.bad)

    def insert(self, group: SampleGroup, wait: float = 0.0) -> bool:
        """Insert an admitted group as one replay add, all or nothing, once the replay ratio has
        room for it (waiting up to ``wait`` seconds); the too stale messages are dropped and
        counted instead. False, and nothing changed, if the ratio had no room."""
        n = group.size
        counters = self.counters
        if not self.limiter.await_insert(n, wait):
            return False
        # Lag is measured when a batch would enter replay; never negative (see _admitted: the
        # published version only grows, so what was not from the future then is not now).
        published = self._published_version()
        infos = group.infos
        lags = [published - info.weights_version for info in infos]
        fresh: SampleGroup | None = group
        stale: list[MessageInfo] = []
        most = self._max_policy_lag
        if most is not None and max(lags) > most:
            fresh = group.only([i for i, lag in enumerate(lags) if lag <= most])
            stale = [info for info, lag in zip(infos, lags, strict=True) if lag > most]
        with counters.lock:  # replay and counters change together, so a checkpoint sees them agree
            for info in stale:
                counters.stale_batches += 1
                counters.stale_samples += info.size
            if fresh is not None:
                (self._faulty_add or self.replay.add)(fresh.batch, fresh.priorities)
                self.limiter.inserted(fresh.size)
                counters.samples += fresh.size
                counters.batches += len(fresh.infos)
            for info in infos:
                if info.episodes:
                    counters.episodes += len(info.episodes)
                    counters.episode_queue.extend(info.episodes)
            counters.lags.extend(lags)
            counters.recent_lags.extend(lags)
        self.note_replay_size()
        return True

    def _admitted(self, group: SampleGroup, bad: BadMessages) -> SampleGroup | None:
        """``group`` less its bad messages (recorded in ``bad``); None if none is left."""
        published = self._published_version()
        infos = group.infos
        keep = [i for i, info in enumerate(infos) if info.weights_version <= published]
        if len(keep) == len(infos):
            return group
        for info in infos:
            if info.weights_version > published:
                bad.record(
                    WireError(
                        f"weights_version {info.weights_version} is above the newest published "
                        f"({published}): no actor can have acted with it"
                    )
                )
        return group.only(keep)

    def note_replay_size(self) -> None:
        if not self.replay_ready.is_set() and len(self.replay) >= self._min_replay_size:
            self.replay_ready.set()
