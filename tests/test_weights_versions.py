"""Weight versions live in transport (zmqrl.transport.weights_channel), not in the agents: the
learner's numbering of what it publishes and the actor's client that loads newer weights only."""

from __future__ import annotations

import numpy as np

from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.numpy_policies import NumpyDQNPolicy
from zmqrl.spec import SampleSpec
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.weights_channel import WeightsClient, WeightsNumbering
from zmqrl.types import Weights

SPEC = SampleSpec((4,), "float32", (), "int64", num_actions=2)


def policy(seed: int = 0) -> NumpyDQNPolicy:
    return NumpyDQNPolicy(DQNConfig(hidden_sizes=[8]), SPEC, seed=seed)


def test_versions_start_at_one_and_grow_only_after_a_change() -> None:
    numbering, arrays = WeightsNumbering(), policy().arrays
    assert numbering.version == 0
    assert numbering.stamp(arrays).version == 1
    assert numbering.stamp(arrays).version == 1, "republishing the same weights costs actors nothing"
    numbering.changed()
    assert numbering.version == 1  # not bumped until stamped
    assert numbering.stamp(arrays).version == 2
    assert numbering.stamp(arrays).version == 2


def test_a_restarted_learner_numbers_above_the_floor() -> None:
    numbering = WeightsNumbering()
    numbering.stamp({})
    numbering.continue_after(10)
    assert numbering.stamp({}).version == 11
    numbering.continue_after(5)  # below what it published: no effect
    assert numbering.stamp({}).version == 11
    assert WeightsNumbering(floor=7).stamp({}).version == 8


def test_the_client_loads_strictly_newer_versions_only() -> None:
    learner, actor = policy(0), policy(1)
    client = WeightsClient(actor)
    assert client.version == 0
    newer = Weights(3, {k: v.copy() for k, v in learner.arrays.items()})
    assert client.offer(newer) and client.version == 3 and client.loads == 1
    before = {k: v.copy() for k, v in actor.arrays.items()}
    zeros = {k: np.zeros_like(v) for k, v in newer.arrays.items()}
    assert client.offer(Weights(3, zeros)) is False, "a duplicated publish"
    assert client.offer(Weights(2, zeros)) is False, "a late publish can never roll an actor back"
    assert client.version == 3 and all(np.array_equal(actor.arrays[k], before[k]) for k in before)


def test_weights_the_policy_refuses_are_counted_and_change_nothing() -> None:
    actor, bad = policy(1), BadMessages("test weights")
    client = WeightsClient(actor, bad)
    before = {k: v.copy() for k, v in actor.arrays.items()}
    misfit = {name: np.zeros((3, 3), np.float32) for name in before}
    assert client.offer(Weights(9, misfit)) is False
    assert bad.count == 1 and client.version == 0 and client.loads == 0
    assert all(np.array_equal(actor.arrays[k], before[k]) for k in before)
    good = Weights(9, {k: np.full_like(v, 0.5) for k, v in before.items()})
    assert client.offer(good) and client.version == 9, "a refused version does not block a valid one"


def test_without_a_tally_the_client_makes_its_own() -> None:
    client = WeightsClient(policy())
    assert client.offer(Weights(1, {"nope": np.zeros(1, np.float32)})) is False
    assert client.bad.count == 1 and client.version == 0
