"""Several samples messages received together, their rows merged into one batch.

The learner's per-message costs (a replay transaction, the content scans, the lock and the
counters) are fixed, not per row, and with CartPole-sized messages they were most of the ingest
time. So the receiver takes the messages that are already queued, up to a limit, scans their
merged rows once, and the learner inserts them as one all-or-nothing replay add. Each message
still counts on its own: sequence numbers, policy lag, episodes, and a bad one is dropped alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zmqrl.transport.messages import SamplesMsg
from zmqrl.types import TransitionBatch


@dataclass(frozen=True)
class SampleGroup:
    """Valid messages in the order received, and their rows concatenated in that order."""

    messages: tuple[SamplesMsg, ...]
    batch: TransitionBatch
    priorities: np.ndarray | None  # all the messages carry priorities, or none does

    @property
    def size(self) -> int:
        return self.batch.size

    @classmethod
    def of(cls, messages: Sequence[SamplesMsg]) -> SampleGroup:
        """Merge ``messages`` (at least one; all with priorities or all without)."""
        if not messages:
            raise ValueError("a sample group needs at least one message")
        if len(messages) == 1:  # the common case under a replay ratio: nothing to copy
            only = messages[0]
            return cls((only,), only.batch, only.priorities)
        with_priorities = {m.priorities is not None for m in messages}
        if len(with_priorities) != 1:
            raise ValueError("a sample group's messages must all carry priorities, or none")
        columns = zip(*(m.batch for m in messages), strict=True)
        batch = TransitionBatch(*(np.concatenate(col) for col in columns))
        priorities = (
            np.concatenate([m.priorities for m in messages if m.priorities is not None])
            if with_priorities == {True}
            else None
        )
        return cls(tuple(messages), batch, priorities)
