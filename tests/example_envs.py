"""A tiny environment of our own, trained on through ``env.id: tests.example_envs:make_env``.

Why this one: it is solved in a few hundred DQN updates, its optimum is known exactly, and its
observations are ``Discrete`` (the cell index), so a run on it goes through zmqrl's one-hot
encoding in every process. Nothing here imports zmqrl: it is what a user's own module looks like.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

# Default corridor: cells 0..LENGTH-1, the agent starts in cell 0 and the goal is the last cell.
LENGTH = 6
# Paid for every step: the fewer steps to the goal, the higher the return.
STEP_REWARD = -1.0
# Episodes that have not reached the goal by then are truncated (a random walk needs ~LENGTH**2).
MAX_STEPS = 25
LEFT, RIGHT = 0, 1


class Corridor(gym.Env[int, int]):
    """Walk right to the goal. Actions: 0 left (a wall at cell 0), 1 right; each step costs 1.

    The best return is ``-(length - 1)``: walking straight right. A policy that never gets there
    scores ``-max_steps``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, length: int = LENGTH, max_steps: int = MAX_STEPS) -> None:
        if length < 2:
            raise ValueError(f"length must be >= 2, got {length}")
        self.length = length
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)
        self._cell = 0
        self._steps = 0

    @property
    def optimal_return(self) -> float:
        return STEP_REWARD * (self.length - 1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self._cell = 0
        self._steps = 0
        return self._cell, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        move = 1 if int(action) == RIGHT else -1
        self._cell = int(np.clip(self._cell + move, 0, self.length - 1))
        self._steps += 1
        terminated = self._cell == self.length - 1
        truncated = not terminated and self._steps >= self.max_steps
        return self._cell, STEP_REWARD, terminated, truncated, {}


def make_env(length: int = LENGTH, max_steps: int = MAX_STEPS) -> Corridor:
    """The factory ``env.id`` names; ``env.kwargs`` arrive here as keyword arguments."""
    return Corridor(length=length, max_steps=max_steps)


class Frames(gym.Env[np.ndarray, int]):
    """Random uint8 frames just large enough for the Nature CNN (36x36: its kernels leave 1x1), for
    runs that need a torch-acting policy without the Atari extra. Nothing here is learnable."""

    observation_space = gym.spaces.Box(0, 255, shape=(4, 36, 36), dtype=np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self.observation_space.sample(), 0.0, self.t >= 20, False, {}


def make_frames_env() -> Frames:
    return Frames()


class FailingCorridor(Corridor):
    """A Corridor whose step raises once ``seconds`` have passed since it was made: an env that
    fails a few seconds after every start of the process that uses it (a crash loop whose runs
    each last longer than a moment)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.fails_at = time.monotonic() + seconds
        self.seconds = seconds

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        if time.monotonic() > self.fails_at:
            raise RuntimeError(f"test env: failing {self.seconds:g} s after it was made")
        return super().step(action)


def make_failing_env(seconds: float = 3.0) -> FailingCorridor:
    return FailingCorridor(seconds)


class CorridorWithHelper(Corridor):
    """A Corridor that starts a helper process, as envs that drive a simulator do, and ends it on
    ``close()``. The helper's command line carries ``tag``, so a test can find it; it never exits
    by itself, so a process killed before it could close its env leaves it behind."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.helper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", tag], stdin=subprocess.DEVNULL
        )

    def close(self) -> None:
        self.helper.kill()
        self.helper.wait()
        super().close()


def make_env_with_helper(tag: str) -> CorridorWithHelper:
    return CorridorWithHelper(tag)


class DictReach(gym.Env[dict, np.ndarray]):
    """A Dict observation (a float32 vector beside a uint8 image) with continuous actions, for
    what GridGoal (Discrete actions) cannot check: SAC and Gaussian APPO on several keys. Nothing
    here is learnable: the reward is how close the action is to the position."""

    def __init__(self) -> None:
        # The env's own spaces (not the class's): each env draws its observations from its own seed.
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                "view": gym.spaces.Box(0, 1, shape=(1, 4, 4), dtype=np.uint8),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        self.obs = self.observation_space.sample()
        return self.obs, {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        reward = -float(np.abs(np.asarray(action) - self.obs["position"]).sum())
        self.obs = self.observation_space.sample()
        return self.obs, reward, self.t >= 10, False, {}


def make_dict_reach_env() -> DictReach:
    return DictReach()
