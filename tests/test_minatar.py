"""MinAtar games through env.id (channel-first uint8 grids), the MinAtar CNN torso, and its numpy
forward pass that the actors run: equal to torch's, on the same weights."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.conftest import launch_to_the_end, processes_mentioning, tiny_overrides
from zmqrl.agents import make_learner, make_policy
from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.conv import MinAtarCNN
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.nets import QNetwork
from zmqrl.agents.numpy_policies import NumpyDQNPolicy
from zmqrl.agents.torsos import MINATAR_CNN, conv2d_relu, small_matmul
from zmqrl.config import EnvConfig
from zmqrl.envs.factory import make_env, make_vector_env, sample_spec
from zmqrl.errors import ConfigError
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "minatar_breakout_dqn.yaml"
BREAKOUT = "MinAtar/Breakout-v1"
GRID = (4, 10, 10)  # Breakout: paddle, ball, trail, bricks
GRIDS = SampleSpec(GRID, "uint8", (), "int64", num_actions=3)

requires_minatar = pytest.mark.skipif(
    importlib.util.find_spec("minatar") is None,
    reason='the MinAtar package is not installed (pip install -e ".[minatar]")',
)


def breakout(**kwargs: object) -> gym.Env:
    return make_env(EnvConfig(id=BREAKOUT, **kwargs))  # type: ignore[arg-type]


def random_grids(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.random((n, *GRID)) < 0.3).astype(np.uint8)


# ------------------------------------------------------------------------------------- the env


@requires_minatar
def test_breakout_observes_channel_first_uint8_grids_with_the_minimal_actions() -> None:
    env = breakout()
    spec = sample_spec(env)
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == (GRID, "uint8", 3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == GRID and obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 1}
    assert obs[0].sum() == 1 and obs[1].sum() == 1  # one paddle, one ball
    assert obs[3, 1:4].all() and obs[3].sum() == 30  # three full rows of bricks
    env.close()


@requires_minatar
@pytest.mark.filterwarnings("ignore:.*is out of date")  # gymnasium on the -v0 id
@pytest.mark.parametrize(
    ("env_id", "shape", "actions"),
    [
        ("MinAtar/Breakout-v0", GRID, 6),
        ("MinAtar/SpaceInvaders-v1", (6, 10, 10), 4),
        ("MinAtar/Asterix-v1", (4, 10, 10), 5),
    ],
)
def test_other_ids_and_games_keep_their_channels_and_action_sets(
    env_id: str, shape: tuple[int, ...], actions: int
) -> None:
    spec = sample_spec(make_env(EnvConfig(id=env_id)))
    assert (spec.obs_shape, spec.num_actions) == (shape, actions)


@requires_minatar
def test_grids_are_the_packages_observations_moved_channel_first() -> None:
    ours = breakout()
    theirs = gym.make(BREAKOUT)  # registered by the first make_env
    obs, _ = ours.reset(seed=3)
    raw, _ = theirs.reset(seed=3)
    np.testing.assert_array_equal(obs, np.moveaxis(raw, -1, 0))
    for action in [0, 2, 2, 1, 0, 2]:
        obs, reward, *_ = ours.step(action)
        raw, raw_reward, *_ = theirs.step(action)
        np.testing.assert_array_equal(obs, np.moveaxis(raw, -1, 0))
        assert reward == raw_reward


def play(env: gym.Env, seed: int, steps: int) -> tuple[np.ndarray, list[float]]:
    """Observations and rewards of ``steps`` seeded random actions, resetting after each episode."""
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=seed)
    seen, rewards = [obs], []
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(3)))
        seen.append(obs)
        rewards.append(float(reward))
        if terminated or truncated:
            obs, _ = env.reset()
            seen.append(obs)
    return np.stack(seen), rewards


@requires_minatar
def test_a_seed_reproduces_the_game_and_its_sticky_actions() -> None:
    first, second, other = (play(breakout(), seed, 400) for seed in (7, 7, 8))
    np.testing.assert_array_equal(first[0], second[0])
    assert first[1] == second[1]
    assert first[0].shape != other[0].shape or not np.array_equal(first[0], other[0])


@requires_minatar
def test_max_episode_steps_truncates_and_kwargs_reach_the_game() -> None:
    env = breakout(max_episode_steps=3, kwargs={"sticky_action_prob": 0.0})
    env.reset(seed=0)
    results = [env.step(0)[2:4] for _ in range(3)]
    assert results[-1] == (False, True) and all(r == (False, False) for r in results[:-1])
    assert env.unwrapped.game.sticky_action_prob == 0.0  # type: ignore[attr-defined]


@requires_minatar
def test_a_vector_env_batches_the_grids() -> None:
    vec = make_vector_env(EnvConfig(id=BREAKOUT), 3)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, *GRID) and obs.dtype == np.uint8
    assert sample_spec(vec).obs_shape == GRID
    vec.close()


@requires_minatar
def test_making_a_minatar_env_prints_nothing_and_leaves_logging_unconfigured() -> None:
    """The package logs seaborn warnings on the root logger at import, which would also install a
    stderr handler in the process (logging.basicConfig); the import is made quiet."""
    script = textwrap.dedent(
        f"""
        import logging
        from zmqrl.config import EnvConfig
        from zmqrl.envs.factory import make_env
        make_env(EnvConfig(id="{BREAKOUT}")).reset(seed=0)
        print(len(logging.getLogger().handlers), len(logging.getLogger().filters))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"] and result.stderr == ""


