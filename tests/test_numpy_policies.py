"""The torch-free policies act exactly like the torch agents whose weights they import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from zmqrl.agents import make_policy
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.numpy_policies import NumpyDQNPolicy, NumpySACPolicy
from zmqrl.agents.sac import SACAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch, Weights

torch.set_num_threads(1)

OBS_SHAPE = (5,)
N_ACTIONS = 3
CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32")


def dqn_config(dueling: bool) -> DQNConfig:
    return DQNConfig(hidden_sizes=[16, 8], dueling=dueling, device="cpu")


def trained_weights(dueling: bool) -> Weights:
    """Weights of a torch DQN after a few updates (so no parameter is at its initial value)."""
    learner = DQNAgent(dqn_config(dueling), OBS_SHAPE, N_ACTIONS, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        learner.update(random_batch(rng, 32))
    return learner.export_weights()


def random_batch(rng: np.random.Generator, n: int) -> TransitionBatch:
    return TransitionBatch(
        obs=rng.normal(size=(n, *OBS_SHAPE)).astype(np.float32),
        action=rng.integers(N_ACTIONS, size=n).astype(np.int64),
        reward=rng.normal(size=n).astype(np.float32),
        next_obs=rng.normal(size=(n, *OBS_SHAPE)).astype(np.float32),
        discount=rng.choice([0.0, 0.97], size=n).astype(np.float32),
    )


def dqn_pair(dueling: bool, seed: int = 3) -> tuple[DQNAgent, NumpyDQNPolicy]:
    """A torch actor and a numpy policy holding the same published weights, seeded alike."""
    weights = trained_weights(dueling)
    torch_actor = DQNAgent(dqn_config(dueling), OBS_SHAPE, N_ACTIONS, device="cpu", seed=seed)
    numpy_policy = NumpyDQNPolicy(dqn_config(dueling), OBS_SHAPE, N_ACTIONS, seed=seed)
    assert torch_actor.import_weights(weights) and numpy_policy.import_weights(weights)
    return torch_actor, numpy_policy


@pytest.mark.parametrize("dueling", [False, True])
def test_numpy_dqn_imports_the_torch_layout_and_acts_greedily_the_same(dueling: bool) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling)
    assert list(numpy_policy.weights_spec().items()) == list(torch_actor.weights_spec().items())
    obs = np.random.default_rng(1).normal(size=(500, *OBS_SHAPE)).astype(np.float32)
    np.testing.assert_allclose(numpy_policy.q_values(obs), torch_actor.q_values(obs), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(numpy_policy.act(obs, explore=False), torch_actor.act(obs, explore=False))
    assert numpy_policy.weights_version == torch_actor.weights_version == 1


@pytest.mark.parametrize("dueling", [False, True])
def test_numpy_dqn_initial_priorities_match_the_torch_actors(dueling: bool) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling)
    batch = random_batch(np.random.default_rng(2), 64)
    mine = numpy_policy.initial_priorities(batch)
    assert mine.dtype == np.float32 and mine.shape == (64,)
    np.testing.assert_allclose(mine, torch_actor.initial_priorities(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, np.array([0.0, 1.0, 0.5, 0.2])])
def test_numpy_dqn_explores_with_the_same_draws_as_the_torch_agent(epsilon: float | np.ndarray) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling=False, seed=11)
    torch_actor.epsilon = numpy_policy.epsilon = epsilon
    obs = np.random.default_rng(4).normal(size=(20, 4, *OBS_SHAPE)).astype(np.float32)
    for rows in obs:  # one call per step, as an actor makes them: the RNG streams must stay in step
        np.testing.assert_array_equal(
            numpy_policy.act(rows, explore=True), torch_actor.act(rows, explore=True)
        )


def test_numpy_dqn_import_is_versioned_and_checked() -> None:
    weights = trained_weights(dueling=False)
    policy = NumpyDQNPolicy(dqn_config(False), OBS_SHAPE, N_ACTIONS, seed=0)
    assert policy.import_weights(Weights(2, weights.arrays))
    assert not policy.import_weights(Weights(2, weights.arrays)), "same version must not reload"
    missing = {k: v for k, v in weights.arrays.items() if k != "head.bias"}
    with pytest.raises(ValueError, match=r"missing parameter 'head\.bias'"):
        policy.import_weights(Weights(3, missing))
    with pytest.raises(ValueError, match="unexpected parameter 'extra'"):
        policy.import_weights(Weights(3, {**weights.arrays, "extra": np.zeros(1, np.float32)}))
    wrong = {**weights.arrays, "head.weight": np.zeros((N_ACTIONS, 9), np.float32)}
    with pytest.raises(ValueError, match=r"'head\.weight' has shape"):
        policy.import_weights(Weights(3, wrong))
    assert policy.weights_version == 2


def test_sac_numpy_policy_acts_like_the_torch_agent_on_the_same_weights() -> None:
    config = SACConfig(hidden_sizes=[16, 16], device="cpu")
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    learner = SACAgent(config, (3,), 2, action_low=low, action_high=high, seed=0)
    torch_actor = SACAgent(config, (3,), 2, action_low=low, action_high=high, seed=7)
    numpy_policy = NumpySACPolicy(config, (3,), 2, action_low=low, action_high=high, seed=7)
    assert list(numpy_policy.weights_spec().items()) == list(learner.weights_spec().items())
    weights = learner.export_weights()
    assert torch_actor.import_weights(weights) and numpy_policy.import_weights(weights)
    obs = np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32)
    close = {"rtol": 1e-5, "atol": 1e-5}
    np.testing.assert_allclose(numpy_policy.act(obs, False), torch_actor.act(obs, False), **close)
    for epsilon in (0.0, 0.5, 1.0):
        torch_actor.epsilon = numpy_policy.epsilon = epsilon
        np.testing.assert_allclose(numpy_policy.act(obs, True), torch_actor.act(obs, True), **close)
    assert numpy_policy.initial_priorities(random_batch(np.random.default_rng(0), 4)) is None


def test_make_policy_is_numpy_for_the_mlp_and_torch_for_the_cnn() -> None:
    assert isinstance(make_policy(DQNConfig(hidden_sizes=[8]), CARTPOLE, seed=0), NumpyDQNPolicy)
    assert isinstance(make_policy(SACConfig(hidden_sizes=[8]), PENDULUM, seed=0), NumpySACPolicy)
    frames = SampleSpec((4, 84, 84), "uint8", (), "int64", num_actions=6)
    assert isinstance(make_policy(DQNConfig(torso="nature_cnn"), frames, seed=0, epsilon=0.5), DQNAgent)


@pytest.mark.parametrize(
    ("config", "spec"),
    [
        ("DQNConfig(hidden_sizes=[8], dueling=True, device='auto')", CARTPOLE),
        ("SACConfig(hidden_sizes=[8], device='auto')", PENDULUM),
    ],
)
def test_an_mlp_policy_is_built_and_acts_without_importing_torch(config: str, spec: SampleSpec) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import zmqrl.agents
        from zmqrl.agents import make_policy
        from zmqrl.agents.configs import DQNConfig, SACConfig
        from zmqrl.spec import SampleSpec
        policy = make_policy({config}, {spec!r}, seed=0, epsilon=0.5)
        policy.act(np.zeros((2, {spec.obs_shape[0]}), np.float32), explore=True)
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("torch modules:", loaded)
        sys.exit(1 if loaded else 0)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
