"""Dict observations of Box entries as records (``zmqrl.types``): the env's edge.

``make_env`` wraps an env whose observation space is a ``gymnasium.spaces.Dict`` of Box entries
(one with an ``action_mask`` through ``zmqrl.envs.action_masks``, which subclasses it) in
:class:`RecordObservation`, and ``make_vector_env`` wraps the vector env of such envs in
:class:`RecordVectorObservation`: from there on each observation is one record, a batch is one
array of records, and ``sample_spec`` describes one entry per key. The wrappers keep the Dict as
the observation space: it still says what each key holds (shape, dtype, bounds), which is what
the spec is made of; only the values' container changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np

from zmqrl.errors import EnvError
from zmqrl.spec import ALLOWED_DTYPES
from zmqrl.types import MAX_KEYS, ObsEntry, check_key, record_dtype, to_records


def is_record_space(space: Any) -> TypeGuard[gym.spaces.Dict]:
    """Whether ``space`` is a Dict observation that travels as records."""
    return isinstance(space, gym.spaces.Dict)


def obs_entries(space: gym.spaces.Dict) -> tuple[ObsEntry, ...]:
    """One entry per key of ``space``, in its order, with the Box's shape, dtype and bounds;
    EnvError naming the key for what zmqrl cannot carry."""
    if not 1 <= len(space.spaces) <= MAX_KEYS:
        raise EnvError(f"a Dict observation needs 1 to {MAX_KEYS} entries, got {len(space.spaces)}")
    entries = []
    for key, sub in space.spaces.items():
        try:
            check_key(key)
        except ValueError as exc:
            raise EnvError(str(exc)) from None
        if not isinstance(sub, gym.spaces.Box):
            raise EnvError(
                f"the Dict observation's entry {key!r} is {sub}: zmqrl takes Dict observations of Box "
                "entries (encode others as a Box in a wrapper inside your env factory)"
            )
        dtype = np.dtype(sub.dtype).name
        if dtype not in ALLOWED_DTYPES or not sub.shape or min(sub.shape) < 1:
            raise EnvError(
                f"the Dict observation's entry {key!r} is {dtype} {list(sub.shape)}: each entry must have at "
                f"least one dimension, all positive, of one of {sorted(ALLOWED_DTYPES)}"
            )
        entries.append(
            ObsEntry(
                key,
                tuple(int(d) for d in sub.shape),
                dtype,
                tuple(np.asarray(sub.low, np.float64).reshape(-1).tolist()),
                tuple(np.asarray(sub.high, np.float64).reshape(-1).tolist()),
            )
        )
    return tuple(entries)


class RecordObservation(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """One env's Dict observations as 0-d records (the observation space stays the Dict, or
    becomes ``space``: a masked run's, ``zmqrl.envs.action_masks``).

    A module-level class, so the env stays picklable."""

    def __init__(self, env: gym.Env[Any, Any], space: gym.spaces.Dict | None = None) -> None:
        super().__init__(env)
        if space is None:
            assert isinstance(env.observation_space, gym.spaces.Dict)  # the factory chose this for a Dict
            space = env.observation_space
        # The Dict says what each field of the records holds (the wrapper's type says records).
        self.observation_space = space  # type: ignore[assignment]
        self.record_dtype = record_dtype(obs_entries(space))

    def observation(self, observation: Mapping[str, Any]) -> np.ndarray:
        return to_records(observation, self.record_dtype, ())


class RecordVectorObservation(gym.vector.VectorObservationWrapper):
    """A vector env's batched Dict observations (``{key: (N, ...)}``) as ``(N,)`` records."""

    def __init__(self, env: gym.vector.VectorEnv[Any, Any, Any]) -> None:
        super().__init__(env)
        space = env.single_observation_space
        assert isinstance(space, gym.spaces.Dict)
        self.record_dtype = record_dtype(obs_entries(space))

    def observations(self, observations: Any) -> np.ndarray:
        return to_records(observations, self.record_dtype, (self.env.num_envs,))
