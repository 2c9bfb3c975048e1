"""Epsilon exploration around any policy: each row a uniformly random action with probability epsilon.

An actor explores on its rung of the Ape-X ladder (and anneals towards it from 1.0), whatever the
algorithm: DQN's epsilon-greedy and SAC's random warm-up are both "a uniformly random action of
the env's action space, else the policy's own". The space is the run's ``SampleSpec``, so the
rule is written once here and no agent carries an epsilon: a policy only acts
(``act(obs, explore=True)``: its own exploration, e.g. SAC's Gaussian), and the actor's
:class:`EpsilonExplorer` replaces rows around it.
"""

from __future__ import annotations

import math

import numpy as np

from zmqrl.core import Policy
from zmqrl.spec import SampleSpec

# Stream of the actor's seed that draws exploration, apart from the policy's own draws.
EXPLORE_STREAM = 2


class RandomActions:
    """Uniformly random actions of the spec's space: ``0..num_actions-1`` (int64) for a Discrete
    space, ``[low, high]`` per dimension (float32) for a Box (an infinite or missing bound counts
    as -1 / +1: nothing uniform lies beyond it)."""

    def __init__(self, spec: SampleSpec) -> None:
        self.num_actions = spec.num_actions
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

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
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
        # np.any costs ~1 µs per call: keep the scalar test for the single-env actor's hot path.
        if not (epsilon > 0.0 if isinstance(epsilon, float) else bool(np.any(epsilon > 0.0))):
            return self.policy.act(obs, explore=True)
        n = obs.shape[0]
        random_rows = self.rng.random(n) < epsilon
        n_random = int(np.count_nonzero(random_rows))
        if n_random == n:
            return self._random(self.rng, n)
        actions = self.policy.act(obs, explore=True)
        if n_random:
            if not actions.flags.writeable:
                actions = actions.copy()
            actions[random_rows] = self._random(self.rng, n_random)
        return actions
