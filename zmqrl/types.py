"""Plain data that crosses module boundaries: transition batches, weights, episode stats.

These are NamedTuples rather than dicts so that a misspelt column is an AttributeError at the
point of use, not a silent KeyError three processes away.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TransitionBatch(NamedTuple):
    """A column-major batch of n-step transitions, as stored in replay and sent on the wire.

    The learner's bootstrap target is ``reward + discount * V(next_obs)``: ``discount`` already
    folds in both the n-step horizon (``gamma ** k`` for a window of k real steps) and termination
    (0 when the episode terminated inside the window), so the learner never needs ``n`` or ``gamma``.
    """

    obs: np.ndarray  # (B, *obs_shape), the env's observation dtype
    action: np.ndarray  # (B,) int64 for discrete actions; (B, act_dim) float32 for continuous
    reward: np.ndarray  # (B,) float32: sum_{i<k} gamma**i * r_{t+i}
    next_obs: np.ndarray  # (B, *obs_shape): the observation k steps later
    discount: np.ndarray  # (B,) float32: gamma**k, or 0.0 if the episode terminated in the window

    @property
    def size(self) -> int:
        """Number of transitions (``len()`` would count the five columns: it is a tuple)."""
        return int(self.reward.shape[0])


# Column names in wire order; the wire format and replay buffer both iterate this.
BATCH_FIELDS: tuple[str, ...] = TransitionBatch._fields


class Weights(NamedTuple):
    """A versioned snapshot of the acting network: what the learner publishes to actors."""

    version: int  # strictly increasing per run; 0 means "initial, never published"
    arrays: dict[str, np.ndarray]  # parameter name -> array (float32, C-contiguous)


class EpisodeStat(NamedTuple):
    """One finished training episode, reported by the actor that played it."""

    ret: float  # undiscounted return
    length: int  # env steps
