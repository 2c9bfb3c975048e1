"""Exploration: who explores how much (the Ape-X epsilon ladder, a linear annealing schedule) and how
(a uniformly random action of the spec's space in place of the policy's, row by row).

Ape-X gives each actor a fixed epsilon instead of annealing one shared value: a spread from
mostly-random to nearly-greedy actors keeps both broad coverage and on-policy-ish data in replay
for the whole run, with no schedule to tune against the run length.

An actor explores on its rung of that ladder (and anneals towards it from 1.0), whatever the
algorithm: DQN's epsilon-greedy and SAC's random warm-up are both "a uniformly random action of
the env's action space, else the policy's own". The space is the run's ``SampleSpec``, so the
rule is written once here and no agent carries an epsilon: a policy only acts
(``act(obs, explore=True)``: its own exploration, e.g. SAC's Gaussian), and the actor's
:class:`EpsilonExplorer` replaces rows around it. Both halves are the actor's: the amount and the
way are decided in one place.
"""

from __future__ import annotations

import math

import numpy as np

from zmqrl.agents.masks import random_legal
from zmqrl.core import Policy
from zmqrl.spec import SampleSpec

# Defaults from the Ape-X paper (Horgan et al., 2018): eps_i = 0.4 ** (1 + 7 * i / (N - 1)).
APEX_BASE_EPSILON = 0.4
APEX_ALPHA = 7.0


def apex_epsilon(
    index: int, num_actors: int, base: float = APEX_BASE_EPSILON, alpha: float = APEX_ALPHA
) -> float:
    """Epsilon of actor ``index`` among ``num_actors``: ``base ** (1 + alpha * i / (N - 1))``.

    Actor 0 gets ``base`` (most exploratory), actor N-1 gets ``base ** (1 + alpha)`` (nearly
    greedy). A single actor gets ``base``: the ladder formula is undefined for N = 1, and the
    most exploratory rung is the safer choice for an actor that must explore alone.
    """
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if not 0 <= index < num_actors:
        raise ValueError(f"index must be in [0, {num_actors}), got {index}")
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"base must be in [0, 1], got {base}")
    if alpha < 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if num_actors == 1:
        return float(base)
    return float(base ** (1.0 + alpha * index / (num_actors - 1)))


def extra_rung_position(extra: int, rungs: int) -> float:
    """Where on the ladder (0: ``base``, 1: ``base ** (1 + alpha)``) the ``extra``-th rung past a
    ladder of ``rungs`` sits: halfway between two neighbouring rungs, then a quarter, an eighth...

    Under docker compose or Kubernetes more actors can join than ``actor.num_actors`` says (``--scale
    actor=N``); each must still explore at a rate of its own. Taking the last rung again (what the
    formula gives when N grows with the id) made every extra single-env actor as greedy as the last
    configured one. Bisecting the gaps keeps the configured rungs where they are (the actors already
    running keep their rates), never repeats a rate, and spreads the first extras over the whole
    span: the midpoints of every gap come before any quarter point. A ladder of one rung is first
    extended by its other end (``base ** (1 + alpha)``), as a ladder of two would have it.
    """
    if extra < 0 or rungs < 1:
        raise ValueError(f"need extra >= 0 and rungs >= 1, got extra={extra}, rungs={rungs}")
    if rungs == 1:
        if extra == 0:
            return 1.0
        extra -= 1
    gaps = max(rungs - 1, 1)
    level = 1
    while extra >= gaps << (level - 1):
        extra -= gaps << (level - 1)
        level += 1
    # Level L adds 2 ** (L - 1) points per gap; the t-th of them in every gap before the (t+1)-th.
    t, gap = divmod(extra, gaps)
    return (gap + (2 * t + 1) / 2**level) / gaps


def ladder_epsilon(
    index: int, rungs: int, base: float = APEX_BASE_EPSILON, alpha: float = APEX_ALPHA
) -> float:
    """Epsilon of rung ``index`` of a ladder of ``rungs``, or past its end (an actor beyond
    ``actor.num_actors``) at :func:`extra_rung_position`: distinct from every other rung either way."""
    if index < rungs:
        return apex_epsilon(index, rungs, base, alpha)
    apex_epsilon(0, rungs, base, alpha)  # the same checks of the arguments
    return float(base ** (1.0 + alpha * extra_rung_position(index - rungs, rungs)))


