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

Several entries beside the mask (an image and a vector, two vectors), or one image, travel as records instead
(``zmqrl.types``, :class:`MaskedRecordObservation`): the mask is then the records' field
``action_mask`` (uint8 0/1), every other key keeps its own dtype and encoder (an image key goes
through ``agent.torso``'s CNN), and the agents and the decoder read the legal actions out of that
field by name. Why one vector entry stays a flat row: its runs, configs and checkpoints predate
records and keep their layout. That entry must be a Box (flattened, so an MLP torso reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.envs.records import RecordObservation
from zmqrl.errors import EnvError
from zmqrl.types import ACTION_MASK_KEY, as_mask_flags

# The attribute by which ``sample_spec`` finds the adapter through any wrappers around it.
MASKED_ATTR = "zmqrl_action_mask"


def is_masked_space(space: Any) -> bool:
    """Whether ``space`` is a Dict observation carrying an ``action_mask`` entry."""
    return isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces


def other_entries(space: gym.spaces.Dict, num_actions: int) -> list[str]:
    """The keys the agent observes beside the mask (at least one); EnvError says what does not fit."""
    mask = space.spaces[ACTION_MASK_KEY]
    if not isinstance(mask, (gym.spaces.Box, gym.spaces.MultiBinary)) or mask.shape != (num_actions,):
        raise EnvError(
            f"the observation's {ACTION_MASK_KEY!r} must be a Box or MultiBinary of shape ({num_actions},) "
            f"(one flag per action), got {mask}"
        )
    others = [key for key in space.spaces if key != ACTION_MASK_KEY]
    if not others:
        raise EnvError(f"a masked Dict observation needs an entry beside {ACTION_MASK_KEY!r}, got {space}")
    return others


def masked_entry(space: gym.spaces.Dict, num_actions: int) -> str:
    """The key of the one entry beside the mask (a flat row's); EnvError says what does not fit."""
    others = other_entries(space, num_actions)
    if len(others) != 1 or not isinstance(space.spaces[others[0]], gym.spaces.Box):
        raise EnvError(
            f"a masked Dict observation of flat rows needs exactly one Box entry beside "
            f"{ACTION_MASK_KEY!r}, got {space}"
        )
    return others[0]


def discrete_actions(env: gym.Env[Any, Any]) -> int:
    """How many actions ``env`` has; EnvError unless they are Discrete (what a mask flags)."""
    actions = env.action_space
    if not isinstance(actions, gym.spaces.Discrete):
        raise EnvError(f"an action mask needs a Discrete action space, got {actions}")
    return int(actions.n)


def masked_observations(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """``env`` (a masked Dict observation) as the agents take it: one vector entry beside the mask
    as flat rows (:class:`ActionMaskObservation`); several entries, or one image ``(C, H, W)`` (which
    a CNN torso must see whole, not flattened into a row), as records (:class:`MaskedRecordObservation`)."""
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict)  # the factory chose this for a masked Dict
    others = other_entries(space, discrete_actions(env))
    if len(others) == 1 and len(space.spaces[others[0]].shape or ()) != IMAGE_NDIM:
        return ActionMaskObservation(env)
    return MaskedRecordObservation(env)


# Dims of an image entry (C, H, W): beside a mask it travels as records, for the CNN torsos.
IMAGE_NDIM = 3


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
        space, n = env.observation_space, discrete_actions(env)
        assert isinstance(space, gym.spaces.Dict)  # the factory chose this adapter for a Dict
        self._entry = masked_entry(space, n)
        box = space.spaces[self._entry]
        assert isinstance(box, gym.spaces.Box)
        self._dtype = np.dtype(box.dtype)
        low = np.concatenate([np.asarray(box.low, np.float64).reshape(-1), np.zeros(n)])
        high = np.concatenate([np.asarray(box.high, np.float64).reshape(-1), np.ones(n)])
        self.observation_space = gym.spaces.Box(
            low.astype(self._dtype), high.astype(self._dtype), dtype=self._dtype.type
        )
        setattr(self, MASKED_ATTR, True)

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return flat_row(np.asarray(observation[self._entry]), observation[ACTION_MASK_KEY], self._dtype)


def mask_space(num_actions: int) -> gym.spaces.Box:
    """The ``action_mask`` entry of a masked run's records: one uint8 flag per action, 1 legal."""
    return gym.spaces.Box(0, 1, (num_actions,), np.uint8)


class MaskedRecordObservation(RecordObservation):
    """A masked Dict observation of several entries as records whose field ``action_mask`` holds
    the legal actions (the module docstring says why records). The observation space stays the
    Dict, its ``action_mask`` entry now :func:`mask_space` (whatever Box or MultiBinary the env
    declared), so ``sample_spec`` describes the field the records really have. Every other entry
    must be a Box (``zmqrl.envs.records.obs_entries`` names the one that is not)."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        space, n = env.observation_space, discrete_actions(env)
        assert isinstance(space, gym.spaces.Dict)  # the factory chose this adapter for a Dict
        other_entries(space, n)
        entries = {key: mask_space(n) if key == ACTION_MASK_KEY else sub for key, sub in space.spaces.items()}
        super().__init__(env, gym.spaces.Dict(entries))
        setattr(self, MASKED_ATTR, True)

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return super().observation(as_mask_flags(observation))


def declares_action_mask(env: Any) -> bool:
    """Whether ``env`` (or a vector env's first sub-env, through any vector wrappers such as
    records') observes through ActionMaskObservation or MaskedRecordObservation."""
    while isinstance(env, gym.vector.VectorWrapper):
        env = env.env
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