@requires_minatar
def test_an_unknown_minatar_game_offers_the_registered_ones() -> None:
    match = r"no such registered gymnasium id \(did you mean 'MinAtar/Breakout-v1'"
    with pytest.raises(ConfigError, match=match):
        make_env(EnvConfig(id="MinAtar/Breakot-v1"))


# ---------------------------------------------------------------------------------- the torso


def test_minatar_cnn_is_one_3x3_conv_of_16_channels_then_128_units() -> None:
    net = MinAtarCNN(GRID)
    assert [tuple(p.shape) for p in net.parameters()] == [(16, 4, 3, 3), (16,), (128, 1024), (128,)]
    grids = torch.from_numpy(random_grids(np.random.default_rng(0), 5))
    out = net(grids)
    assert out.shape == (5, 128) and (out >= 0).all()
    torch.testing.assert_close(out, net(grids.to(torch.float32)))  # 0/1 grids are not rescaled


def test_dqn_config_picks_the_minatar_torso_and_checks_the_observations() -> None:
    learner = make_learner(DQNConfig(torso="minatar_cnn", device="cpu"), GRIDS, seed=0)
    assert isinstance(learner, DQNAgent) and isinstance(learner.online.torso, MinAtarCNN)
    flat = SampleSpec((4,), "float32", (), "int64", num_actions=2)
    with pytest.raises(ConfigError, match=r"agent.torso 'minatar_cnn' needs image observations"):
        make_learner(DQNConfig(torso="minatar_cnn"), flat)
    tiny = SampleSpec((4, 2, 2), "uint8", (), "int64", num_actions=2)
    with pytest.raises(ConfigError, match=r"needs larger frames than 2x2"):
        make_learner(DQNConfig(torso="minatar_cnn"), tiny)


# ------------------------------------------------------------------ numpy acting = torch acting


def trained_agent(dueling: bool) -> DQNAgent:
    """A torch DQN after a few updates on random grids (no parameter left at its initial value)."""
    config = DQNConfig(torso="minatar_cnn", dueling=dueling, device="cpu", batch_size=16)
    agent = DQNAgent(config, GRIDS, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        agent.update(
            TransitionBatch(
                obs=random_grids(rng, 16),
                action=rng.integers(3, size=16).astype(np.int64),
                reward=rng.normal(size=16).astype(np.float32),
                next_obs=random_grids(rng, 16),
                discount=np.full(16, 0.97, np.float32),
            )
        )
    return agent


@pytest.mark.parametrize("dueling", [False, True])
def test_the_numpy_policy_computes_the_torch_q_values_on_the_same_weights(dueling: bool) -> None:
    learner = trained_agent(dueling)
    policy = NumpyDQNPolicy(learner.config, GRIDS, seed=1)
    exported = learner.export_weights()
    assert [(k, v.shape) for k, v in policy.arrays.items()] == [(k, v.shape) for k, v in exported.items()]
    policy.load_weights(exported)
    grids = random_grids(np.random.default_rng(2), 200)
    expected = learner.q_values(grids)  # torch's modules
    np.testing.assert_allclose(policy.q_values(grids), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(policy.act(grids, explore=False), expected.argmax(axis=1))
    # The CPU learner's own acting runs the same numpy code on views of its tensors.
    np.testing.assert_array_equal(learner.act(grids, explore=False), expected.argmax(axis=1))


def test_numpy_initial_priorities_match_the_torch_agents() -> None:
    learner = trained_agent(dueling=False)
    actor = DQNAgent(learner.config, GRIDS, seed=4)
    policy = NumpyDQNPolicy(learner.config, GRIDS, seed=4)
    weights = learner.export_weights()
    actor.load_weights(weights)
    policy.load_weights(weights)
    rng = np.random.default_rng(5)
    batch = TransitionBatch(
        obs=random_grids(rng, 32),
        action=rng.integers(3, size=32).astype(np.int64),
        reward=rng.normal(size=32).astype(np.float32),
        next_obs=random_grids(rng, 32),
        discount=np.full(32, 0.9, np.float32),
    )
    with torch.inference_mode():  # the torch reference, through the modules
        q = actor.online(torch.from_numpy(np.concatenate([batch.obs, batch.next_obs]))).numpy()
    reference = np.abs(batch.reward + batch.discount * q[32:].max(axis=1) - q[np.arange(32), batch.action])
    np.testing.assert_allclose(policy.initial_priorities(batch), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actor.initial_priorities(batch), reference, rtol=1e-5, atol=1e-5)


def test_numpy_initial_weights_follow_the_torch_default_bounds() -> None:
    arrays = NumpyDQNPolicy(DQNConfig(torso="minatar_cnn"), GRIDS, seed=0).arrays
    conv_bound, fc_bound = 1 / np.sqrt(4 * 3 * 3), 1 / np.sqrt(1024)
    for name, bound in [("torso.convs.0", conv_bound), ("torso.fc.0", fc_bound)]:
        for part in ("weight", "bias"):
            values = np.abs(arrays[f"{name}.{part}"])
            assert values.max() <= bound and values.max() > 0.8 * bound, name


@pytest.mark.parametrize(
    ("channels", "size", "kernel", "stride"), [(4, 10, 3, 1), (3, 21, 8, 4), (2, 9, 4, 2)]
)
def test_numpy_convolution_equals_torch_conv2d(channels: int, size: int, kernel: int, stride: int) -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, channels, size, size)).astype(np.float32)
    weight = rng.normal(size=(5, channels, kernel, kernel)).astype(np.float32)
    bias = rng.normal(size=5).astype(np.float32)
    tensors = (torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias))
    expected = torch.relu(torch.nn.functional.conv2d(*tensors, stride=stride)).numpy()
    np.testing.assert_allclose(conv2d_relu(x, weight, bias, stride), expected, rtol=1e-4, atol=1e-4)


