"""Environment construction from config, and the sample spec a run's messages must match."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.config import EnvConfig
from zmqrl.transport.wire import SampleSpec


class EnvError(ValueError):
    """The configured environment cannot be made or is not supported by the configured agent."""


def make_env(cfg: EnvConfig) -> gym.Env[Any, Any]:
    """A fresh environment from ``env.id`` + ``env.kwargs`` (seeded later, at its first reset)."""
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        return gym.make(cfg.id, **kwargs)
    except (gym.error.Error, TypeError, ImportError, ModuleNotFoundError) as exc:
        raise EnvError(f"env.id '{cfg.id}' could not be made: {exc}") from None


def sample_spec(env: gym.Env[Any, Any], max_batch: int = 65536) -> SampleSpec:
    """What every samples message of this run must look like, from the env's spaces."""
    obs_space = env.observation_space
    act_space = env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise EnvError(f"observation space {obs_space} is not supported (need a Box)")
    obs_dtype = np.dtype(obs_space.dtype).name
    if isinstance(act_space, gym.spaces.Discrete):
        if int(act_space.start) != 0:
            raise EnvError(f"Discrete action space must start at 0, got start={act_space.start}")
        return SampleSpec(
            obs_shape=tuple(obs_space.shape),
            obs_dtype=obs_dtype,
            action_shape=(),
            action_dtype="int64",
            num_actions=int(act_space.n),
            max_batch=max_batch,
        )
    if isinstance(act_space, gym.spaces.Box):
        return SampleSpec(
            obs_shape=tuple(obs_space.shape),
            obs_dtype=obs_dtype,
            action_shape=tuple(act_space.shape),
            action_dtype="float32",
            num_actions=None,
            max_batch=max_batch,
        )
    raise EnvError(f"action space {act_space} is not supported (need Discrete or Box)")
