"""``zmqrl/GridGoal-v0``: walk to a goal on a grid, seen as an image beside a vector (a Dict observation).

A ``size`` x ``size`` grid; each episode puts the walker and a goal on two distinct cells drawn by
the env's seed. The observation is a Dict of two Box entries, as multimodal envs give them:
``"grid"``, a ``(1, size, size)`` uint8 image with a 1 where the walker stands, and ``"goal"``, the
goal's ``(row, column) / (size - 1)`` as float32. Neither alone is enough: the image does not show
the goal, the vector does not say where the walker is, so a policy must read both keys (one
through a CNN, one as a vector: what ``agent.torso`` does per key). Actions: up, down, left, right
(a move into the edge stays put). Reaching the goal scores 1 and ends the episode; the episode is
cut (truncated) after the walker's shortest path plus ``slack`` steps, so only a policy that
heads for the goal every step scores: the best return is 1, a random walker's is about 0.1 on
the default 7 x 7 grid.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

GRID_GOAL = "zmqrl/GridGoal-v0"
DEFAULT_SIZE = 7
DEFAULT_SLACK = 2
# Row and column steps of the four actions: up, down, left, right.
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)], dtype=np.int64)


class GridGoal(gym.Env[Any, np.int64]):
    """The task in the module docstring; the walker's and the goal's cells drawn by the env's seed."""

    def __init__(self, size: int = DEFAULT_SIZE, slack: int = DEFAULT_SLACK) -> None:
        if int(size) < 2 or int(slack) < 0:
            raise ValueError(f"GridGoal needs size >= 2 and slack >= 0, got size={size}, slack={slack}")
        self.size, self.slack = int(size), int(slack)
        self.observation_space = gym.spaces.Dict(
            {
                "grid": gym.spaces.Box(0, 1, (1, self.size, self.size), np.uint8),
                "goal": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self._walker = np.zeros(2, np.int64)
        self._goal = np.zeros(2, np.int64)
        self._steps_left = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, size=2, replace=False)
        self._walker = np.array(divmod(int(cells[0]), self.size), np.int64)
        self._goal = np.array(divmod(int(cells[1]), self.size), np.int64)
        self._steps_left = int(np.abs(self._goal - self._walker).sum()) + self.slack
        return self._observation(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        move = MOVES[int(action)]
        self._walker = np.clip(self._walker + move, 0, self.size - 1)
        self._steps_left -= 1
        reached = bool((self._walker == self._goal).all())
        return (
            self._observation(),
            1.0 if reached else 0.0,
            reached,
            not reached and self._steps_left <= 0,
            {},
        )

    def _observation(self) -> dict[str, np.ndarray]:
        grid = np.zeros((1, self.size, self.size), np.uint8)
        grid[0, self._walker[0], self._walker[1]] = 1
        return {"grid": grid, "goal": (self._goal / (self.size - 1)).astype(np.float32)}


def register_grid_goal() -> None:
    """Register ``zmqrl/GridGoal-v0`` (idempotent); the env cuts its own episodes (``slack``)."""
    if GRID_GOAL not in gym.registry:
        gym.register(GRID_GOAL, entry_point=make_grid_goal, reward_threshold=1.0)


def make_grid_goal(**kwargs: Any) -> gym.Env[Any, Any]:
    """The registered id's entry point (``env.kwargs`` are GridGoal's)."""
    return GridGoal(**kwargs)