def test_small_matmul_in_row_blocks_is_the_plain_product() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(37, 1024)).astype(np.float32), rng.normal(size=(1024, 128)).astype(np.float32)
    np.testing.assert_allclose(small_matmul(a, b), a @ b, rtol=1e-4, atol=1e-3)
    assert MINATAR_CNN.flat_features(GRID) == 1024


def test_minatar_actors_act_in_numpy_without_importing_torch() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from zmqrl.agents import make_policy
        from zmqrl.agents.configs import DQNConfig
        from zmqrl.spec import SampleSpec
        from zmqrl.actor.exploration import EpsilonExplorer
        policy = make_policy(DQNConfig(torso="minatar_cnn"), {GRIDS!r}, seed=0)
        EpsilonExplorer(policy, {GRIDS!r}, seed=0, epsilon=0.5).act(np.zeros((2, 4, 10, 10), np.uint8))
        print(type(policy).__name__, sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["NumpyDQNPolicy", "[]"]
    assert isinstance(make_policy(DQNConfig(torso="minatar_cnn"), GRIDS, seed=0), NumpyDQNPolicy)


def test_qnetwork_with_the_minatar_torso_is_seeded_by_its_generator() -> None:
    nets = [
        QNetwork(GRID, [], 3, torso="minatar_cnn", generator=torch.Generator().manual_seed(seed))
        for seed in (1, 1, 2)
    ]
    first, same, other = (dict(net.state_dict()) for net in nets)
    assert all(torch.equal(first[k], same[k]) and not torch.equal(first[k], other[k]) for k in first)


# ------------------------------------------------------------------------------ a real launch


@requires_minatar
@pytest.mark.slow
@pytest.mark.heavy  # a real launch: kept out of the ~10-minute default suite
def test_the_breakout_config_launches_trains_evaluates_and_ends_cleanly(run_root: Path) -> None:
    overrides = tiny_overrides(
        run_root,
        learner__max_updates=300,
        learner__min_replay_size=500,
        learner__eval_interval=150,
        learner__max_seconds=120,
        replay__capacity=5000,
        actor__num_actors=2,
        actor__max_steps_per_s=1000,
    )
    overrides = [item for item in overrides if not item.startswith("agent.hidden_sizes=")]
    result = launch_to_the_end(CONFIG, overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = json.loads((run_root / "t" / "stats.json").read_text())
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["updates"] == 300 and learner["bad_messages"] == 0
    assert learner["samples"] >= 500 and len(learner["eval_history"]) >= 2
    assert {row["actor_id"] for row in stats["actors"]} == {0, 1}
    config = (run_root / "t" / "config.yaml").read_text()
    assert "torso: minatar_cnn" in config and "id: MinAtar/Breakout-v1" in config
    assert processes_mentioning(str(run_root)) == []
