"""Environment construction from config, and the sample spec a run's messages must match.

Every role builds its envs here, so training, evaluation and the spec the learner checks samples
against all agree on one pipeline. ``env.id`` is a registered gymnasium id or an import path to a
factory of your own (:mod:`zmqrl.envs.ids`). Atari games get the standard DeepMind preprocessing
(``env.preprocess: atari``); MinAtar games (``MinAtar/Breakout-v1``) observe ``(C, 10, 10)`` uint8
grids (:mod:`zmqrl.envs.minatar`); other envs are used as made, except that ``Discrete`` observations
are one-hot encoded (the agents' networks take float vectors), and observation spaces no agent
can take are refused here, with the space named, before any process starts training.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.config import EnvConfig
from zmqrl.envs.action_masks import declares_action_mask, is_masked_space, masked_observations
from zmqrl.envs.atari import ALE_NAMESPACE, make_atari_env, register_ale
from zmqrl.envs.ids import (
    ATARI_INSTALL_HINT,
    MUJOCO_INSTALL_HINT,
    gym_make,
    is_factory_path,
    make_from_factory,
)
from zmqrl.envs.masked import OWN_NAMESPACE, register_own_ids
from zmqrl.envs.minatar import (
    MINATAR_INSTALL_HINT,
    ChannelsFirstGrid,
    is_minatar_id,
    register_minatar,
)
from zmqrl.envs.records import RecordObservation, RecordVectorObservation, is_record_space, obs_entries
from zmqrl.errors import EnvError
from zmqrl.spec import DEFAULT_MAX_ABS_OBS, DEFAULT_MAX_ABS_REWARD, SampleSpec

__all__ = [
    "ATARI_INSTALL_HINT",
    "MINATAR_INSTALL_HINT",
    "MUJOCO_INSTALL_HINT",
    "EnvError",
    "OneHotObservation",
    "action_bounds",
    "make_env",
    "make_vector_env",
    "sample_spec",
]


def make_env(cfg: EnvConfig, *, training: bool = True) -> gym.Env[Any, Any]:
    """A fresh environment from ``env.id`` + ``env.kwargs`` (seeded later, at its first reset).

    ``training`` only matters for ``env.preprocess: atari``: a training env clips rewards to their
    sign and may end episodes on a lost life (per ``env.atari``), while an evaluation env
    (``training=False``) always reports the raw game score and plays every life, so that evaluation
    returns are comparable to published scores whatever the training tricks.

    ``env.max_episode_steps`` replaces a registered id's time limit; a factory's env gets it as a
    TimeLimit on top of whatever limit the factory set itself.
    """
    if cfg.preprocess == "atari":
        if is_factory_path(cfg.id):
            raise EnvError(
                f"env.preprocess 'atari' needs a registered ALE id such as ALE/Pong-v5, not the "
                f"factory '{cfg.id}': apply the preprocessing inside the factory instead"
            )
        return make_atari_env(cfg, training=training)
    if cfg.preprocess != "none":
        raise EnvError(f"env.preprocess must be 'none' or 'atari', got {cfg.preprocess!r}")
    if is_factory_path(cfg.id):
        env = make_from_factory(cfg.id, dict(cfg.kwargs))
        if cfg.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps=cfg.max_episode_steps)
        return _supported_observations(env, cfg.id)
    if cfg.id.startswith(ALE_NAMESPACE):
        register_ale(cfg.id)  # a raw (unpreprocessed) ALE env is allowed too; it still needs registering
    minatar = is_minatar_id(cfg.id)
    if minatar:
        register_minatar(cfg.id)  # the package's ids are not registered by gymnasium 1.x itself
    if cfg.id.startswith(OWN_NAMESPACE):
        register_own_ids()  # zmqrl's own ids (zmqrl.envs.masked), registered in every process
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    env = gym_make(cfg.id, kwargs)
    if minatar:
        env = ChannelsFirstGrid(env)  # the conv torsos' (C, H, W), uint8 0/1
    return _supported_observations(env, cfg.id)


class OneHotObservation(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """``Discrete(n, start)`` observations as float32 one-hot vectors of length ``n``.

    Why in make_env: learner, actors and evaluator all build their envs there, so they agree on
    the encoding, and :func:`sample_spec` (hence the wire spec and the run fingerprint) sees the
    ``Box`` the agents' networks really take. A module-level class, so the env stays picklable.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Discrete):
            raise EnvError(f"OneHotObservation needs a Discrete observation space, got {space}")
        self._n = int(space.n)
        self._start = int(space.start)
        self.observation_space = gym.spaces.Box(low=0.0, high=1.0, shape=(self._n,), dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        encoded = np.zeros(self._n, dtype=np.float32)
        encoded[int(observation) - self._start] = 1.0
        return encoded


def _supported_observations(env: gym.Env[Any, Any], env_id: str) -> gym.Env[Any, Any]:
    """``env`` with an observation space the agents take: a Box as is, Discrete one-hot encoded.

    Anything else is refused now, naming the space, rather than failing later in a network or on
    the wire; the env is closed first so nothing it opened outlives the error.
    """
    space = env.observation_space
    if isinstance(space, gym.spaces.Box):
        return env
    if isinstance(space, gym.spaces.Discrete):
        return OneHotObservation(env)
    if is_masked_space(space):  # {"action_mask", one Box}: a flat row ending with the mask; more: records
        try:
            return masked_observations(env)
        except EnvError:
            env.close()
            raise
    if is_record_space(space):  # {key: Box, ...}: one record per observation (zmqrl.types)
        try:
            return RecordObservation(env)
        except EnvError:
            env.close()
            raise
    env.close()
    raise EnvError(
        f"env.id '{env_id}': observation space {type(space).__name__} ({space}) is not supported; "
        "zmqrl takes Box observations, and Discrete ones (one-hot encoded). Flatten or encode "
        "others in a wrapper inside your env factory (e.g. gymnasium.wrappers.FlattenObservation)"
    )


def make_vector_env(
    cfg: EnvConfig, num_envs: int, *, training: bool = True
) -> gym.vector.SyncVectorEnv | RecordVectorObservation:
    """``num_envs`` copies of :func:`make_env` stepped in lockstep in this process.

    The autoreset mode is pinned to NEXT_STEP (rather than left to the installed gymnasium's
    default) because the actor relies on it: after a sub-env's episode ends, its *next* ``step``
    ignores the action and returns the reset observation with reward 0 and
    ``terminated = truncated = False``; that row is not a transition and must not be stored.
    """
    if num_envs < 1:
        raise EnvError(f"num_envs must be >= 1, got {num_envs}")
    thunks: list[Callable[[], gym.Env[Any, Any]]] = [
        functools.partial(make_env, cfg, training=training) for _ in range(num_envs)
    ]
    kwargs: dict[str, Any] = {}
    autoreset_mode = getattr(gym.vector, "AutoresetMode", None)
    if (
        autoreset_mode is not None
        and "autoreset_mode" in inspect.signature(gym.vector.SyncVectorEnv).parameters
    ):
        kwargs["autoreset_mode"] = autoreset_mode.NEXT_STEP
    # Without the argument (gymnasium 1.0), next-step autoreset is the only behaviour there is.
    env = gym.vector.SyncVectorEnv(thunks, **kwargs)
    if is_record_space(env.single_observation_space):  # Dict of Boxes: (N,) records, not {key: (N, ...)}
        return RecordVectorObservation(env)
    return env


def sample_spec(
    env: gym.Env[Any, Any] | gym.vector.VectorEnv[Any, Any, Any],
    max_batch: int = 65536,
    *,
    max_abs_obs: float = DEFAULT_MAX_ABS_OBS,
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
    max_discount: float = 1.0,
) -> SampleSpec:
    """What every samples message of this run must look like, from the env's spaces.

    A vector env's spaces are batched; one transition has the shape of a single sub-env's, so
    ``single_observation_space`` / ``single_action_space`` are used when the env has them. The
    observation space's bounds travel in the spec (the learner refuses observations outside
    them), with the run's value limits (``transport.max_abs_obs`` and the others, see SampleSpec).
    """
    obs_space = getattr(env, "single_observation_space", None)
    if obs_space is None:
        obs_space = env.observation_space
    act_space = getattr(env, "single_action_space", None)
    if act_space is None:
        act_space = env.action_space
    common: dict[str, Any]
    if is_record_space(obs_space):  # a Dict of Boxes, each key its own entry (zmqrl.types)
        common = {"obs_shape": (), "obs_dtype": "record", "obs_entries": obs_entries(obs_space)}
    elif not isinstance(obs_space, gym.spaces.Box):
        # make_env has already encoded Discrete observations; this is an env made some other way.
        raise EnvError(
            f"observation space {obs_space} is not supported (need a Box; make envs with make_env)"
        )
    else:
        common = {
            "obs_shape": tuple(obs_space.shape),
            "obs_dtype": np.dtype(obs_space.dtype).name,
            # The bounds the env declares, as the float32 (or integer) values its observations hold.
            "obs_low": tuple(np.asarray(obs_space.low, dtype=np.float64).reshape(-1).tolist()),
            "obs_high": tuple(np.asarray(obs_space.high, dtype=np.float64).reshape(-1).tolist()),
        }
    common |= {
        "max_batch": max_batch,
        "max_abs_obs": max_abs_obs,
        "max_abs_reward": max_abs_reward,
        "max_discount": max_discount,
    }
    if isinstance(act_space, gym.spaces.Discrete):
        if int(act_space.start) != 0:
            raise EnvError(f"Discrete action space must start at 0, got start={act_space.start}")
        masked = declares_action_mask(env)  # the row ends with its legal actions (envs/action_masks.py)
        return SampleSpec(
            action_shape=(), action_dtype="int64", num_actions=int(act_space.n), action_mask=masked, **common
        )
    if isinstance(act_space, gym.spaces.Box):
        return SampleSpec(
            action_shape=tuple(act_space.shape),
            action_dtype="float32",
            num_actions=None,
            **common,
            # The float32 bounds the env enforces: the learner refuses actions outside them.
            action_low=tuple(float(x) for x in np.asarray(act_space.low, np.float32).reshape(-1)),
            action_high=tuple(float(x) for x in np.asarray(act_space.high, np.float32).reshape(-1)),
        )
    raise EnvError(f"action space {act_space} is not supported (need Discrete or Box)")


def action_bounds(env: gym.Env[Any, Any] | gym.vector.VectorEnv[Any, Any, Any]) -> dict[str, np.ndarray]:
    """``action_low`` / ``action_high`` keyword arguments for ``make_learner``, from a Box action space.

    A continuous-action agent squashes its policy onto these bounds (the spec carries the same
    bounds, to validate received actions). Discrete envs give ``{}``, so callers can always splat it.
    """
    space = getattr(env, "single_action_space", None)
    if space is None:
        space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        return {}
    return {
        "action_low": np.asarray(space.low, dtype=np.float32).copy(),
        "action_high": np.asarray(space.high, dtype=np.float32).copy(),
    }
