"""Recurrent APPO (``agent.core: lstm``): the numpy LSTM acts as the torch one does, the learner's
unroll equals stepping the cell with the episode resets, and the agent trains and publishes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.appo_batch import as_rollouts, rollout_arrays
from zmqrl.agents.appo_policy import NumpyAPPOPolicy
from zmqrl.agents.appo_rnn import recurrent_outputs, unroll
from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.layers import lstm_step
from zmqrl.core import is_recurrent
from zmqrl.spec import MAX_CORE_SIZE, SampleSpec
from zmqrl.types import RolloutBatch

torch.set_num_threads(1)

SPEC = SampleSpec((2,), "float32", (), "int64", num_actions=2)
BOX = SampleSpec((3,), "float32", (2,), "float32", action_low=-1.0, action_high=1.0)
H = 8


def config(**overrides: object) -> APPOConfig:
    values: dict[str, object] = {"hidden_sizes": [16], "device": "cpu", "core": "lstm", "core_size": H}
    values.update(overrides)
    return APPOConfig(**values)  # type: ignore[arg-type]


def rollouts(rng: np.random.Generator, rows: int, steps: int, spec: SampleSpec = SPEC) -> RolloutBatch:
    """Random rollouts with a termination and a truncation mid-row and random start states."""
    terminated = np.zeros((rows, steps), bool)
    truncated = np.zeros((rows, steps), bool)
    terminated[0, 1] = True
    truncated[-1, 2] = True
    shape = (rows, steps, *spec.action_shape)
    if spec.num_actions is None:
        action = rng.uniform(-1, 1, size=shape).astype(np.float32)
    else:
        action = rng.integers(0, spec.num_actions, size=shape)
    state = rng.uniform(-0.5, 0.5, size=(rows, 2, H)).astype(np.float32)
    return RolloutBatch(
        rng.normal(size=(rows, steps + 1, *spec.obs_shape)).astype(np.float32),
        action,
        rng.normal(size=(rows, steps)).astype(np.float32),
        terminated,
        truncated,
        np.full((rows, steps), -0.7, np.float32),
        rng.normal(size=(int(truncated.sum()), *spec.obs_shape)).astype(np.float32),
        state,
    )


def test_the_numpy_lstm_policy_matches_the_torch_one_over_a_sequence_with_resets() -> None:
    agent = APPOAgent(config(), SPEC, device="cpu", seed=0)
    policy = NumpyAPPOPolicy(config(), SPEC, seed=1)
    policy.load_weights(agent.export_weights())
    assert is_recurrent(policy) and set(agent.export_weights()) >= {"core.weight_ih", "core.bias_hh"}
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(6, 3, 2)).astype(np.float32)  # 6 steps of 3 envs
    h = torch.zeros(3, H)
    c = torch.zeros(3, H)
    policy.reset_core()
    for t in range(6):
        logits, _ = policy.policy_outputs(obs[t])
        with torch.no_grad():
            h, c = agent.policy.core(agent.policy.features(torch.as_tensor(obs[t])), (h, c))
            want, _ = agent.policy.outputs(h)
        np.testing.assert_allclose(logits, want.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(policy.core_state()[:, 0], h.numpy(), rtol=1e-5, atol=1e-6)
        done = np.array([t == 2, False, t == 4])
        policy.reset_core(done)
        keep = torch.as_tensor(~done, dtype=torch.float32)[:, None]
        h, c = h * keep, c * keep
        assert (policy.core_state()[done] == 0).all()


def test_the_numpy_cell_is_torchs_lstm_cell() -> None:
    cell = torch.nn.LSTMCell(5, H)
    arrays = {f"core.{name}": p.detach().numpy() for name, p in cell.named_parameters()}
    rng = np.random.default_rng(1)
    x, h, c = (rng.normal(size=(4, n)).astype(np.float32) for n in (5, H, H))
    got = lstm_step(arrays, x, h, c)
    with torch.no_grad():
        want = cell(torch.as_tensor(x), (torch.as_tensor(h), torch.as_tensor(c)))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


def test_the_unroll_with_a_reset_mid_row_equals_stepping_the_cell() -> None:
    agent = APPOAgent(config(), SPEC, device="cpu", seed=0)
    rng = np.random.default_rng(2)
    batch = rollouts(rng, rows=3, steps=5)
    data = as_rollouts(agent._on_device(rollout_arrays(batch, H)))
    done = data.terminated | data.truncated
    with torch.no_grad():
        run = unroll(agent.policy, data.obs, data.core_state, done)
        out = recurrent_outputs(agent.policy, agent.value, data)  # type: ignore[arg-type]
        policy = agent.policy
        for r in range(3):
            h, c = data.core_state[r : r + 1, 0], data.core_state[r : r + 1, 1]
            for t in range(6):
                h, c = policy.core(policy.features(data.obs[r, t : t + 1]), (h, c))
                torch.testing.assert_close(run.h[r, t], h[0])
                value = agent.value(data.obs[r, t : t + 1], h)[0]
                torch.testing.assert_close(out.row_values[r, t], value)
                if t < 5 and bool(done[r, t]):
                    if bool(data.truncated[r, t]):  # the cut episode's bootstrap, before the reset
                        k = int(data.final_index[r, t])
                        hf, _ = policy.core(policy.features(data.final_obs[k : k + 1]), (h, c))
                        value = agent.value(data.final_obs[k : k + 1], hf)[0]
                        torch.testing.assert_close(out.final_values[k], value)
                    h, c = torch.zeros_like(h), torch.zeros_like(c)


@pytest.mark.parametrize("overrides", [{}, {"epochs": 2, "minibatches": 2}, {"clip": None}])
def test_updates_train_the_core_and_export_what_the_numpy_policy_loads(overrides: dict[str, object]) -> None:
    cfg = config(**overrides)
    agent = APPOAgent(cfg, SPEC, device="cpu", seed=0)
    before = agent.export_weights()
    result = agent.update(rollouts(np.random.default_rng(3), rows=4, steps=5))
    assert not result.skipped and all(np.isfinite(v) for v in result.metrics.values())
    after = agent.export_weights()
    assert not np.array_equal(before["core.weight_hh"], after["core.weight_hh"])
    policy = NumpyAPPOPolicy(cfg, SPEC, seed=0)
    policy.load_weights(after)
    actions, logp = policy.sample(np.zeros((2, 2), np.float32))
    assert actions.shape == (2,) and np.isfinite(logp).all()


def test_continuous_actions_and_the_agents_own_acting_are_recurrent_too() -> None:
    agent = APPOAgent(config(), BOX, device="cpu", seed=0)
    assert not agent.update(rollouts(np.random.default_rng(4), rows=2, steps=4, spec=BOX)).skipped
    obs = np.ones((2, 3), np.float32)
    first = agent.act(obs, explore=False)
    assert agent.core_state().shape == (2, 2, H)
    agent.reset_core()
    np.testing.assert_array_equal(agent.act(obs, explore=False), first)  # same state, same action


def test_a_recurrent_agent_wants_the_state_and_a_feed_forward_one_refuses_it() -> None:
    batch = rollouts(np.random.default_rng(5), rows=2, steps=3)
    with pytest.raises(ValueError, match="core_state"):
        APPOAgent(config(), SPEC, device="cpu").update(batch._replace(core_state=None))
    with pytest.raises(ValueError, match="core_state"):
        APPOAgent(config(core="none"), SPEC, device="cpu").update(batch)


def test_the_config_checks_the_core() -> None:
    with pytest.raises(ValueError, match=r"agent\.core"):
        config(core="gru").check()
    with pytest.raises(ValueError, match=r"agent\.core_size"):
        config(core_size=0).check()
    config(core_size=MAX_CORE_SIZE).check()
    with pytest.raises(ValueError, match=r"agent\.core_size: must be an int from 1 to 8192, got 8193"):
        config(core_size=MAX_CORE_SIZE + 1).check()  # wider than a spec, an export or a reader takes


# ---------------------------------------------------------------------------------------------
# The masked CartPole, and a recurrent run through serial mode
# ---------------------------------------------------------------------------------------------


def test_the_masked_cartpole_observes_position_and_angle_only() -> None:
    import gymnasium as gym

    from zmqrl.config import EnvConfig
    from zmqrl.envs.factory import make_env
    from zmqrl.envs.masked import CARTPOLE_NO_VELOCITY

    env = make_env(EnvConfig(id=CARTPOLE_NO_VELOCITY))
    full = gym.make("CartPole-v1")
    space = env.observation_space
    assert isinstance(space, gym.spaces.Box) and space.shape == (2,) and space.dtype == np.float32
    np.testing.assert_array_equal(space.high, full.observation_space.high[[0, 2]])  # type: ignore[index]
    assert env.spec is not None and env.spec.max_episode_steps == 500
    obs, _ = env.reset(seed=7)
    want, _ = full.reset(seed=7)
    np.testing.assert_array_equal(obs, want[[0, 2]])
    for _ in range(5):
        obs, reward, _, _, _ = env.step(1)
        want, _, _, _, _ = full.step(1)
        np.testing.assert_array_equal(obs, want[[0, 2]])
        assert space.contains(obs) and reward == 1.0
    env.close()
    full.close()


def test_a_serial_recurrent_run_publishes_weights_a_policy_loads_and_plays(run_root: Path) -> None:
    import zmqrl
    from zmqrl.envs.masked import CARTPOLE_NO_VELOCITY

    config = Path(__file__).resolve().parents[1] / "configs" / "cartpole_novel_lstm_appo.yaml"
    cfg = zmqrl.load_config(
        config,
        [
            f"run.dir={run_root}",
            "learner.max_updates=3",
            "learner.eval_interval=3",
            "learner.eval_episodes=2",
            "learner.checkpoint_interval=3",
            "agent.epochs=2",
            "actor.max_steps_per_s=null",
        ],
    )
    result = zmqrl.train(cfg, mode="serial")
    assert result.state == "finished" and result.learner["updates"] == 3
    assert result.actors[0]["weights_version"] >= 2  # the actor acted with published weights
    policy = zmqrl.load_policy(result.run_dir)
    assert policy.recurrent
    import gymnasium as gym

    from zmqrl.envs.masked import register_own_ids

    register_own_ids()
    env = gym.make(CARTPOLE_NO_VELOCITY)
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        policy.reset()
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(int(policy.act(obs)))
            done = terminated or truncated
    env.close()
