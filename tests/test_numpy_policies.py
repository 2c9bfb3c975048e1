"""The torch-free policies act exactly like the torch agents whose weights they load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_policy, make_priorities
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.layers import ActingNet, dqn_net, sac_policy_net
from zmqrl.agents.nets import QNetwork
from zmqrl.agents.numpy_policies import NumpyDQNPolicy, NumpySACPolicy, dqn_q_values
from zmqrl.agents.sac import SACAgent
from zmqrl.agents.sac_nets import SquashedGaussianPolicy
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

torch.set_num_threads(1)

OBS_SHAPE = (5,)
N_ACTIONS = 3
SPEC = SampleSpec(OBS_SHAPE, "float32", (), "int64", num_actions=N_ACTIONS)
CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32")


def dqn_config(dueling: bool) -> DQNConfig:
    return DQNConfig(hidden_sizes=[16, 8], dueling=dueling, device="cpu")


def trained_weights(dueling: bool) -> dict[str, np.ndarray]:
    """Weights of a torch DQN after a few updates (so no parameter is at its initial value)."""
    learner = DQNAgent(dqn_config(dueling), SPEC, seed=0)
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
    torch_actor = DQNAgent(dqn_config(dueling), SPEC, device="cpu", seed=seed)
    numpy_policy = NumpyDQNPolicy(dqn_config(dueling), SPEC, seed=seed)
    torch_actor.load_weights(weights)
    numpy_policy.load_weights(weights)
    return torch_actor, numpy_policy


@pytest.mark.parametrize("dueling", [False, True])
def test_numpy_dqn_loads_the_torch_layout_and_acts_greedily_the_same(dueling: bool) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling)
    exported = torch_actor.export_weights()
    assert [(k, v.shape) for k, v in numpy_policy.arrays.items()] == [
        (k, v.shape) for k, v in exported.items()
    ]
    obs = np.random.default_rng(1).normal(size=(500, *OBS_SHAPE)).astype(np.float32)
    np.testing.assert_allclose(numpy_policy.q_values(obs), torch_actor.q_values(obs), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(numpy_policy.act(obs, explore=False), torch_actor.act(obs, explore=False))
    np.testing.assert_array_equal(numpy_policy.act(obs, explore=True), torch_actor.act(obs, explore=True))


@pytest.mark.parametrize("dueling", [False, True])
def test_numpy_dqn_initial_priorities_match_the_torch_actors(dueling: bool) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling)
    batch = random_batch(np.random.default_rng(2), 64)
    mine = numpy_policy.initial_priorities(batch)
    assert mine.dtype == np.float32 and mine.shape == (64,)
    np.testing.assert_allclose(mine, torch_actor.initial_priorities(batch), rtol=1e-5, atol=1e-5)
    assert make_priorities(dqn_config(dueling), numpy_policy) is not None, "the DQN plugin gives them"


@pytest.mark.parametrize("epsilon", [0.3, 1.0, np.array([0.0, 1.0, 0.5, 0.2])])
def test_numpy_dqn_explores_with_the_same_draws_as_the_torch_agent(epsilon: float | np.ndarray) -> None:
    torch_actor, numpy_policy = dqn_pair(dueling=False, seed=11)
    mine = EpsilonExplorer(numpy_policy, SPEC, seed=11, epsilon=epsilon)
    theirs = EpsilonExplorer(torch_actor, SPEC, seed=11, epsilon=epsilon)
    obs = np.random.default_rng(4).normal(size=(20, 4, *OBS_SHAPE)).astype(np.float32)
    for rows in obs:  # one call per step, as an actor makes them: the RNG streams must stay in step
        np.testing.assert_array_equal(mine.act(rows), theirs.act(rows))


def test_numpy_dqn_load_is_checked_and_all_or_nothing() -> None:
    weights = trained_weights(dueling=False)
    policy = NumpyDQNPolicy(dqn_config(False), SPEC, seed=0)
    policy.load_weights(weights)
    before = {k: v.copy() for k, v in policy.arrays.items()}
    missing = {k: v for k, v in weights.items() if k != "head.bias"}
    with pytest.raises(ValueError, match=r"missing parameter 'head\.bias'"):
        policy.load_weights(missing)
    with pytest.raises(ValueError, match="unexpected parameter 'extra'"):
        policy.load_weights({**weights, "extra": np.zeros(1, np.float32)})
    wrong = {**weights, "head.weight": np.zeros((N_ACTIONS, 9), np.float32)}
    with pytest.raises(ValueError, match=r"'head\.weight' has shape"):
        policy.load_weights(wrong)
    assert all(np.array_equal(policy.arrays[k], v) for k, v in before.items())


def test_sac_numpy_policy_acts_like_the_torch_agent_on_the_same_weights() -> None:
    config = SACConfig(hidden_sizes=[16, 16], device="cpu")
    spec = SampleSpec((3,), "float32", (2,), "float32", action_low=(-2.0, 0.0), action_high=(2.0, 1.0))
    learner = SACAgent(config, spec, seed=0)
    torch_actor = SACAgent(config, spec, seed=7)
    numpy_policy = NumpySACPolicy(config, spec, seed=7)
    weights = learner.export_weights()
    assert [(k, v.shape) for k, v in numpy_policy.arrays.items()] == [
        (k, v.shape) for k, v in weights.items()
    ]
    torch_actor.load_weights(weights)
    numpy_policy.load_weights(weights)
    obs = np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32)
    close = {"rtol": 1e-5, "atol": 1e-5}
    np.testing.assert_allclose(numpy_policy.act(obs, False), torch_actor.act(obs, False), **close)
    for epsilon in (0.0, 0.5, 1.0):
        mine = EpsilonExplorer(numpy_policy, spec, seed=3, epsilon=epsilon)
        theirs = EpsilonExplorer(torch_actor, spec, seed=3, epsilon=epsilon)
        np.testing.assert_allclose(mine.act(obs), theirs.act(obs), **close)
    assert make_priorities(config, numpy_policy) is None


def test_make_policy_is_numpy_for_the_mlp_and_torch_for_the_cnn() -> None:
    assert isinstance(make_policy(DQNConfig(hidden_sizes=[8]), CARTPOLE, seed=0), NumpyDQNPolicy)
    assert isinstance(make_policy(SACConfig(hidden_sizes=[8]), PENDULUM, seed=0), NumpySACPolicy)
    frames = SampleSpec((4, 84, 84), "uint8", (), "int64", num_actions=6)
    assert isinstance(make_policy(DQNConfig(torso="nature_cnn"), frames, seed=0), DQNAgent)


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
        from zmqrl.actor.exploration import EpsilonExplorer
        policy = make_policy({config}, {spec!r}, seed=0)
        explorer = EpsilonExplorer(policy, {spec!r}, seed=0, epsilon=0.5)
        explorer.act(np.zeros((2, {spec.obs_shape[0]}), np.float32))
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("torch modules:", loaded)
        sys.exit(1 if loaded else 0)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("net", "obs_shape", "module"),
    [
        (dqn_net("mlp", [16, 8], 3, False), (5,), lambda: QNetwork((5,), [16, 8], 3)),
        (dqn_net("mlp", [], 2, True), (2, 3), lambda: QNetwork((2, 3), [], 2, dueling=True)),
        (
            dqn_net("minatar_cnn", [], 4, True),
            (4, 10, 10),
            lambda: QNetwork((4, 10, 10), [], 4, True, torso="minatar_cnn"),
        ),
        (
            dqn_net("nature_cnn", [], 6, False),
            (4, 84, 84),
            lambda: QNetwork((4, 84, 84), [], 6, torso="nature_cnn"),
        ),
        (sac_policy_net([16, 16], 2), (3,), lambda: SquashedGaussianPolicy(3, 2, [16, 16])),
    ],
)
def test_the_torch_networks_are_built_from_the_tables_the_numpy_policies_read(
    net: ActingNet, obs_shape: tuple[int, ...], module: Any
) -> None:
    """One table per acting network (zmqrl.agents.layers): the torch module's parameters are,
    name for name and shape for shape, in order, the layout the numpy policy loads and runs."""
    torch_layout = [(name, tuple(t.shape)) for name, t in module().state_dict().items()]
    assert torch_layout == list(net.layout(obs_shape).items())


def test_the_numpy_forward_of_a_table_is_the_torch_forward() -> None:
    module = QNetwork((5,), [16, 8], 3, dueling=True, generator=torch.Generator().manual_seed(0))
    arrays = {name: t.detach().numpy() for name, t in module.state_dict().items()}
    obs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    numpy_q = dqn_q_values(dqn_net("mlp", [16, 8], 3, True), arrays, obs)
    np.testing.assert_allclose(numpy_q, module(torch.from_numpy(obs)).detach().numpy(), rtol=1e-5, atol=1e-5)
