"""Envs with illegal actions: a Dict observation ``{"action_mask": ..., <one other entry>: Box}``
(the common convention: PettingZoo's classic games, many board and text envs) as one flat row.

:class:`ActionMaskObservation` turns such an env's observation into the other entry, flattened,
followed by the mask as ``num_actions`` components of 1 (legal) or 0 (illegal), in the entry's
dtype. ``make_env`` chooses it from the observation space, so every role builds the same rows and
``sample_spec`` marks the run masked (``SampleSpec.action_mask``). Why the mask rides in the row
rather than in a column of its own: every path a row takes (n-step windows, the wire, the
learner's intake, replay, its snapshots, rollouts) carries it with no code of its own, each next
observation brings its own legal actions (what a DQN target maximises over), and a run that mixes
masked and unmasked rows is refused by their shape. The decoder checks the mask components
(0 or 1, at least one legal action, the action taken legal: ``zmqrl.transport.mask_checks``) and
the agents' networks set the values of illegal actions to ``MASKED_VALUE`` (``zmqrl.agents.masks``),
so acting, targets, log-probabilities, evaluation, ``load_policy`` and ONNX exports all obey it.
The network also sees the mask as input, which tells it which moves are available.

Scope: the other entry must be a Box (any shape: it is flattened, so an MLP torso reads it); an
image next to a mask (a CNN torso) waits for Dict observations with one array per key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.errors import EnvError

# The Dict observation's key that holds the legal actions, as the convention names it.
ACTION_MASK_KEY = "action_mask"
# The attribute by which ``sample_spec`` finds the adapter through any wrappers around it.
MASKED_ATTR = "zmqrl_action_mask"


def is_masked_space(space: Any) -> bool:
    """Whether ``space`` is a Dict observation carrying an ``action_mask`` entry."""
    return isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces


def masked_entry(space: gym.spaces.Dict, num_actions: int) -> str:
    """The key of the entry the agent observes beside the mask; EnvError says what does not fit."""
    mask = space.spaces[ACTION_MASK_KEY]
    if not isinstance(mask, (gym.spaces.Box, gym.spaces.MultiBinary)) or mask.shape != (num_actions,):
        raise EnvError(
            f"the observation's {ACTION_MASK_KEY!r} must be a Box or MultiBinary of shape ({num_actions},) "
            f"(one flag per action), got {mask}"
        )
    others = [key for key in space.spaces if key != ACTION_MASK_KEY]
    if len(others) != 1 or not isinstance(space.spaces[others[0]], gym.spaces.Box):
        raise EnvError(
            f"a masked Dict observation needs exactly one Box entry beside {ACTION_MASK_KEY!r}, got "
            f"{space}; several entries wait for Dict observations with one array per key"
        )
    return others[0]


def flat_row(entry: np.ndarray, mask: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """One observation row: ``entry`` flattened, then ``mask`` as 0/1 components, in ``dtype``."""
    row = np.empty(entry.size + mask.size, dtype)
    row[: entry.size] = entry.reshape(-1)
    row[entry.size :] = np.asarray(mask).reshape(-1) != 0
    return row


class ActionMaskObservation(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """A masked Dict observation as the flat row the agents take (the module docstring says why).

    The row's Box has the entry's bounds followed by ``[0, 1]`` per action, in the entry's dtype
    (a float32 entry gives float32 rows). A module-level class, so the env stays picklable.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        space, actions = env.observation_space, env.action_space
        if not isinstance(actions, gym.spaces.Discrete):
            raise EnvError(f"an action mask needs a Discrete action space, got {actions}")
        assert isinstance(space, gym.spaces.Dict)  # the factory chose this adapter for a Dict
        self._entry = masked_entry(space, int(actions.n))
        box = space.spaces[self._entry]
        assert isinstance(box, gym.spaces.Box)
        self._dtype = np.dtype(box.dtype)
        n = int(actions.n)
        low = np.concatenate([np.asarray(box.low, np.float64).reshape(-1), np.zeros(n)])
        high = np.concatenate([np.asarray(box.high, np.float64).reshape(-1), np.ones(n)])
        self.observation_space = gym.spaces.Box(
            low.astype(self._dtype), high.astype(self._dtype), dtype=self._dtype.type
        )
        setattr(self, MASKED_ATTR, True)

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return flat_row(np.asarray(observation[self._entry]), observation[ACTION_MASK_KEY], self._dtype)


def declares_action_mask(env: Any) -> bool:
    """Whether ``env`` (or a vector env's first sub-env) observes through ActionMaskObservation."""
    envs = getattr(env, "envs", None)
    inner = envs[0] if isinstance(envs, (list, tuple)) and envs else env
    lookup = getattr(inner, "get_wrapper_attr", None)
    if lookup is None:
        return bool(getattr(inner, MASKED_ATTR, False))
    try:
        return bool(lookup(MASKED_ATTR))
    except AttributeError:
        return False


def as_masked_rows(obs: Mapping[str, Any], dtype: np.dtype[Any]) -> np.ndarray:
    """A masked Dict observation, one ``{key: (..)}`` or a batch ``{key: (B, ..)}`` as a vector env
    gives it, as the rows ActionMaskObservation makes (what ``load_policy`` is given by a user
    who plays the raw env): ``(B, D + n)`` for a batch, ``(D + n,)`` for one."""
    keys = [key for key in obs if key != ACTION_MASK_KEY]
    if ACTION_MASK_KEY not in obs or len(keys) != 1:
        raise ValueError(f"expected a Dict of {ACTION_MASK_KEY!r} and one other entry, got {list(obs)}")
    entry, mask = np.asarray(obs[keys[0]]), np.asarray(obs[ACTION_MASK_KEY])
    if mask.ndim == 1:
        return flat_row(entry, mask, dtype)
    return np.stack([flat_row(e, m, dtype) for e, m in zip(entry, mask, strict=True)])
