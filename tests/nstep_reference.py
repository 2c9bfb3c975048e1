"""The per-transition definition of the actor's n-step folding: what tests hold the real one to.

Doing the n-step folding in the actor (rather than in replay) means the learner stores and samples
ready-made ``(obs, action, reward, next_obs, discount)`` rows and never needs ``n`` or ``gamma``:
``discount`` already carries both the horizon (``gamma ** k``) and termination (0.0).

These classes are the per-transition definition of that folding: ``NStepProcessor`` for one env
(``zmqrl.core.StepProcessor``), ``VectorNStep`` for a gymnasium vector env (``AutoresetMode.
NEXT_STEP``), ``ActedVersions`` for the weights version each window step was acted with. The
actor itself runs ``zmqrl.actor.nstep_log.NStepLog``, which gives the same batches from arrays
at a fraction of the per-step cost; tests/test_nstep_log.py holds it to these. A test oracle,
not the runtime: it lives with the tests, outside the package.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from zmqrl.types import EpisodeStat, TransitionBatch

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
    first ``obs``. ``VectorNStep`` does exactly that for a whole vector env.

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


class VectorNStep:
    """One ``NStepProcessor`` per sub-env of a vector env with ``AutoresetMode.NEXT_STEP``; pure, no I/O.

    Feed it every ``vector_env.step`` with the observations the actions were chosen from. Per call:

    - A sub-env whose episode ended (terminated or truncated) on the previous call is in its
      *autoreset step* now: gymnasium ignored its action and returned the new episode's first
      observation with reward 0 and no end flags. That row is not a transition: it is skipped
      (not fed to any window, not counted), and the caller simply keeps the returned observation
      as the row's next ``obs``.
    - Every other row is one real env transition of that sub-env, fed to that sub-env's own
      window only, so n-step windows never mix sub-envs or episodes. Truncation bootstraps from the
      row's ``next_obs``, which in NEXT_STEP mode is the real final observation (the reset comes
      on the next call); termination writes discount 0. One sub-env ending flushes only its window.
    - Returned transitions are ordered by sub-env index, then by step within the sub-env: the
      output is a deterministic function of the inputs.

    After each call ``real_steps`` is the number of real transitions in it (rows not in their
    autoreset step) and ``ended`` lists ``(sub-env index, EpisodeStat)`` for the episodes that
    ended in it, in sub-env order. ``env_steps[j]`` counts sub-env j's transitions so far.
    """

    def __init__(self, num_envs: int, n: int, gamma: float) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.processors = [NStepProcessor(n, gamma) for _ in range(self.num_envs)]
        # autoreset[j]: sub-env j ended on the previous call, so this call is its autoreset step.
        self.autoreset = [False] * self.num_envs
        self.env_steps = [0] * self.num_envs
        self.episode_return = [0.0] * self.num_envs
        self.episode_length = [0] * self.num_envs
        self.real_steps = 0
        self.ended: list[tuple[int, EpisodeStat]] = []

    def __len__(self) -> int:
        """Pending (not yet emitted) steps over all sub-envs."""
        return sum(len(p) for p in self.processors)

    def reset(self) -> None:
        """Forget windows, autoreset marks and running episodes (after an explicit ``env.reset()``).

        ``env_steps`` is kept: it counts transitions over the processor's lifetime."""
        for proc in self.processors:
            proc.reset()
        self.autoreset = [False] * self.num_envs
        self.episode_return = [0.0] * self.num_envs
        self.episode_length = [0] * self.num_envs
        self.real_steps = 0
        self.ended = []

    def step(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
    ) -> list[Transition]:
        """Feed one vector step (arrays with the sub-envs on axis 0); return the completed transitions.

        Observation and action rows are stored as views until emitted: the caller must not mutate
        these arrays in place afterwards (``SyncVectorEnv`` with ``copy=True`` returns fresh ones).
        """
        num = self.num_envs
        if len(obs) != num or len(next_obs) != num or len(actions) != num:
            raise ValueError(f"expected {num} rows of obs, actions and next_obs")
        reward_list = np.asarray(rewards, dtype=np.float64).tolist()
        term_list = np.asarray(terminated, dtype=bool).tolist()
        trunc_list = np.asarray(truncated, dtype=bool).tolist()
        if len(reward_list) != num or len(term_list) != num or len(trunc_list) != num:
            raise ValueError(f"expected {num} rewards, terminated and truncated flags")
        autoreset = self.autoreset
        out: list[Transition] = []
        ended: list[tuple[int, EpisodeStat]] = []
        real = 0
        for j in range(num):
            if autoreset[j]:
                autoreset[j] = False  # the reset step: next_obs[j] is the new episode's first obs
                continue
            real += 1
            reward, term, trunc = reward_list[j], term_list[j], trunc_list[j]
            out += self.processors[j].step(obs[j], actions[j], reward, term, trunc, next_obs[j])
            self.env_steps[j] += 1
            self.episode_return[j] += reward
            self.episode_length[j] += 1
            if term or trunc:
                ended.append((j, EpisodeStat(self.episode_return[j], self.episode_length[j])))
                self.episode_return[j] = 0.0
                self.episode_length[j] = 0
                autoreset[j] = True
        self.real_steps = real
        self.ended = ended
        return out


class ActedVersions:
    """The weights version each step still inside an n-step window was acted with.

    An n-step transition leaves its window up to ``n - 1`` steps after its action was taken, with
    possibly older weights than the actor holds when it leaves, so the version is recorded per
    step: one queue per (sub-)env, kept exactly as long as that env's window. Windows emit oldest
    first, so what the windows emitted is what leaves the front of the queues.
    """

    def __init__(self, num_envs: int) -> None:
        self._queues: list[deque[int]] = [deque() for _ in range(num_envs)]

    def step(self, version: int, fed: Sequence[bool], pending_after: Sequence[int]) -> int | None:
        """Record ``version`` for each env that was fed a real step (``fed``), then drop the steps
        the windows emitted (each queue shrinks to its window's length, ``pending_after``).
        Returns the oldest version among the emitted steps, or None if none was emitted."""
        oldest: int | None = None
        for queue, was_fed, left in zip(self._queues, fed, pending_after, strict=True):
            if was_fed:
                queue.append(version)
            while len(queue) > left:
                acted = queue.popleft()
                oldest = acted if oldest is None else min(oldest, acted)
        return oldest


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
