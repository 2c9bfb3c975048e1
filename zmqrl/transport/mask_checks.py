"""The content checks of a masked run's rows: their legal-action components, and the actions taken.

A masked run's observation rows end with ``num_actions`` components that flag the state's legal
actions, or its records hold them in their field ``action_mask`` (``SampleSpec.action_mask``,
``zmqrl.envs.action_masks``). The observation bounds already
keep them within [0, 1]; what this run can mean is narrower: each is exactly 0 or 1, every state
acted in has at least one legal action and the action taken is one of them, and every state a
target bootstraps from (a transition's next observation with a discount above 0, every rollout
observation, a window's observation after its last real step unless that step terminated) has one
too. A terminal next observation may have none: its discount is 0, so no target reads it. A
window's padding positions are neither acted in nor learned from (their actions are 0 whatever
the mask) and copy a real observation, so only their flags are checked. Anything else is refused
with one WireError, counted and dropped by the receiver like every bad message, and never reaches
replay.
"""

from __future__ import annotations

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.fields import fail
from zmqrl.types import ACTION_MASK_KEY, SEQUENCE_PADDING, RolloutBatch, SequenceBatch, TransitionBatch


def _legal(obs: np.ndarray, what: str, spec: SampleSpec) -> np.ndarray:
    """The legal-action flags ``(N, A)`` bool of observation rows ``(N, D + A)`` or of records
    (their field ``action_mask``), after checking every flag is exactly 0 or 1."""
    n = int(spec.num_actions or 0)
    if obs.dtype.names is not None:
        flags = obs[ACTION_MASK_KEY].reshape(-1, n)
    else:
        flags = obs.reshape(-1, obs.shape[-1])[:, -n:]
    legal = flags == 1
    if not (legal | (flags == 0)).all():
        fail(f"{what}: an action-mask component is neither 0 nor 1")
    return legal


def _taken_legal(legal: np.ndarray, action: np.ndarray, what: str) -> None:
    """Every row has a legal action, and its action is one."""
    if not legal.any(axis=1).all():
        fail(f"{what}: a state acted in has no legal action (an empty action mask)")
    if not legal[np.arange(legal.shape[0]), action.reshape(-1)].all():
        fail(f"{what}: an action taken is illegal under its own action mask")


def check_masked_transitions(batch: TransitionBatch, spec: SampleSpec) -> None:
    """A masked run's transitions (actions already within [0, num_actions)); WireError if bad."""
    _taken_legal(_legal(batch.obs, "obs", spec), batch.action, "samples")
    next_legal = _legal(batch.next_obs, "next_obs", spec)
    bootstrapped = np.asarray(batch.discount) > 0
    if not np.asarray(next_legal.any(axis=1))[bootstrapped].all():
        fail("next_obs: a state bootstrapped from (discount > 0) has no legal action")


def check_masked_rollouts(batch: RolloutBatch, spec: SampleSpec) -> None:
    """A masked run's rollouts (actions already within [0, num_actions)); WireError if bad."""
    rows, steps = batch.reward.shape
    legal = _legal(batch.obs, "obs", spec).reshape(rows, steps + 1, -1)
    if not legal[:, steps].any(axis=1).all():
        fail("rollouts: a row's bootstrap observation has no legal action")
    _taken_legal(legal[:, :steps].reshape(rows * steps, -1), batch.action, "rollouts")
    if batch.final_obs.shape[0]:
        _legal(batch.final_obs, "final_obs", spec)


def check_masked_sequences(batch: SequenceBatch, spec: SampleSpec) -> None:
    """A masked run's windows (flags and actions already checked); WireError if bad. A window's
    real positions are one run ending at ``last``: its bootstrap observation is ``obs[last + 1]``
    (``obs[L]`` for a full window, else the copy of the episode's final observation)."""
    rows, length = batch.reward.shape
    legal = _legal(batch.obs, "obs", spec).reshape(rows, length + 1, -1)
    real = batch.mask != SEQUENCE_PADDING
    _taken_legal(legal[:, :length][real], batch.action[real], "sequences")
    last = length - 1 - real[:, ::-1].argmax(axis=1)  # every window has a real step (flags)
    every = np.arange(rows)
    bootstrapped = ~batch.terminated[every, last]
    if not legal[every, last + 1].any(axis=1)[bootstrapped].all():
        fail("sequences: a window's bootstrap observation (episode not terminated) has no legal action")
