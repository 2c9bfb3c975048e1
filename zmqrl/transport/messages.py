"""The wire protocol's vocabulary: version, message kinds, the four message dataclasses, WireError.

Everything the other wire modules share and nothing that checks or encodes: :mod:`header` checks a
header's structure, :mod:`validation` checks a message's contents, and :mod:`wire` (the module to
import) turns these dataclasses into frames and back. It imports no other wire module, so all three
can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import numpy as np

from zmqrl.types import (
    SEQUENCE_LEARNED,
    Batch,
    EpisodeStat,
    RolloutBatch,
    SequenceBatch,
    TransitionBatch,
    Weights,
    rollout_columns,
)

# --------------------------------------------------------------------------------------------
# Protocol constants
# --------------------------------------------------------------------------------------------

# Bumped on any incompatible header or framing change; receivers reject every other value, so
# mixed-version deployments fail loudly instead of misreading each other.
PROTO_VERSION = 1

# Values of the header's "kind" field.
KIND_SAMPLES = "samples"  # actor -> learner: a batch of n-step transitions plus finished episodes
# actor -> learner: fixed-length on-policy rollouts plus finished episodes. No PROTO_VERSION bump:
# framing and every other kind are unchanged, and a receiver that predates it refuses the new kind
# by name ("unknown message kind"), counted and dropped like any bad message (docs/protocol.md).
KIND_ROLLOUTS = "rollouts"
# actor -> learner: R2D2's windows with their core state plus finished episodes (no bump: as rollouts).
KIND_SEQUENCES = "sequences"
KIND_WEIGHTS = "weights"  # learner -> actors: a versioned snapshot of the acting network
KIND_HEARTBEAT = "heartbeat"  # any role -> supervisor: liveness, counters, bound endpoints
KIND_STOP = "stop"  # supervisor -> everyone: shut down cleanly

# Name of the optional sixth samples array: the actor's initial replay priorities.
PRIORITY_FIELD = "priority"


class WireError(ValueError):
    """The one error type every decoder raises for any malformed/foreign message."""


# A fingerprint value: a scalar, or a short flat list of scalars (shapes, per-dimension bounds).
FingerprintScalar = str | int | float | bool
FingerprintValue = FingerprintScalar | list[FingerprintScalar]
Fingerprint = dict[str, FingerprintValue]


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@dataclass
class SamplesMsg:
    """Actor -> learner: experience collected under ``weights_version`` plus finished episodes.

    One dataclass for both kinds of experience, because everything but the batch (sequence
    numbers, policy lag, episodes, the channel) is the same: ``batch`` is a ``TransitionBatch``
    (off-policy runs; the wire kind ``"samples"``) or a ``RolloutBatch`` (on-policy runs; the kind
    ``"rollouts"``). The encoder picks the kind from the batch's type, and a learner refuses the
    one its run does not train on (``SampleSpec.rollout_length``).

    ``seq`` counts this actor's messages from 0 so the learner can spot gaps (drops) per actor.
    """

    actor_id: int
    seq: int
    weights_version: int
    batch: Batch  # a SequenceBatch (recurrent replay runs) travels as the kind "sequences"
    episodes: list[EpisodeStat]
    # Optional initial replay priorities (B,) float32 >= 0, computed by the actor (Ape-X); sent as a
    # sixth array frame named "priority". None: the learner gives new rows its maximum priority.
    # Transitions only: rollouts carry none.
    priorities: np.ndarray | None = None


class MessageInfo(NamedTuple):
    """What a group keeps of each of its messages besides its rows: who sent it, its place in the
    sender's sequence, the weights it was acted with, its rows' span in the group's batch
    (``start``..``stop``) and its finished episodes."""

    actor_id: int
    seq: int
    weights_version: int
    start: int
    stop: int
    episodes: list[EpisodeStat]

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class SampleGroup:
    """Valid messages in the order received, and their rows concatenated in that order: all
    transitions (``batch`` a TransitionBatch) or all rollouts (a RolloutBatch), never mixed.

    Each message is an :class:`MessageInfo` (``infos``), not a ``SamplesMsg``: ingest needs only
    its sender, sequence, version and episodes, and a message object with a view of each column
    costs far more than the record, on every message.
    ``messages`` gives them as messages where that is needed (a group split by policy lag or by
    a failed content scan: rare)."""

    infos: tuple[MessageInfo, ...]
    batch: Batch
    priorities: np.ndarray | None  # all the messages carry priorities, or none does (rollouts: none)
    # The messages it was built from (``of``), if it was: rollouts cannot be cut back by rows.
    originals: tuple[SamplesMsg, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return self.batch.size

    @property
    def messages(self) -> tuple[SamplesMsg, ...]:
        """Each message with its rows as views of the group's (transitions), or as it came."""
        if self.originals is not None:
            return self.originals
        batch, priorities = self.batch, self.priorities
        if isinstance(batch, SequenceBatch):
            return self._sequence_messages(batch)
        return tuple(
            SamplesMsg(
                info.actor_id,
                info.seq,
                info.weights_version,
                TransitionBatch(*(col[info.start : info.stop] for col in cast(TransitionBatch, batch))),
                info.episodes,
                None if priorities is None else priorities[info.start : info.stop],
            )
            for info in self.infos
        )

    def _sequence_messages(self, batch: SequenceBatch) -> tuple[SamplesMsg, ...]:
        """Each message's windows: its span counts learned steps (``size``), and every window has
        at least one, so the running count finds each message's first and last window."""
        ends = np.concatenate([[0], np.cumsum(np.count_nonzero(batch.mask == SEQUENCE_LEARNED, axis=1))])
        out = []
        for info in self.infos:
            lo, hi = int(np.searchsorted(ends, info.start)), int(np.searchsorted(ends, info.stop))
            rows = SequenceBatch(*(col[lo:hi] for col in batch))
            out.append(SamplesMsg(info.actor_id, info.seq, info.weights_version, rows, info.episodes))
        return tuple(out)

    def only(self, keep: Sequence[int]) -> SampleGroup | None:
        """The group of the messages at indices ``keep`` (in order); None when there are none."""
        if len(keep) == len(self.infos):
            return self
        messages = self.messages
        return SampleGroup.of([messages[i] for i in keep]) if keep else None

    @classmethod
    def of(cls, messages: Sequence[SamplesMsg]) -> SampleGroup:
        """Merge ``messages`` (at least one; all of one batch type; all with priorities or all
        without).

        Every column is concatenated along its first axis in message order. For rollouts that
        keeps final_obs right too: its rows follow the truncated flags in row-major order, and
        concatenating whole rows in message order puts each message's flags, and its final_obs
        rows, after the previous message's, so the k-th truncated step of the merged batch still
        owns its k-th final_obs row.
        """
        if not messages:
            raise ValueError("a sample group needs at least one message")
        kind = type(messages[0].batch)
        if any(type(m.batch) is not kind for m in messages):
            raise ValueError("a sample group's messages must all carry transitions, or all rollouts")
        infos, start = [], 0
        for m in messages:
            stop = start + m.batch.size
            infos.append(MessageInfo(m.actor_id, m.seq, m.weights_version, start, stop, m.episodes))
            start = stop
        if len(messages) == 1:  # the common case under a replay ratio: nothing to copy
            only = messages[0]
            return cls(tuple(infos), only.batch, only.priorities, (only,))
        with_priorities = {m.priorities is not None for m in messages}
        if len(with_priorities) != 1:
            raise ValueError("a sample group's messages must all carry priorities, or none")
        if kind is RolloutBatch:
            with_state = {m.batch.core_state is not None for m in messages}  # type: ignore[union-attr]
            if len(with_state) != 1:
                raise ValueError("a sample group's rollouts must all carry a core state, or none")
            columns = zip(*(rollout_columns(m.batch) for m in messages), strict=True)  # type: ignore[arg-type]
        else:
            columns = zip(*(m.batch for m in messages), strict=True)
        merged = [np.concatenate(col) for col in columns]
        batch: Batch = kind(*merged)
        priorities = (
            np.concatenate([m.priorities for m in messages if m.priorities is not None])
            if with_priorities == {True}
            else None
        )
        return cls(tuple(infos), batch, priorities, tuple(messages))


@dataclass
class WeightsMsg:
    """Learner -> actors: the acting network's parameters; ``agent`` guards against a mismatch."""

    weights: Weights
    agent: str  # agent kind, e.g. "dqn"
    # The learner's run fingerprint (settings its actors must share: env, spaces, network, n-step,
    # gamma), so a mismatched actor can refuse itself. None: an older learner that sends none.
    fingerprint: Fingerprint | None = None
    # Transitions the learner had received when it published this snapshot: lets an evaluator put
    # its results on the same x-axis (env steps) as the learner's. None: not sent.
    env_steps: int | None = None


@dataclass
class HeartbeatMsg:
    """Any role -> supervisor: proof of life plus enough state to show progress and endpoints."""

    role: str
    id: int
    pid: int
    time: float  # sender's wall clock (time.time()), seconds
    state: str  # "starting" | "running" | "finished" | "stopping" (any short string accepted)
    counters: dict[str, float | int]
    info: dict[str, str]  # e.g. bound endpoints


@dataclass
class StopMsg:
    """Supervisor -> everyone: stop; ``reason`` is for logs only."""

    reason: str


Message = SamplesMsg | WeightsMsg | HeartbeatMsg | StopMsg
