"""Continuous action bounds in the run's SampleSpec: built from the env's Box, and met by real actors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_policy
from zmqrl.agents.configs import SACConfig
from zmqrl.config import EnvConfig
from zmqrl.envs.factory import make_env, make_vector_env, sample_spec
from zmqrl.spec import SampleSpec
from zmqrl.transport.wire import SamplesMsg, WireError, validate_samples
from zmqrl.types import TransitionBatch


def spec(**bounds: Any) -> SampleSpec:
    return SampleSpec(
        obs_shape=(3,), obs_dtype="float32", action_shape=(2,), action_dtype="float32", **bounds
    )


def test_scalar_and_array_bounds_are_broadcast_and_stored_as_flat_float_tuples() -> None:
    assert spec(action_low=-1, action_high=np.float32(1)).action_low == (-1.0, -1.0)
    s = spec(action_low=np.array([-2.0, 0.0], np.float32), action_high=[2.0, math.inf])
    assert (s.action_low, s.action_high) == ((-2.0, 0.0), (2.0, math.inf))
    assert s == spec(action_low=(-2.0, 0.0), action_high=(2.0, math.inf)) and hash(s) == hash(
        spec(action_low=(-2.0, 0.0), action_high=(2.0, math.inf))
    )


@pytest.mark.parametrize(
    ("bounds", "match"),
    [
        ({"action_low": -1.0}, "together"),
        ({"action_high": 1.0}, "together"),
        ({"action_low": [0.0, 0.0, 0.0], "action_high": 1.0}, "does not fit"),
        ({"action_low": 1.0, "action_high": [2.0, 0.5]}, "<= action_high"),
        ({"action_low": math.nan, "action_high": 1.0}, "NaN"),
    ],
)
def test_bad_bounds_are_refused_when_the_spec_is_built(bounds: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        spec(**bounds)


def test_bounds_are_for_continuous_actions_only() -> None:
    with pytest.raises(ValueError, match="continuous"):
        SampleSpec(
            obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2,
            action_low=0.0, action_high=1.0,
        )  # fmt: skip


def test_sample_spec_takes_the_bounds_from_a_box_action_space() -> None:
    single = sample_spec(make_env(EnvConfig(id="Pendulum-v1")))
    assert (single.action_low, single.action_high) == ((-2.0,), (2.0,))
    vector = sample_spec(make_vector_env(EnvConfig(id="Pendulum-v1"), 2))
    assert (vector.action_low, vector.action_high) == ((-2.0,), (2.0,)), "a single sub-env's bounds"
    discrete = sample_spec(make_env(EnvConfig(id="CartPole-v1")))
    assert discrete.action_low is None and discrete.action_high is None


def test_a_sac_actors_actions_pass_the_learners_bounds_check() -> None:
    env = make_env(EnvConfig(id="Pendulum-v1"))
    run_spec = sample_spec(env)
    config = SACConfig(hidden_sizes=[8], device="cpu")
    policy = make_policy(config, run_spec, seed=0)  # what an actor acts with, and explores around
    agent = EpsilonExplorer(policy, run_spec, seed=0, epsilon=0.3)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((512, 3)).astype(np.float32) * 50  # far from anything seen: saturated tanh
    actions = agent.act(obs)
    n = len(obs)
    limits = run_spec.obs_limits()
    assert limits is not None
    seen = np.clip(obs, *limits)  # what the env could have shown: the learner refuses the rest
    batch = TransitionBatch(seen, actions, np.zeros(n, np.float32), seen, np.ones(n, np.float32))
    validate_samples(SamplesMsg(0, 0, 0, batch, []), run_spec)
    pushed = batch._replace(action=np.full_like(batch.action, 2.01))
    with pytest.raises(WireError, match="bounds"):
        validate_samples(SamplesMsg(0, 0, 0, pushed, []), run_spec)
