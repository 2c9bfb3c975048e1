"""Atari games as DQN's papers play them: the DeepMind preprocessing behind ``env.preprocess: atari``."""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from zmqrl.config import AtariConfig, EnvConfig
from zmqrl.envs.ids import ATARI_INSTALL_HINT, ATARI_PACKAGES, gym_make, missing_dependency_message
from zmqrl.errors import EnvError

# Ids in this namespace come from ale_py, which must register them before gymnasium.make can find them.
ALE_NAMESPACE = "ALE/"

# The frame-skip the raw ALE env must use under the preprocessing: AtariPreprocessing repeats each
# action itself (and max-pools the last two frames), so any skip in the env would multiply with it.
_RAW_FRAMESKIP = 1

# Channel count of an RGB frame, for moving colour channels in front (see _channels_first).
_RGB_CHANNELS = 3


def register_ale(env_id: str) -> None:
    """Make ale_py's ids known to gymnasium (gymnasium 1.x no longer does this on its own)."""
    try:
        import ale_py
    except ImportError:
        raise EnvError(
            f"env.id '{env_id}' needs the Atari emulator (ale-py, which ships the ROMs): "
            f"run `{ATARI_INSTALL_HINT}` in the zmqrl checkout (or `{ATARI_PACKAGES}`)"
        ) from None
    gym.register_envs(ale_py)


def make_atari_env(cfg: EnvConfig, *, training: bool) -> gym.Env[Any, Any]:
    """The DeepMind pipeline: no-op starts, frame skip + max-pool, 84x84 grey, 4-frame stack, uint8.

    Observations are channel-first ``(frame_stack, screen, screen)`` uint8, what NatureCNN takes.
    With ``grayscale: false`` each frame's RGB channels are moved in front and folded into the stack
    axis, giving ``(3 * frame_stack, screen, screen)``: still channel-first, so the same network
    works with more input channels.

    ``env.max_episode_steps`` counts agent steps (after frame skipping), so its TimeLimit goes
    outside the preprocessing; inside, it would count raw emulator frames.
    """
    register_ale(cfg.id)
    atari = cfg.atari
    kwargs = dict(cfg.kwargs)
    frameskip = kwargs.pop("frameskip", _RAW_FRAMESKIP)
    if frameskip != _RAW_FRAMESKIP:
        raise EnvError(
            f"env.kwargs.frameskip={frameskip!r} cannot be used with env.preprocess 'atari': the "
            f"preprocessing skips env.atari.frame_skip={atari.frame_skip} frames itself (leave frameskip out)"
        )
    # ALE v5 defaults to frameskip=4, which would stack with the wrapper's skip. Everything else the
    # user gave (e.g. repeat_action_probability) passes through; what they did not keeps the env default.
    kwargs["frameskip"] = _RAW_FRAMESKIP
    env = gym_make(cfg.id, kwargs)
    env = _atari_preprocessing(env, cfg.id, atari, training=training)
    env = gym.wrappers.FrameStackObservation(env, atari.frame_stack)
    if not atari.grayscale:
        env = _channels_first(env)
    if cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=cfg.max_episode_steps)
    if training and atari.clip_rewards:
        env = gym.wrappers.TransformReward(env, _sign_reward)
    return env


def _atari_preprocessing(
    env: gym.Env[Any, Any], env_id: str, atari: AtariConfig, *, training: bool
) -> gym.Env[Any, Any]:
    """Gymnasium's AtariPreprocessing as configured; life-loss terminals only ever when training.

    Note gymnasium's life-loss terminal is followed by a *full* game reset (unlike the DeepMind
    EpisodicLife wrapper, which plays on): with it, training episodes are single lives. Machado et
    al. (2018) advise against it anyway, which is why it is off by default.
    """
    try:
        return gym.wrappers.AtariPreprocessing(
            env,
            noop_max=atari.noop_max,
            frame_skip=atari.frame_skip,
            screen_size=atari.screen_size,
            terminal_on_life_loss=atari.terminal_on_life_loss and training,
            grayscale_obs=atari.grayscale,
            grayscale_newaxis=False,
            scale_obs=False,  # keep uint8: 4x less replay memory; the network scales by 1/255 itself
        )
    except gym.error.DependencyNotInstalled as exc:  # the resize needs OpenCV
        env.close()
        raise EnvError(missing_dependency_message(env_id, exc)) from None
    except (ValueError, TypeError) as exc:  # e.g. noop_max > 0 for a game whose action 0 is not NOOP
        env.close()
        raise EnvError(f"env.id '{env_id}' cannot take the Atari preprocessing: {exc}") from None


def _channels_first(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """``(stack, H, W, 3)`` RGB stacks -> ``(stack * 3, H, W)``, channel-first like the grey stacks."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or space.shape is None or space.shape[-1] != _RGB_CHANNELS:
        raise EnvError(f"expected stacked RGB frames (stack, H, W, 3), got {space}")
    stack, height, width, channels = space.shape
    shape = (stack * channels, height, width)
    new_space = gym.spaces.Box(low=0, high=255, shape=shape, dtype=np.uint8)

    def to_channels_first(obs: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(obs.transpose(0, 3, 1, 2).reshape(shape))

    return gym.wrappers.TransformObservation(env, to_channels_first, new_space)


def _sign_reward(reward: SupportsFloat) -> float:
    """DQN's reward clipping: -1, 0 or +1, so one learning rate suits every game's score scale.

    A module-level function (not a lambda) so the wrapped env stays picklable for subprocess vector envs.
    """
    return float(np.sign(float(reward)))
