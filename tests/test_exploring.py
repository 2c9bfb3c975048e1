"""The actor's epsilon exploration around any policy (zmqrl.actor.exploration): uniformly random
actions of the spec's space, row by row, and the policy's own acting elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from zmqrl.actor.exploration import EpsilonExplorer, RandomActions
from zmqrl.spec import SampleSpec

DISCRETE = SampleSpec((4,), "float32", (), "int64", num_actions=3)
BOX = SampleSpec((3,), "float32", (2,), "float32", action_low=(-2.0, 0.0), action_high=(2.0, 1.0))


class Constant:
    """A policy that always picks the same action and counts its forward passes."""

    def __init__(self, action: np.ndarray) -> None:
        self.action = action
        self.calls: list[bool] = []

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        self.calls.append(explore)
        return np.repeat(self.action[None], obs.shape[0], axis=0)

    def load_weights(self, arrays: object) -> None:
        pass


def obs(n: int, dim: int = 4) -> np.ndarray:
    return np.zeros((n, dim), np.float32)


def test_epsilon_one_is_uniform_over_the_actions_without_a_forward_pass() -> None:
    policy = Constant(np.array(0))
    explorer = EpsilonExplorer(policy, DISCRETE, seed=0, epsilon=1.0)
    actions = explorer.act(obs(3000))
    assert actions.dtype == np.int64 and actions.shape == (3000,)
    assert np.bincount(actions, minlength=3).min() > 800  # ~1000 each
    assert policy.calls == [], "every row random: the policy is not evaluated"


def test_epsilon_zero_is_the_policys_own_exploring_act() -> None:
    policy = Constant(np.array(2))
    actions = EpsilonExplorer(policy, DISCRETE, seed=0).act(obs(50))
    np.testing.assert_array_equal(actions, np.full(50, 2))
    assert policy.calls == [True], "the policy explores in its own way (SAC's Gaussian)"


def test_partial_epsilon_replaces_that_share_of_rows() -> None:
    explorer = EpsilonExplorer(Constant(np.array(2)), DISCRETE, seed=0, epsilon=0.5)
    off = float(np.mean(explorer.act(obs(3000)) != 2))
    assert off == pytest.approx(0.5 * 2 / 3, abs=0.05)


def test_one_epsilon_per_row_as_a_vector_actors_sub_envs() -> None:
    explorer = EpsilonExplorer(Constant(np.array(2)), DISCRETE, seed=0, epsilon=np.array([0.0, 1.0, 0.0]))
    random_row = [explorer.act(obs(3))[1] for _ in range(300)]
    rows = np.stack([explorer.act(obs(3)) for _ in range(50)])
    assert (rows[:, [0, 2]] == 2).all() and len(set(random_row)) == 3


def test_box_actions_are_uniform_within_the_specs_bounds() -> None:
    explorer = EpsilonExplorer(Constant(np.array([0.5, 0.5], np.float32)), BOX, seed=0, epsilon=1.0)
    actions = explorer.act(obs(4000, 3))
    assert actions.dtype == np.float32 and actions.shape == (4000, 2)
    assert (actions >= [-2.0, 0.0]).all() and (actions <= [2.0, 1.0]).all()
    np.testing.assert_allclose(actions.mean(axis=0), [0.0, 0.5], atol=0.05)


def test_infinite_or_missing_bounds_draw_from_minus_one_to_one() -> None:
    unbounded = SampleSpec((3,), "float32", (1,), "float32", action_low=-np.inf, action_high=np.inf)
    for spec in (unbounded, SampleSpec((3,), "float32", (1,), "float32")):
        actions = RandomActions(spec)(np.random.default_rng(0), 1000)
        assert np.isfinite(actions).all() and (np.abs(actions) <= 1.0).all()


def test_same_seed_same_draws_and_a_read_only_policy_output_is_copied() -> None:
    class ReadOnly(Constant):
        def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
            out = super().act(obs, explore)
            out.flags.writeable = False
            return out

    a = EpsilonExplorer(ReadOnly(np.array(2)), DISCRETE, seed=5, epsilon=0.5)
    b = EpsilonExplorer(Constant(np.array(2)), DISCRETE, seed=5, epsilon=0.5)
    np.testing.assert_array_equal(a.act(obs(64)), b.act(obs(64)))
