"""Turning single env steps into n-step transitions, on the actor side.

Doing the n-step folding in the actor (rather than in replay) means the learner stores and samples
ready-made ``(obs, action, reward, next_obs, discount)`` rows and never needs ``n`` or ``gamma``:
``discount`` already carries both the horizon (``gamma ** k``) and termination (0.0).

This runs once per env step in every actor, so it keeps to plain Python floats, a deque, and
precomputed powers of gamma; it never copies observation arrays.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from zmqrl.types import TransitionBatch

# (obs, action, n_step_reward, bootstrap_obs, discount), as returned by StepProcessor.step.
Transition: TypeAlias = tuple[np.ndarray, np.ndarray | int, float, np.ndarray, float]

# Discount written for a transition whose window contains a termination: no bootstrapping.
TERMINAL_DISCOUNT = 0.0


class NStepProcessor:
    """Folds consecutive steps of one episode into n-step transitions (``zmqrl.core.StepProcessor``).

    Every step of an episode that ends (terminated or truncated) yields exactly one transition,
    in step order; steps of an episode still running are emitted ``n - 1`` steps late.

    - Normal step: once ``n`` steps are pending, the oldest is emitted with reward
      ``sum_{i<n} gamma**i * r_i``, bootstrap obs = this step's ``next_obs``, discount ``gamma**n``.
    - ``terminated`` (whether or not also ``truncated``): every pending step is emitted with its
      discounted reward sum up to the end and discount 0.0 (its bootstrap obs is ignored).
    - ``truncated`` only (time limit): every pending step is emitted with discount ``gamma**k``,
      ``k`` = steps from it to the end, bootstrapping from the final observation ``next_obs``
      (not the observation of the following reset).

    After either end the window is empty, ready for the next episode. With gymnasium 1.x single
    envs the actor calls ``env.reset()`` itself after an end. Vector envs instead autoreset on the
    *next* ``step`` call: for a sub-env that ended, that call ignores the action and returns the
    reset observation with reward 0 and no end flags. The caller must NOT feed that autoreset step
    here (it is not a real transition); it should only take its observation as the new episode's
    first ``obs``. (Open issue: handled by the vector-env actor, not here.)

    Observation arrays are stored by reference until emitted, so the caller must not mutate them
    in place afterwards (gymnasium envs return fresh arrays per step).
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.n = int(n)
        self.gamma = float(gamma)
        # _powers[k] == gamma ** k for k = 0..n
        self._powers: tuple[float, ...] = tuple(self.gamma**k for k in range(self.n + 1))
        self._window: deque[tuple[np.ndarray, np.ndarray | int, float]] = deque()

    def __len__(self) -> int:
        """Number of pending (not yet emitted) steps."""
        return len(self._window)

    def reset(self) -> None:
        """Drop any pending steps (e.g. after an env reset forced from outside)."""
        self._window.clear()

    def step(
        self,
        obs: np.ndarray,
        action: np.ndarray | int,
        reward: float,
        terminated: bool,
        truncated: bool,
        next_obs: np.ndarray,
    ) -> list[Transition]:
        """Feed one env step; return the transitions it completes (possibly none)."""
        window = self._window
        window.append((obs, action, float(reward)))
        if terminated or truncated:
            return self._flush(next_obs, bootstrap=not terminated)
        if len(window) < self.n:
            return []
        powers = self._powers
        ret = 0.0
        for i, (_, _, r) in enumerate(window):
            ret += powers[i] * r
        first_obs, first_action, _ = window.popleft()
        return [(first_obs, first_action, ret, next_obs, powers[self.n])]

    def _flush(self, next_obs: np.ndarray, bootstrap: bool) -> list[Transition]:
        """Emit every pending step, oldest first, and empty the window.

        Walks backwards so each step's return is ``r + gamma * (return of the next step)``: O(k)
        for k pending steps instead of O(k**2).
        """
        window = self._window
        gamma = self.gamma
        powers = self._powers
        out: list[Transition] = []
        ret = 0.0
        for k, (o, a, r) in enumerate(reversed(window), start=1):
            ret = r + gamma * ret
            out.append((o, a, ret, next_obs, powers[k] if bootstrap else TERMINAL_DISCOUNT))
        window.clear()
        out.reverse()
        return out


def to_batch(
    transitions: Sequence[Transition],
    obs_dtype: DTypeLike,
    action_dtype: DTypeLike,
) -> TransitionBatch:
    """Stack transition tuples into one column-major ``TransitionBatch``.

    Used by the actor when flushing its send buffer. Rewards and discounts become float32, as the
    wire format and replay expect. Raises ValueError for an empty list (no shape to infer).
    """
    if not transitions:
        raise ValueError("to_batch needs at least one transition")
    obs, action, reward, next_obs, discount = zip(*transitions, strict=True)
    return TransitionBatch(
        obs=np.stack(obs).astype(obs_dtype, copy=False),
        action=np.asarray(action, dtype=action_dtype),
        reward=np.asarray(reward, dtype=np.float32),
        next_obs=np.stack(next_obs).astype(obs_dtype, copy=False),
        discount=np.asarray(discount, dtype=np.float32),
    )