class LinearSchedule:
    """A value moving linearly from ``start`` to ``end`` over ``duration`` steps, then held.

    Clamped on both sides: ``t <= 0`` gives ``start`` and ``t >= duration`` gives ``end``, so a
    caller can pass a raw step counter. ``duration == 0`` means "already at ``end``".
    """

    def __init__(self, start: float, end: float, duration: int) -> None:
        if duration < 0:
            raise ValueError(f"duration must be >= 0, got {duration}")
        self.start = float(start)
        self.end = float(end)
        self.duration = duration

    def __call__(self, t: float) -> float:
        if self.duration == 0 or t >= self.duration:
            return self.end
        if t <= 0:
            return self.start
        return self.start + (self.end - self.start) * (t / self.duration)

    def __repr__(self) -> str:
        return f"LinearSchedule(start={self.start}, end={self.end}, duration={self.duration})"


# Stream of the actor's seed that draws exploration, apart from the policy's own draws.
EXPLORE_STREAM = 2


class RandomActions:
    """Uniformly random actions of the spec's space: ``0..num_actions-1`` (int64) for a Discrete
    space, ``[low, high]`` per dimension (float32) for a Box (an infinite or missing bound counts
    as -1 / +1: nothing uniform lies beyond it). A masked run's rows (``spec.action_mask``) draw
    uniformly among their own legal actions."""

    def __init__(self, spec: SampleSpec) -> None:
        self.num_actions = spec.num_actions
        self.masked = spec.action_mask
        self.shape = tuple(spec.action_shape)
        if self.num_actions is None:
            size = math.prod(self.shape)
            low = np.full(size, -1.0) if spec.action_low is None else np.asarray(spec.action_low, np.float64)
            high = (
                np.full(size, 1.0) if spec.action_high is None else np.asarray(spec.action_high, np.float64)
            )
            low = np.broadcast_to(low, (size,))
            high = np.broadcast_to(high, (size,))
            self.low = np.where(np.isfinite(low), low, -1.0).astype(np.float32).reshape(self.shape)
            self.high = np.where(np.isfinite(high), high, 1.0).astype(np.float32).reshape(self.shape)

    def __call__(self, rng: np.random.Generator, n: int, obs: np.ndarray | None = None) -> np.ndarray:
        if self.masked and self.num_actions is not None:
            if obs is None:
                raise ValueError("a masked run's random actions need the observations they are legal in")
            return random_legal(rng, obs, self.num_actions)
        if self.num_actions is not None:
            return rng.integers(self.num_actions, size=n, dtype=np.int64)
        return rng.uniform(self.low, self.high, size=(n, *self.shape)).astype(np.float32)


class EpsilonExplorer:
    """``policy``'s actions with each row replaced, with probability ``epsilon``, by a uniformly
    random action; when every row is random the policy is not evaluated (an actor's warm-up at
    epsilon 1 costs no forward pass).

    ``epsilon`` is a plain attribute, one probability for every row or one per row (a vector
    actor's sub-envs on their rungs): whoever owns the schedule (the actor's sampler) sets it.
    """

    def __init__(
        self,
        policy: Policy,
        spec: SampleSpec,
        *,
        seed: int | None = None,
        epsilon: float | np.ndarray = 0.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.policy = policy
        self.epsilon: float | np.ndarray = epsilon
        self.rng = (
            rng
            if rng is not None
            else np.random.default_rng(None if seed is None else [seed, EXPLORE_STREAM])
        )
        self._random = RandomActions(spec)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions for observations ``(B, *obs_shape)``, the policy exploring in its own way
        (``explore=True``) where a row is not random."""
        epsilon = self.epsilon
        # np.any's per-call cost shows on the single-env actor's hot path: keep the scalar test there.
        if not (epsilon > 0.0 if isinstance(epsilon, float) else bool(np.any(epsilon > 0.0))):
            return self.policy.act(obs, explore=True)
        n = obs.shape[0]
        random_rows = self.rng.random(n) < epsilon
        n_random = int(np.count_nonzero(random_rows))
        if n_random == n:
            return self._random(self.rng, n, obs)
        actions = self.policy.act(obs, explore=True)
        if n_random:
            if not actions.flags.writeable:
                actions = actions.copy()
            actions[random_rows] = self._random(self.rng, n_random, obs[random_rows])
        return actions
