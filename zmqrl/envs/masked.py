"""Partially observed classic-control tasks: CartPole with its velocities hidden.

``zmqrl/CartPoleNoVelocity-v1`` is CartPole-v1 (its dynamics, rewards and 500-step time limit)
observed through :class:`CartPoleNoVelocity`: the cart's position and the pole's angle only.
A policy of the current observation alone cannot tell which way the pole is falling; one with
memory can (the difference of two observations is a velocity), so it tells a recurrent agent
(``agent.core: lstm``) from a feed-forward one.

Registered with gymnasium by :func:`register_own_ids`, which ``zmqrl.envs.factory.make_env``
calls for every id in the ``zmqrl/`` namespace: ``env.id`` stays a registered id (data), and no
config names code to get this env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.envs.grid_goal import register_grid_goal
from zmqrl.envs.minatar import register_minatar_variants
from zmqrl.envs.pick_largest import register_pick_largest

# The namespace of the ids this package registers itself.
OWN_NAMESPACE = "zmqrl/"
CARTPOLE_NO_VELOCITY = "zmqrl/CartPoleNoVelocity-v1"
# CartPole's observation is [x, x_dot, theta, theta_dot]: these are the components kept.
CARTPOLE_POSITIONS = (0, 2)


class CartPoleNoVelocity(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """CartPole's observation without its velocities: ``[cart position, pole angle]`` (float32),
    in a Box of those two components' bounds (+-4.8 and +-0.419 rad, CartPole's own)."""

    def __init__(self, env: gym.Env[np.ndarray, Any]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (4,):
            raise ValueError(f"CartPoleNoVelocity wraps CartPole's Box(4,) observations, got {space}")
        keep = list(CARTPOLE_POSITIONS)
        self.observation_space = gym.spaces.Box(space.low[keep], space.high[keep], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[list(CARTPOLE_POSITIONS)]


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """CartPole's env (``kwargs``: its own, e.g. ``render_mode``) with its velocities hidden; the
    time limit (500 steps, or ``env.max_episode_steps``) is the registration's, as CartPole-v1's."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return CartPoleNoVelocity(CartPoleEnv(**kwargs))


def register_own_ids() -> None:
    """Register this package's ids with gymnasium (idempotent). The entry point is this module's
    own function, fixed here: ``env.id`` only picks among the ids, it never names code."""
    register_pick_largest()  # the masked-actions game (zmqrl.envs.pick_largest)
    register_minatar_variants()  # MinAtar Breakout without its trail (zmqrl.envs.minatar)
    register_grid_goal()  # an image beside a vector: a Dict observation (zmqrl.envs.grid_goal)
    if CARTPOLE_NO_VELOCITY not in gym.registry:
        gym.register(
            CARTPOLE_NO_VELOCITY,
            entry_point=make_cartpole_no_velocity,
            reward_threshold=475.0,
            max_episode_steps=500,  # CartPole-v1's
        )
