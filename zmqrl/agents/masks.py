"""Action masks on the agents' side: the legal actions a row carries, and outputs that obey them.

A masked run's observation rows end with ``num_actions`` components, 1 for a legal action and 0
for an illegal one (``zmqrl.envs.action_masks`` says why they ride in the row), or, for records
(a Dict observation of several keys), their field ``action_mask`` holds them: numpy reads it by
name, torch out of the records' bytes at the field's place (``zmqrl.agents.keyed_nets``). The networks set
every illegal action's output to ``MASKED_VALUE``: DQN's Q-values (so greedy acting, the target's
max and double DQN's argmax only ever see legal actions) and APPO's logits (so the softmax gives
illegal actions exactly zero probability). One rule at the networks' output means every user of
them, numpy or torch, actor, learner, evaluator, ``load_policy`` or an ONNX export, obeys it.

Why a large finite value and not -inf: a state with no legal action (a terminal one, which a
transition's target multiplies by a zero discount) would turn a max of -inf into ``0 * -inf =
NaN``; -1e9 times zero is zero. exp(-1e9 - max) is exactly 0 in float32, so a masked softmax puts
zero probability on illegal actions, and their log-probabilities (about -1e9) times that zero add
nothing to an entropy: finite everywhere. No torch at import: actors act in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zmqrl.types import ACTION_MASK_KEY

if TYPE_CHECKING:
    import torch

    from zmqrl.agents.keyed import Field

# The output of an illegal action (a Q-value or a logit); see the module docstring.
MASKED_VALUE = -1e9


def legal_actions(obs: np.ndarray, num_actions: int) -> np.ndarray:
    """The legal actions ``(B, num_actions)`` bool of masked observation rows ``(B, D + num_actions)``,
    or of records ``(B,)`` (their field ``action_mask``)."""
    obs = np.asarray(obs)
    if obs.dtype.names is not None:
        return obs[ACTION_MASK_KEY].reshape(len(obs), num_actions) > 0.5
    return obs[:, -num_actions:] > 0.5


def mask_numpy(values: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """``values`` ``(B, A)`` with each row's illegal actions (per ``obs``) set to MASKED_VALUE."""
    legal = legal_actions(obs, values.shape[1])
    return np.where(legal, values, np.float32(MASKED_VALUE)).astype(values.dtype, copy=False)


def mask_torch(values: torch.Tensor, obs: torch.Tensor, field: Field | None = None) -> torch.Tensor:
    """``mask_numpy`` in torch, differentiable (illegal actions get no gradient). ``field``: the
    records' ``action_mask`` (``zmqrl.agents.keyed.mask_field``), ``obs`` then their bytes
    ``(B, itemsize)`` (or ``keyed_nets.KeyTensors``: an ONNX export's keys)."""
    import torch

    if field is not None:
        from zmqrl.agents.keyed_nets import field_tensor

        legal = field_tensor(obs, field).reshape(values.shape[0], -1) > 0.5
    else:
        legal = obs.reshape(obs.shape[0], -1)[:, -values.shape[1] :] > 0.5
    return torch.where(legal, values, torch.full_like(values, MASKED_VALUE))


def random_legal(rng: np.random.Generator, obs: np.ndarray, num_actions: int) -> np.ndarray:
    """One uniformly random legal action per row of masked ``obs`` (int64 ``(B,)``): the largest
    of independent uniform draws over the legal actions is each of them alike. A row with no
    legal action (a terminal state, never acted on) gets action 0."""
    legal = legal_actions(obs, num_actions)
    draws = rng.random(legal.shape)
    return np.where(legal, draws, -1.0).argmax(axis=1).astype(np.int64)
