"""The sync-model rules for weight versions, both halves, kept out of the agents.

Learner side, :class:`WeightsNumbering`: each published snapshot carries a number that grows
whenever the weights changed since the previous one (republishing the same weights reuses it, so
it costs actors nothing) and that starts above a floor, the highest number a previous learner of
the run published (``zmqrl.learner.versions`` keeps it on disk), so actors never mistake new
weights for old after a restart.

Actor and evaluator side, :class:`WeightsClient`: it hands the policy only a strictly newer
snapshot, so a late or duplicated publish can never roll an actor back, and it knows which
version the policy acts with (what an actor stamps its samples with). A snapshot the policy
refuses (names or shapes of another network) is counted as a bad message and changes nothing.

Neither touches a socket: serial mode, which has none, numbers and loads weights the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zmqrl.core import Policy
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.wire import WireError
from zmqrl.types import Weights


class WeightsNumbering:
    """Numbers the learner's snapshots: a new number only after ``changed()``, always above ``floor``."""

    def __init__(self, floor: int = 0) -> None:
        self.version = max(0, int(floor))  # the number of the last snapshot stamped (0: none yet)
        self._changed = True  # the initial weights were never stamped

    def changed(self) -> None:
        """The weights changed (an update ran): the next ``stamp`` gets a new number."""
        self._changed = True

    def continue_after(self, floor: int) -> None:
        """After a restart: the next snapshot is numbered above ``floor`` (the highest version
        published before in this run, or the one a checkpoint held)."""
        if floor >= self.version:
            self.version = int(floor)
            self._changed = True

    def stamp(self, arrays: Mapping[str, np.ndarray]) -> Weights:
        """``arrays`` as a published snapshot, with its number."""
        if self._changed:
            self.version += 1
            self._changed = False
        return Weights(self.version, dict(arrays))


class WeightsClient:
    """Gives ``policy`` newer weights only, and remembers the version it acts with.

    ``bad`` (a fallback is made when None) counts the snapshots the policy refused; the caller's
    channel tally, so that ``bad_messages`` says everything that was dropped.
    """

    def __init__(self, policy: Policy, bad: BadMessages | None = None, version: int = 0) -> None:
        self.policy = policy
        self.bad = bad if bad is not None else BadMessages("weights")
        self.version = version  # 0: the policy's initial weights, never synced
        self.loads = 0

    def offer(self, weights: Weights) -> bool:
        """Load ``weights`` into the policy if their version is newer than the one it holds;
        returns whether they were loaded (False changes nothing)."""
        if weights.version <= self.version:
            return False
        try:
            self.policy.load_weights(weights.arrays)
        except ValueError as exc:
            self.bad.record(WireError(f"weights version {weights.version} do not fit the policy: {exc}"))
            return False
        self.version = int(weights.version)
        self.loads += 1
        return True
