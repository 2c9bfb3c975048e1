"""The wire protocol's vocabulary: version, message kinds, the four message dataclasses, WireError.

Everything the other wire modules share and nothing that checks or encodes: :mod:`header` checks a
header's structure, :mod:`validation` checks a message's contents, and :mod:`wire` (the module to
import) turns these dataclasses into frames and back. It imports no other wire module, so all three
can import it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zmqrl.types import EpisodeStat, RolloutBatch, TransitionBatch, Weights

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
    batch: TransitionBatch | RolloutBatch
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
