"""``zmqrl/PickLargest-v0``: a small selection game with illegal moves, to show action masks.

Each episode deals ``slots`` distinct values drawn from 1..``max_value``; each step the agent takes
one slot it has not taken yet, and scores 1 when that slot holds the largest value still on the
table (0 otherwise). After ``slots`` steps the table is empty and the episode ends: the best return
is ``slots``, a uniformly random legal player scores about ``H(slots)`` (2.45 for 6 slots). Taking a
slot twice is illegal: at step t, t of the ``slots`` actions are, so an agent that ignores the mask
takes illegal moves often.

The observation is a Dict, as masked envs give it: ``"observation"`` holds each slot's value /
``max_value`` (0 once taken) and ``"action_mask"`` (int8) flags the slots still free; the terminal
observation has no legal action. ``illegal`` says what an illegal move does: ``"raise"`` (the
default: a ValueError, so a test proves that no masked agent ever took one), or ``"lose"``: the
episode ends there (terminated, reward 0), which lets an unmasked agent
(``mask_observation: false``: the Box of values alone) play the same game and be compared.
Every illegal move is counted in ``illegal_moves`` either way.

``extra_key`` adds a third entry beside the two, so the mask travels as a field of records
(``zmqrl.envs.action_masks``): ``"progress"``, the fraction of slots taken ``(1,)`` float32, or
``"board"``, the table as a ``(1, max_value, slots)`` uint8 image with a 1 at (value - 1, slot) for
each free slot (what a CNN torso reads beside the mask). None (the default): the two entries only.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.envs.action_masks import ACTION_MASK_KEY

PICK_LARGEST = "zmqrl/PickLargest-v0"
# Defaults: 6 slots of values 1..9 (distinct: the largest is never a tie).
DEFAULT_SLOTS = 6
DEFAULT_MAX_VALUE = 9
ILLEGAL_RULES = ("raise", "lose")
EXTRA_KEYS = ("progress", "board")


class PickLargest(gym.Env[Any, np.int64]):
    """The game in the module docstring; deterministic rules, values drawn by the env's seed."""

    def __init__(
        self,
        slots: int = DEFAULT_SLOTS,
        max_value: int = DEFAULT_MAX_VALUE,
        illegal: str = "raise",
        mask_observation: bool = True,
        extra_key: str | None = None,
    ) -> None:
        if not 2 <= slots <= max_value:
            raise ValueError(f"need 2 <= slots <= max_value, got slots={slots}, max_value={max_value}")
        if illegal not in ILLEGAL_RULES:
            raise ValueError(f"illegal must be one of {ILLEGAL_RULES}, got {illegal!r}")
        if extra_key is not None and (extra_key not in EXTRA_KEYS or not mask_observation):
            raise ValueError(f"extra_key must be None or one of {EXTRA_KEYS} with a mask, got {extra_key!r}")
        self.slots, self.max_value, self.illegal = int(slots), int(max_value), illegal
        self.mask_observation, self.extra_key = bool(mask_observation), extra_key
        values = gym.spaces.Box(0.0, 1.0, (self.slots,), np.float32)
        mask = gym.spaces.Box(0, 1, (self.slots,), np.int8)
        entries: dict[str, gym.Space[Any]] = {"observation": values, ACTION_MASK_KEY: mask}
        if extra_key == "progress":
            entries[extra_key] = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        elif extra_key == "board":
            entries[extra_key] = gym.spaces.Box(0, 1, (1, self.max_value, self.slots), np.uint8)
        self.observation_space: gym.Space[Any] = gym.spaces.Dict(entries) if self.mask_observation else values
        self.action_space = gym.spaces.Discrete(self.slots)
        self.illegal_moves = 0  # over the env's life: what tests and comparisons read
        self._values = np.zeros(self.slots, np.int64)
        self._free = np.zeros(self.slots, bool)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._values = self.np_random.choice(np.arange(1, self.max_value + 1), self.slots, replace=False)
        self._free = np.ones(self.slots, bool)
        return self._observation(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        slot = int(action)
        if not (0 <= slot < self.slots and self._free[slot]):
            self.illegal_moves += 1
            if self.illegal == "raise":
                raise ValueError(f"illegal move: slot {slot} is not free ({self._free.astype(int).tolist()})")
            return self._observation(), 0.0, True, False, {"illegal": True}
        best = self._values[slot] == self._values[self._free].max()
        self._free[slot] = False
        return self._observation(), float(best), not self._free.any(), False, {}

    def legal_actions(self) -> np.ndarray:
        """The slots still free, as the mask flags them (bool)."""
        return self._free.copy()

    def _observation(self) -> Any:
        values = np.where(self._free, self._values / self.max_value, 0.0).astype(np.float32)
        if not self.mask_observation:
            return values
        obs = {"observation": values, ACTION_MASK_KEY: self._free.astype(np.int8)}
        if self.extra_key == "progress":
            obs["progress"] = np.array([1.0 - self._free.mean()], np.float32)
        elif self.extra_key == "board":
            board = np.zeros((1, self.max_value, self.slots), np.uint8)
            free = np.flatnonzero(self._free)
            board[0, self._values[free] - 1, free] = 1
            obs["board"] = board
        return obs


def register_pick_largest() -> None:
    """Register ``zmqrl/PickLargest-v0`` (idempotent); its episode is ``slots`` steps at most."""
    if PICK_LARGEST not in gym.registry:
        gym.register(PICK_LARGEST, entry_point=make_pick_largest, reward_threshold=float(DEFAULT_SLOTS))


def make_pick_largest(**kwargs: Any) -> gym.Env[Any, Any]:
    """The registered id's entry point (``env.kwargs`` are PickLargest's)."""
    return PickLargest(**kwargs)
