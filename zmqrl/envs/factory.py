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
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from zmqrl.config import AtariConfig, EnvConfig
from zmqrl.envs.action_masks import ActionMaskObservation, declares_action_mask, is_masked_space
from zmqrl.envs.ids import is_factory_path, make_from_factory, unknown_id_message
from zmqrl.envs.masked import OWN_NAMESPACE, register_own_ids
from zmqrl.envs.minatar import (
    MINATAR_INSTALL_HINT,
    ChannelsFirstGrid,
    is_minatar_id,
    register_minatar,
)
from zmqrl.envs.minatar import missing_message as missing_minatar_message
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

# What to run when an optional dependency is missing. Atari: zmqrl's `atari` extra (ale-py, which ships
# the ROMs, and OpenCV for the resize); MuJoCo: the `mujoco` extra is exactly gymnasium's; MinAtar:
# zmqrl's `minatar` extra (MINATAR_INSTALL_HINT, from zmqrl.envs.minatar); Box2D is no extra of ours, so
# its own packages are named.
ATARI_INSTALL_HINT = 'pip install -e ".[atari]"'
ATARI_PACKAGES = "pip install ale-py opencv-python-headless"
MUJOCO_INSTALL_HINT = 'pip install "gymnasium[mujoco]"'
BOX2D_INSTALL_HINT = 'pip install swig "gymnasium[box2d]"'

# Ids in this namespace come from ale_py, which must register them before gymnasium.make can find them.
ALE_NAMESPACE = "ALE/"

# Words in a DependencyNotInstalled message that point at one of the extras. Gymnasium's messages
# name the missing package, so matching the text covers every id without a hardcoded list.
_MUJOCO_WORDS = ("mujoco",)
_ATARI_WORDS = ("ale_py", "ale-py", "atari", "opencv", "cv2")
_BOX2D_WORDS = ("box2d", "swig")
# Ids of the MinAtar games mention it (MinAtar/Breakout-v1, minatar:...): offered its install line.
_MINATAR_WORD = "minatar"

# The frame-skip the raw ALE env must use under the preprocessing: AtariPreprocessing repeats each
# action itself (and max-pools the last two frames), so any skip in the env would multiply with it.
_RAW_FRAMESKIP = 1

# Channel count of an RGB frame, for moving colour channels in front (see _channels_first).
_RGB_CHANNELS = 3


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
        return _make_atari_env(cfg, training=training)
    if cfg.preprocess != "none":
        raise EnvError(f"env.preprocess must be 'none' or 'atari', got {cfg.preprocess!r}")
    if is_factory_path(cfg.id):
        env = make_from_factory(cfg.id, dict(cfg.kwargs))
        if cfg.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps=cfg.max_episode_steps)
        return _supported_observations(env, cfg.id)
    if cfg.id.startswith(ALE_NAMESPACE):
        _register_ale(cfg.id)  # a raw (unpreprocessed) ALE env is allowed too; it still needs registering
    minatar = is_minatar_id(cfg.id)
    if minatar:
        register_minatar(cfg.id)  # the package's ids are not registered by gymnasium 1.x itself
    if cfg.id.startswith(OWN_NAMESPACE):
        register_own_ids()  # zmqrl's own ids (zmqrl.envs.masked), registered in every process
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    env = _gym_make(cfg.id, kwargs)
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
    if is_masked_space(space):  # {"action_mask", one Box}: one flat row ending with the mask
        try:
            return ActionMaskObservation(env)
        except EnvError:
            env.close()
            raise
    if is_record_space(space):  # {key: Box, ...}: one record per observation (zmqrl.records)
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
    if is_record_space(obs_space):  # a Dict of Boxes, each key its own entry (zmqrl.records)
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


def _gym_make(env_id: str, kwargs: dict[str, Any]) -> gym.Env[Any, Any]:
    """``gymnasium.make`` with its many failure types turned into one EnvError that says what to do."""
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(_missing_dependency_message(env_id, exc)) from None
    except gym.error.UnregisteredEnv as exc:
        raise EnvError(_minatar_message(env_id, exc) or unknown_id_message(env_id, exc)) from None
    except ImportError as exc:  # gymnasium's "module:Env-v0" form, whose module is missing
        message = _minatar_message(env_id, exc) or f"env.id '{env_id}' could not be made: {exc}"
        raise EnvError(message) from None
    except (gym.error.Error, TypeError) as exc:
        raise EnvError(f"env.id '{env_id}' could not be made: {exc}") from None


def _missing_dependency_message(env_id: str, exc: Exception) -> str:
    """Point at the project's extra for a missing package, read off gymnasium's own message."""
    text = str(exc).lower()
    if any(word in text for word in _MUJOCO_WORDS):
        return f"env.id '{env_id}' needs MuJoCo: run `{MUJOCO_INSTALL_HINT}` ({exc})"
    if any(word in text for word in _ATARI_WORDS):
        return (
            f"env.id '{env_id}' needs the Atari dependencies: run `{ATARI_INSTALL_HINT}` in the zmqrl "
            f"checkout (or `{ATARI_PACKAGES}`) ({exc})"
        )
    if any(word in text for word in _BOX2D_WORDS):
        return f"env.id '{env_id}' needs Box2D, which is not installed: run `{BOX2D_INSTALL_HINT}`"
    return f"env.id '{env_id}' needs a package that is not installed: {exc}"


def _minatar_message(env_id: str, exc: Exception) -> str | None:
    """For a MinAtar id that failed because MinAtar is not installed: what to install (else None)."""
    if _MINATAR_WORD not in env_id.lower():
        return None
    try:
        import minatar  # noqa: F401
    except ImportError:
        return missing_minatar_message(env_id)
    return None


def _register_ale(env_id: str) -> None:
    """Make ale_py's ids known to gymnasium (gymnasium 1.x no longer does this on its own)."""
    try:
        import ale_py
    except ImportError:
        raise EnvError(
            f"env.id '{env_id}' needs the Atari emulator (ale-py, which ships the ROMs): "
            f"run `{ATARI_INSTALL_HINT}` in the zmqrl checkout (or `{ATARI_PACKAGES}`)"
        ) from None
    gym.register_envs(ale_py)


def _make_atari_env(cfg: EnvConfig, *, training: bool) -> gym.Env[Any, Any]:
    """The DeepMind pipeline: no-op starts, frame skip + max-pool, 84x84 grey, 4-frame stack, uint8.

    Observations are channel-first ``(frame_stack, screen, screen)`` uint8, what NatureCNN takes.
    With ``grayscale: false`` each frame's RGB channels are moved in front and folded into the stack
    axis, giving ``(3 * frame_stack, screen, screen)``: still channel-first, so the same network
    works with more input channels.

    ``env.max_episode_steps`` counts agent steps (after frame skipping), so its TimeLimit goes
    outside the preprocessing; inside, it would count raw emulator frames.
    """
    _register_ale(cfg.id)
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
    env = _gym_make(cfg.id, kwargs)
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
        raise EnvError(_missing_dependency_message(env_id, exc)) from None
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
