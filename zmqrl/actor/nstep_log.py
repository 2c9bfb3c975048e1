"""The actor's n-step path on arrays: log each env step as it comes, fold a whole batch at once.

``NStepProcessor`` (the definition, tests/nstep_reference.py) folds every step into transitions
as it arrives: a tuple per step in its window, a Python sum per emitted transition, a list of
tuples the batch is stacked from, and (``ActedVersions``) a queue of weights versions per window.
``NStepLog`` keeps only what a step must do at once: append the step's values to lists and count,
in a few integers, how many transitions the steps so far complete, so the actor knows when a
batch is ready. ``take`` then computes the batch's n-step returns, discounts and bootstrap rows
with one numpy operation per window step, in Python only for the few windows an episode end cut
short, and stacks each column with one concatenate.

Its output is the per-transition path's exactly (tests/test_nstep_log.py checks it against
``NStepProcessor`` / ``VectorNStep`` on random episodes): the same rows in the same order (by the
step that completed them, then sub-env, then step), the same batch boundaries (a batch is every
transition completed when the count first reaches ``send_batch``), the same float64 arithmetic
in the same order before the float32 cast (a running sum for a full window, the backward
recursion for a window an episode end cut short), and the oldest weights version acted with.

The log is time-major: row ``t`` holds one (vector) step, sub-envs on axis 1. With a vector env
(gymnasium ``AutoresetMode.NEXT_STEP``) the row after a sub-env's end is its autoreset step,
which is not a transition: it is kept in the log (other sub-envs stepped for real in that row)
and never emitted. A window never spans an episode end, so a sub-env's window is always
consecutive rows. After ``take`` the log keeps only the rows some sub-env still has pending
(fewer than ``n``), and remembers per sub-env which of those it already emitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from zmqrl.types import EpisodeStat, TransitionBatch


def stack_rows(items: list[Any]) -> np.ndarray:
    """``np.stack(items)`` for arrays of one shape, faster for small rows (one concatenate, no
    per-row checks); anything else (scalars) through ``np.array``."""
    first = items[0]
    if isinstance(first, np.ndarray) and first.ndim:
        return np.concatenate(items).reshape(len(items), *first.shape)
    return np.array(items)


class NStepLog:
    """Env steps of ``num_envs`` (sub-)envs, logged until a batch of n-step transitions is complete.

    Feed every step with :meth:`add` (a vector step: arrays with the sub-envs on axis 0) or
    :meth:`add_single` (one env's step, values as the env returned them). ``ready`` says when at
    least ``send_batch`` transitions are complete; :meth:`take` returns them as one batch with
    the oldest weights version they were acted with. Observation arrays are kept by reference
    until taken: the caller must not mutate them in place (gymnasium returns fresh ones).
    """

    def __init__(
        self,
        num_envs: int,
        n: int,
        gamma: float,
        send_batch: int,
        obs_dtype: DTypeLike,
        action_dtype: DTypeLike,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.num_envs = int(num_envs)
        self.n = int(n)
        self.gamma = float(gamma)
        self.send_batch = int(send_batch)
        self._obs_dtype = np.dtype(obs_dtype)
        self._action_dtype = np.dtype(action_dtype)
        # The same Python floats NStepProcessor multiplies by: powers[k] == gamma ** k.
        self._powers = np.array([self.gamma**k for k in range(self.n + 1)], dtype=np.float64)
        self._obs: list[Any] = []
        self._actions: list[Any] = []
        self._rewards: list[Any] = []
        self._next_obs: list[Any] = []
        self._versions: list[int] = []
        # Rows where some sub-env's episode ended: (row, ended mask, terminated mask), E bools each.
        self._ends: list[tuple[int, np.ndarray, np.ndarray]] = []
        # Per sub-env: rows before _start[j] are emitted (or were never transitions).
        self._start = np.zeros(self.num_envs, dtype=np.int64)
        # Sub-envs whose first row in the log is their autoreset step (ended in the row before).
        self._first_resetting = np.zeros(self.num_envs, dtype=bool)
        # Real steps logged and not emitted, and how many of them are still inside a window.
        self._unemitted = 0
        self._pending = 0
        # Vector steps so far; per sub-env, the step its running episode's first real step is
        # (or will be) and its autoreset steps so far; the step from which, unless an episode
        # ends, every window stays full (so the pending count stays as it is).
        self._clock = 0
        # (Python lists: with a few sub-envs, plain ints beat numpy's per-call cost.)
        self._begin = [0] * self.num_envs
        self._autoresets = [0] * self.num_envs
        self._steady_from = self.n - 1
        self._resetting: np.ndarray | None = None  # sub-envs in their autoreset step next
        self._resetting_count = 0
        self._returns = np.zeros(self.num_envs, dtype=np.float64)  # running episodes' rewards
        self._vector = False  # fed by add (rows after an end are autoreset steps), not add_single
        # Episodes that ended in the last vector step, in sub-env order: (sub-env, its stat).
        self.ended: list[tuple[int, EpisodeStat]] = []

    def __len__(self) -> int:
        """Transitions complete and not taken yet."""
        return self._unemitted - self._pending

    @property
    def ready(self) -> bool:
        return self._unemitted - self._pending >= self.send_batch

    @property
    def env_steps(self) -> np.ndarray:
        """Each sub-env's real steps so far (a vector env's autoreset steps are not counted)."""
        return self._clock - np.array(self._autoresets, dtype=np.int64)

    def add_single(
        self,
        obs: Any,
        action: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        next_obs: Any,
        version: int,
    ) -> None:
        """One env's step (``num_envs`` == 1; the caller resets the env after an end): ``obs`` and
        ``next_obs`` of the env's shape, ``reward`` a float."""
        self._obs.append(obs)
        self._actions.append(action)
        self._rewards.append(reward)
        self._next_obs.append(next_obs)
        self._versions.append(version)
        self._unemitted += 1
        self._clock += 1
        if terminated or truncated:
            self._ends.append((len(self._obs) - 1, np.array([True]), np.array([bool(terminated)])))
            self._begin[0] = self._clock
            self._pending = 0
        elif self._pending < self.n - 1:
            self._pending += 1

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        version: int,
    ) -> int:
        """One step of a vector env in NEXT_STEP autoreset mode (sub-envs on axis 0); returns its
        real transitions (rows not in their autoreset step). ``ended`` then lists the episodes
        that ended in it."""
        num = self.num_envs
        if len(obs) != num or len(next_obs) != num or len(actions) != num or len(rewards) != num:
            raise ValueError(f"expected {num} rows of obs, actions, rewards and next_obs")
        self._obs.append(obs)
        self._actions.append(actions)
        self._rewards.append(rewards)
        self._next_obs.append(next_obs)
        self._versions.append(version)
        resetting = self._resetting
        real = num if resetting is None else num - self._resetting_count
        terminated = np.asarray(terminated, dtype=bool)
        ended = terminated | np.asarray(truncated, dtype=bool)
        count = int(np.count_nonzero(ended))
        self._vector = True
        self._clock = clock = self._clock + 1
        self._unemitted += real
        self._returns += rewards
        begin = self._begin
        if resetting is not None:  # gymnasium ignored their actions: no reward, no step
            self._returns[resetting] = 0.0
            for j in np.flatnonzero(resetting).tolist():
                self._autoresets[j] += 1
        if count:
            self._ends.append((len(self._obs) - 1, ended, ended & terminated))
            finished = np.flatnonzero(ended).tolist()
            self.ended = [(j, EpisodeStat(float(self._returns[j]), clock - begin[j])) for j in finished]
            for j in finished:
                begin[j] = clock + 1  # after the autoreset step
            self._resetting, self._resetting_count = ended, count
        else:
            self._resetting = None
            if self.ended:
                self.ended = []
        if count or resetting is not None or clock <= self._steady_from:
            longest = self.n - 1
            self._pending = sum(min(longest, max(0, clock - b)) for b in begin)
            self._steady_from = max(begin) + longest
        return real

    def take(self) -> tuple[TransitionBatch, int]:
        """Every complete transition as a batch (order: the step that completed it, then sub-env,
        then step) and the oldest weights version among them; keeps the steps still pending.
        Raises ValueError when none is complete."""
        if self._unemitted - self._pending <= 0:
            raise ValueError("no complete n-step transition to take")
        return self._take_vector() if self._vector else self._take_single()

    def _cut(self, rewards: list[Any], end: int, first: int, terminated: bool, env: int | None) -> Any:
        """The rows ``first..end`` of one sub-env whose window an episode end at ``end`` cut short,
        newest first, as ``(row, n-step return, discount)``: NStepProcessor's flush, the same
        backward recursion in the same float64 arithmetic."""
        gamma, powers = self.gamma, self._powers
        acc = 0.0
        for row in range(end, first - 1, -1):
            acc = (rewards[row] if env is None else rewards[row][env]) + gamma * acc
            yield row, acc, 0.0 if terminated else float(powers[end - row + 1])

    def _take_single(self) -> tuple[TransitionBatch, int]:
        """One env: the complete rows are a prefix of the log; full windows are summed with one
        numpy operation per window step, the few an episode end cut short in Python."""
        n, powers = self.n, self._powers
        start, count = int(self._start[0]), self._unemitted - self._pending
        stop = start + count
        rewards = self._rewards
        window = np.zeros(count + n - 1, dtype=np.float64)
        known = rewards[start : stop + n - 1]
        window[: len(known)] = known
        ret = np.zeros(count, dtype=np.float64)
        for i in range(n):  # NStepProcessor's running sum, oldest step first
            ret += powers[i] * window[i : i + count]
        last = list(range(start + n - 1, stop + n - 1))  # the row each bootstraps from
        discount = np.full(count, powers[n], dtype=np.float64)
        previous_end = start - 1
        for end, _, terminal in self._ends:
            first = max(previous_end + 1, end - n + 1)
            for row, value, disc in self._cut(rewards, end, first, bool(terminal[0]), None):
                ret[row - start], discount[row - start], last[row - start] = value, disc, end
            previous_end = end
        batch = TransitionBatch(
            obs=stack_rows(self._obs[start:stop]).astype(self._obs_dtype, copy=False),
            action=np.asarray(self._actions[start:stop], dtype=self._action_dtype),
            reward=ret.astype(np.float32),
            next_obs=stack_rows([self._next_obs[row] for row in last]).astype(self._obs_dtype, copy=False),
            discount=discount.astype(np.float32),
        )
        version = min(self._versions[start:stop])
        for name in ("_obs", "_actions", "_rewards", "_next_obs", "_versions"):
            setattr(self, name, getattr(self, name)[stop:])
        self._ends = []  # an end completes every row up to it: none is left in the log
        self._start[0] = 0
        self._unemitted = self._pending
        return batch, version

    def _take_vector(self) -> tuple[TransitionBatch, int]:
        """A vector env: the same on a (rows, sub-envs) grid, then the complete cells in the
        order the per-step path emitted them."""
        rows, envs, n, powers = len(self._obs), self.num_envs, self.n, self._powers
        rewards = np.asarray(self._rewards, dtype=np.float64)
        ret = np.zeros((rows, envs), dtype=np.float64)
        full = rows - n + 1  # rows whose whole window is in the log
        for i in range(n if full > 0 else 0):  # NStepProcessor's running sum, oldest step first
            ret[:full] += powers[i] * rewards[i : i + full]
        time = np.arange(rows, dtype=np.int64)[:, None]
        last = np.repeat(time + (n - 1), envs, axis=1)
        discount = np.full((rows, envs), powers[n], dtype=np.float64)
        real = np.ones((rows, envs), dtype=bool)
        real[0] = ~self._first_resetting
        # Before its first row: a sub-env whose first row is an autoreset step ended just before.
        previous_end = np.where(self._first_resetting, -1, -2).tolist()
        reward_rows = rewards.tolist() if self._ends else []
        for end, ended_mask, terminal_mask in self._ends:
            for env in np.flatnonzero(ended_mask).tolist():
                first = max(previous_end[env] + 2, end - n + 1, 0)  # + 2: skip its autoreset row
                for row, value, disc in self._cut(reward_rows, end, first, bool(terminal_mask[env]), env):
                    ret[row, env], discount[row, env], last[row, env] = value, disc, end
                previous_end[env] = end
                if end + 1 < rows:
                    real[end + 1, env] = False
        candidate = real & (time >= self._start)
        complete = candidate & (last < rows)
        t_sel, env_sel = np.nonzero(complete)
        last_sel = last[t_sel, env_sel]
        order = np.lexsort((t_sel, env_sel, last_sel))
        t_sel, env_sel, last_sel = t_sel[order], env_sel[order], last_sel[order]
        obs, next_obs, actions = stack_rows(self._obs), stack_rows(self._next_obs), stack_rows(self._actions)
        batch = TransitionBatch(
            obs=obs[t_sel, env_sel].astype(self._obs_dtype, copy=False),
            action=actions[t_sel, env_sel].astype(self._action_dtype, copy=False),
            reward=ret[t_sel, env_sel].astype(np.float32),
            next_obs=next_obs[last_sel, env_sel].astype(self._obs_dtype, copy=False),
            discount=discount[t_sel, env_sel].astype(np.float32),
        )
        version = int(np.asarray(self._versions)[t_sel].min())
        self._keep_pending(rows, (candidate & ~complete).sum(axis=0), real)
        return batch, version

    def _keep_pending(self, rows: int, per_env: np.ndarray, real: np.ndarray) -> None:
        """Drop the rows no sub-env still needs: each sub-env's pending steps are the last rows of
        its running episode, so the log restarts at the earliest of them."""
        start = rows - per_env
        first = int(start.min())
        if first < rows:
            self._first_resetting = ~real[first]
        else:  # nothing pending: the next row is an autoreset step where an episode just ended
            self._first_resetting = (
                self._resetting.copy() if self._resetting is not None else np.zeros(self.num_envs, bool)
            )
        for name in ("_obs", "_actions", "_rewards", "_next_obs", "_versions"):
            setattr(self, name, getattr(self, name)[first:])
        self._ends = [(row - first, e, t) for row, e, t in self._ends if row >= first]
        self._start = start - first
        self._unemitted = int(per_env.sum())
        if self._unemitted != self._pending:
            raise AssertionError(f"n-step log: {self._unemitted} steps pending, counted {self._pending}")
