"""MinAtar games (Young & Tian, 2019) through the ids their package registers: ``MinAtar/Breakout-v1``.

Why an adapter of our own on top of the package's gymnasium wrapper (``minatar.gym``):

- **Registration.** The package declares its ids through a ``gymnasium.envs`` entry point that
  gymnasium 1.x no longer loads, so ``MinAtar/...`` ids are unknown until ``register_envs`` runs.
  :func:`register_minatar` runs it, once per process, before ``gymnasium.make``.
- **A quiet import.** Without seaborn (which only its rendering needs), importing the package
  logs two warnings through the *root* logger at import time; ``logging.warning`` on an
  unconfigured root also installs a stderr handler (``basicConfig``), which would change how every
  later log line of the process is printed. The import is guarded against both.
- **Layout.** The package returns ``(10, 10, C)`` bool grids, channels last. The conv torsos take
  ``(C, H, W)``; :class:`ChannelsFirstGrid` makes the observations ``(C, 10, 10)`` uint8 0/1, one
  byte per cell as before (so replay stays small: 400 bytes per Breakout observation), in the
  layout and dtype every pixel path of zmqrl already handles (uint8 frames, channel-first).

``-v1`` ids use each game's minimal action set (Breakout: 3 actions); ``-v0`` ids all 6. Sticky
actions (probability 0.1) are the package's default, as in the paper; ``env.kwargs`` can change
them (``sticky_action_prob``) or turn off ``difficulty_ramping``. The games set no time limit:
configs give ``env.max_episode_steps``.

``zmqrl/MinAtarBreakoutNoTrail-v1`` is Breakout without the channel that shows the ball's motion
(:class:`DropChannels`): one frame per observation, for policies with memory.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.errors import EnvError

# Ids of the MinAtar games start with this namespace.
MINATAR_NAMESPACE = "MinAtar/"
# zmqrl's extra, and the package itself (the extra pins a version that registers gymnasium ids).
MINATAR_INSTALL_HINT = 'pip install -e ".[minatar]"'
MINATAR_PACKAGE = "pip install minatar"
# The module of the package that defines the gymnasium env and registers the ids.
_GYM_MODULE = "minatar.gym"
# The start of the package's import-time warnings about seaborn / matplotlib (rendering only).
_RENDER_WARNING = "Cannot import"


def is_minatar_id(env_id: str) -> bool:
    """Whether ``env_id`` names a MinAtar game (``MinAtar/Breakout-v1``)."""
    return env_id.startswith(MINATAR_NAMESPACE)


def missing_message(env_id: str) -> str:
    """What to install when the MinAtar package is not there, naming ``env_id``."""
    return (
        f"env.id '{env_id}' needs MinAtar, which is not installed: run `{MINATAR_INSTALL_HINT}` in "
        f"the zmqrl checkout (or `{MINATAR_PACKAGE}`)"
    )


def register_minatar(env_id: str) -> None:
    """Make the ``MinAtar/...`` ids known to gymnasium in this process (a no-op once they are)."""
    if env_id in gym.registry:
        return
    module = _import_quietly(env_id)
    if not any(is_minatar_id(name) for name in gym.registry):
        module.register_envs()


def _import_quietly(env_id: str) -> ModuleType:
    """``minatar.gym``, imported without its rendering warnings and without configuring logging."""
    root = logging.getLogger()
    guard = logging.NullHandler()  # root has a handler: logging.warning will not call basicConfig
    drop = _DropRenderWarnings()
    root.addHandler(guard)
    root.addFilter(drop)
    try:
        return importlib.import_module(_GYM_MODULE)
    except ImportError:
        raise EnvError(missing_message(env_id)) from None
    finally:
        root.removeFilter(drop)
        root.removeHandler(guard)


class _DropRenderWarnings(logging.Filter):
    """Drops the package's "Cannot import seaborn ..." records, logged on the root logger; records
    other threads log on the root logger meanwhile pass (a logger's filter sees only its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_RENDER_WARNING)


class ChannelsFirstGrid(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """``(H, W, C)`` bool grids -> ``(C, H, W)`` uint8 0/1: the layout and dtype of the conv torsos.

    A module-level class, so the env stays picklable (as the other wrappers of ``zmqrl.envs.factory``).
    """

    def __init__(self, env: gym.Env[np.ndarray, Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise EnvError(f"a MinAtar env should observe (10, 10, C) grids, got {space}")
        height, width, channels = space.shape
        self.observation_space = gym.spaces.Box(
            low=0, high=1, shape=(channels, height, width), dtype=np.uint8
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0), dtype=np.uint8)


# MinAtar Breakout with one frame per observation: the ball's previous cell (the "trail" channel)
# removed, so which way the ball moves is no longer in any single observation (see DropChannels).
BREAKOUT_NO_TRAIL = "zmqrl/MinAtarBreakoutNoTrail-v1"  # in zmqrl.envs.masked's OWN_NAMESPACE
# The channel dropped: the game's own name for it, looked up in the game's channel table.
TRAIL_CHANNEL = "trail"


class DropChannels(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """``(C, H, W)`` grids (``ChannelsFirstGrid``'s) without the channels named ``names``, looked up
    in the MinAtar game's own table (``{"paddle": 0, "ball": 1, "trail": 2, "brick": 3}`` for
    Breakout), so a package that renumbers its channels cannot make it drop the wrong one.

    Why: MinAtar's observation is one 10x10 frame, but some games paint motion into it. Breakout's
    ``trail`` channel marks the cell the ball left, so one frame shows the ball's direction; without
    it the frame shows where the ball is and not where it goes, which decides where the paddle
    must be when the ball comes down. A policy must then remember the ball's last cells (a recurrent
    one can, ``agent.core: lstm``), as a feed-forward policy on stacked frames would see them.
    """

    def __init__(self, env: gym.Env[np.ndarray, Any], names: tuple[str, ...]) -> None:
        super().__init__(env)
        game = getattr(getattr(env.unwrapped, "game", None), "env", None)  # the package's game object
        table: dict[str, int] | None = getattr(game, "channels", None)
        space = env.observation_space
        if not isinstance(table, dict) or not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise EnvError(f"DropChannels wraps a MinAtar game's (C, 10, 10) grids, got {space} from {env}")
        missing = [name for name in names if name not in table]
        if missing:
            raise EnvError(f"this MinAtar game has no channel {missing} (its channels: {sorted(table)})")
        dropped = {table[name] for name in names}
        self._keep = [c for c in range(space.shape[0]) if c not in dropped]
        self.observation_space = gym.spaces.Box(
            low=0, high=1, shape=(len(self._keep), *space.shape[1:]), dtype=np.uint8
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(observation[self._keep])


def make_breakout_no_trail(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """MinAtar ``Breakout-v1`` (``kwargs``: the package's, e.g. ``sticky_action_prob``) observed as
    ``(3, 10, 10)`` uint8 grids: paddle, ball, bricks (``DropChannels`` of ``trail``)."""
    game = "MinAtar/Breakout-v1"
    register_minatar(game)
    return DropChannels(ChannelsFirstGrid(gym.make(game, **kwargs)), (TRAIL_CHANNEL,))


def register_minatar_variants() -> None:
    """Register the MinAtar variants of this module with gymnasium (idempotent; with zmqrl's other
    own ids, by ``zmqrl.envs.masked.register_own_ids``); the entry point is this module's own
    function, so ``env.id`` only picks among ids, it never names code. The MinAtar package itself
    is imported when such an env is made, not here."""
    if BREAKOUT_NO_TRAIL not in gym.registry:
        gym.register(BREAKOUT_NO_TRAIL, entry_point=make_breakout_no_trail)
