"""Plain data that crosses module boundaries: transition batches, rollouts, weights, episode stats.

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


class RolloutBatch(NamedTuple):
    """R fixed-length on-policy rollouts of T steps, one row per (sub-)env: what an on-policy actor
    sends and the learner's rollout queue holds (no replay; see ``zmqrl.agents.appo``).

    Steps are stored as they happened, with the episode boundaries marked: after a step that
    ``terminated`` or was ``truncated``, the next observation of the row is the new episode's first.
    A terminated step bootstraps nothing; a truncated one bootstraps from the observation the
    episode was cut at, which the reset replaced in ``obs``: those are ``final_obs``, one per
    truncated step in row-major order (``final_obs[k]`` belongs to the k-th True of
    ``truncated.reshape(-1)``). A step is never both: termination wins and the actor sends it as
    terminated only.

    A recurrent policy's rollouts (``agent.core: lstm``) also carry ``core_state``: each row's
    LSTM state ``(h, c)`` before its first step, which the learner unrolls the row from (zeroing
    it after every done step, as the actor did). None for a feed-forward policy.
    """

    obs: np.ndarray  # (R, T + 1, *obs_shape): obs[:, t] acted on at step t; obs[:, T] bootstraps the row
    action: np.ndarray  # (R, T) int64 for discrete actions; (R, T, act_dim) float32 for continuous
    reward: np.ndarray  # (R, T) float32: the env's reward of each step
    terminated: np.ndarray  # (R, T) bool: the episode ended at this step (no bootstrap)
    truncated: np.ndarray  # (R, T) bool: the episode was cut at this step (bootstrap from final_obs)
    logp: np.ndarray  # (R, T) float32: log-probability of the action under the policy that acted
    final_obs: np.ndarray  # (K, *obs_shape): the observation each truncated step was cut at
    core_state: np.ndarray | None = None  # (R, 2, H) float32: h, c before step 0 (recurrent only)

    @property
    def rows(self) -> int:
        """Rollouts in the batch (R)."""
        return int(self.reward.shape[0])

    @property
    def length(self) -> int:
        """Steps per rollout (T)."""
        return int(self.reward.shape[1]) if self.reward.ndim == 2 else 0

    @property
    def size(self) -> int:
        """Env transitions (R * T): what counters, replay ratios and env-step axes count, as a
        ``TransitionBatch``'s size counts its transitions."""
        return int(self.reward.size)


# Column names in wire order of a rollouts message; a recurrent run's message adds CORE_STATE_FIELD
# after them.
ROLLOUT_FIELDS: tuple[str, ...] = RolloutBatch._fields[:7]
CORE_STATE_FIELD = "core_state"


def rollout_columns(batch: RolloutBatch) -> list[np.ndarray]:
    """The batch's arrays in wire order: ``ROLLOUT_FIELDS``, then ``core_state`` if it has one."""
    columns = list(batch[:7])
    if batch.core_state is not None:
        columns.append(batch.core_state)
    return columns


class SequenceBatch(NamedTuple):
    """R fixed-length windows of one episode each, with the recurrent core's state at each window's
    start: what a recurrent replay actor (R2D2, ``agent.kind: r2d2``) sends and its replay holds.

    A window has L = burn_in + T positions. Windows of an episode start every T steps, the first at
    step ``-burn_in``, so consecutive windows overlap by ``burn_in`` steps and every step of the
    episode is learned from in exactly one window (at its positions ``>= burn_in``). Positions that
    lie outside the episode are padding: a window never crosses an episode boundary, so the learner
    unrolls it from ``core_state`` without resets. ``mask`` says what each position is: 0 padding
    (its obs a copy of the nearest real one, so every obs is one the env can produce), 1 a step
    that only warms the state (burn-in), 2 a step learned from. ``obs`` has one more position: the
    observation after the window's last step (the next window's, or the episode's final one,
    which a truncated episode bootstraps from).
    """

    obs: np.ndarray  # (R, L + 1, *obs_shape): obs[:, t] acted on at position t; obs[:, L] follows the last
    action: np.ndarray  # (R, L) int64: the action taken at each position (0 on padding)
    reward: np.ndarray  # (R, L) float32: the env's reward of each step (0 on padding)
    terminated: np.ndarray  # (R, L) bool: the episode terminated at this step (its last real one)
    mask: np.ndarray  # (R, L) uint8: 0 padding, 1 burn-in, 2 learned (see the class docstring)
    core_state: np.ndarray  # (R, 2, H) float32: the core's (h, c) before the window's first real step

    @property
    def rows(self) -> int:
        """Windows in the batch (R)."""
        return int(self.reward.shape[0])

    @property
    def size(self) -> int:
        """Env steps learned from (mask 2): each step of an episode is learned in one window only,
        so this counts env transitions as a ``TransitionBatch``'s size does (counters, env-step axes)."""
        return int(np.count_nonzero(self.mask == SEQUENCE_LEARNED))


# Column names in wire order of a sequences message (replay snapshots store them so too).
SEQUENCE_FIELDS: tuple[str, ...] = SequenceBatch._fields
# SequenceBatch.mask's values.
SEQUENCE_PADDING, SEQUENCE_BURN_IN, SEQUENCE_LEARNED = 0, 1, 2

# What an actor sends and a learner trains on: n-step transitions (replay), rollouts (on-policy) or
# sequences (recurrent replay).
Batch = TransitionBatch | RolloutBatch | SequenceBatch


class Weights(NamedTuple):
    """A versioned snapshot of the acting network: what the learner publishes to actors."""

    version: int  # strictly increasing per run; 0 means "initial, never published"
    arrays: dict[str, np.ndarray]  # parameter name -> array (float32, C-contiguous)


class EpisodeStat(NamedTuple):
    """One finished training episode, reported by the actor that played it."""

    ret: float  # undiscounted return
    length: int  # env steps
