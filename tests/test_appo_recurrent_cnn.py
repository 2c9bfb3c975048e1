"""Recurrent APPO on images (``agent.core: lstm`` with a CNN torso): the actors' numpy acting equals
the torch policy step by step (state carried, reset at episode starts), the learner's unroll and
its CNN value network, checkpoints, and MinAtar Breakout without its trail channel, the task that
needs the memory (issue 40)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zmqrl.agents import make_policy
from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.appo_batch import as_rollouts, rollout_arrays
from zmqrl.agents.appo_policy import NumpyAPPOPolicy
from zmqrl.agents.appo_rnn import recurrent_outputs
from zmqrl.agents.configs import APPOConfig
from zmqrl.core import is_recurrent
from zmqrl.spec import SampleSpec
from zmqrl.types import RolloutBatch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
GRIDS = SampleSpec((3, 10, 10), "uint8", (), "int64", num_actions=3)  # MinAtar-sized 0/1 grids
FRAMES = SampleSpec((2, 36, 36), "uint8", (), "int64", num_actions=4)  # the Nature CNN's smallest
H = 8

requires_minatar = pytest.mark.skipif(
    importlib.util.find_spec("minatar") is None,
    reason='the MinAtar package is not installed (pip install -e ".[minatar]")',
)


def config(torso: str = "minatar_cnn", **overrides: object) -> APPOConfig:
    values: dict[str, object] = {"torso": torso, "device": "cpu", "core": "lstm", "core_size": H}
    values.update(overrides)
    return APPOConfig(**values)  # type: ignore[arg-type]


def frames(rng: np.random.Generator, spec: SampleSpec, *lead: int) -> np.ndarray:
    """Random observations of ``spec`` (0/1 grids, or bytes for the Nature CNN's frames)."""
    high = 2 if spec.obs_shape[1] == 10 else 256
    return rng.integers(0, high, size=(*lead, *spec.obs_shape)).astype(np.uint8)


def torch_steps(agent: APPOAgent, obs: np.ndarray, done: np.ndarray) -> list[np.ndarray]:
    """The reference: the torch policy's logits at each of ``obs``'s steps ``(T, B, ...)``, its
    LSTM stepped with ``nn.LSTMCell`` and zeroed after every step ``done`` ``(T, B)``."""
    policy = agent.policy
    h = torch.zeros(obs.shape[1], H)
    c = torch.zeros(obs.shape[1], H)
    out = []
    with torch.no_grad():
        for t in range(len(obs)):
            h, c = policy.cell(policy.features(torch.as_tensor(obs[t])), (h, c))
            out.append(policy.outputs(h)[0].numpy())
            keep = torch.as_tensor(~done[t], dtype=torch.float32)[:, None]
            h, c = h * keep, c * keep
    return out


@pytest.mark.parametrize(("torso", "spec"), [("minatar_cnn", GRIDS), ("nature_cnn", FRAMES)])
def test_numpy_recurrent_acting_equals_torch_with_the_state_carried_and_reset(
    torso: str, spec: SampleSpec
) -> None:
    cfg = config(torso)
    agent = APPOAgent(cfg, spec, device="cpu", seed=0)
    policy = NumpyAPPOPolicy(cfg, spec, seed=1)  # other initial weights: the load must replace them
    policy.load_weights(agent.export_weights())
    assert is_recurrent(policy) and policy.net.core == H
    rng = np.random.default_rng(0)
    obs = frames(rng, spec, 6, 3)  # 6 steps of 3 envs
    done = np.zeros((6, 3), bool)
    done[2, 0] = done[4, 2] = done[1, 1] = True  # each env's episode ends once, at its own step
    want = torch_steps(agent, obs, done)
    policy.reset_core()
    for t in range(6):
        logits, _ = policy.policy_outputs(obs[t])
        np.testing.assert_allclose(logits, want[t], rtol=1e-4, atol=1e-5)
        policy.reset_core(done[t])
        assert (policy.core_state()[done[t]] == 0).all() and policy.core_state().shape == (3, 2, H)
    # The agent acts the same way (numpy on views of its parameters for the MinAtar CNN, torch for
    # the Nature CNN), and so does the policy an actor is given for the torso.
    actor = make_policy(cfg, spec, seed=0)
    actor.load_weights(agent.export_weights())
    for acting in (agent, actor):
        assert is_recurrent(acting)
        acting.reset_core()  # type: ignore[attr-defined]
        for t in range(6):
            logits, _ = acting.policy_outputs(obs[t])  # type: ignore[attr-defined]
            np.testing.assert_allclose(logits, want[t], rtol=1e-4, atol=1e-5)
            acting.reset_core(done[t])  # type: ignore[attr-defined]
    # Same seed, same weights, same states: the same draws.
    for acting in (policy, agent):
        acting.reset_core()
        acting.rng = np.random.default_rng(5)
    actions = [policy.sample(obs[t]) for t in range(3)]
    for t in range(3):
        got = agent.sample(obs[t])
        np.testing.assert_array_equal(got[0], actions[t][0])
        np.testing.assert_allclose(got[1], actions[t][1], rtol=1e-4, atol=1e-5)


def rollouts(rng: np.random.Generator, spec: SampleSpec, rows: int, steps: int) -> RolloutBatch:
    """Random rollouts of ``spec``'s frames with a termination and a truncation mid-row."""
    terminated = np.zeros((rows, steps), bool)
    truncated = np.zeros((rows, steps), bool)
    terminated[0, 1] = True
    truncated[-1, 2] = True
    return RolloutBatch(
        frames(rng, spec, rows, steps + 1),
        rng.integers(0, spec.num_actions or 1, size=(rows, steps)),
        rng.normal(size=(rows, steps)).astype(np.float32),
        terminated,
        truncated,
        np.full((rows, steps), -1.1, np.float32),
        frames(rng, spec, int(truncated.sum())),
        rng.uniform(-0.5, 0.5, size=(rows, 2, H)).astype(np.float32),
    )


def test_the_unroll_and_the_cnn_value_equal_stepping_the_cell_row_by_row() -> None:
    agent = APPOAgent(config(), GRIDS, device="cpu", seed=0)
    assert "torso.convs.0.weight" in agent.value.state_dict()  # the value's own CNN
    batch = rollouts(np.random.default_rng(2), GRIDS, rows=3, steps=5)
    data = as_rollouts(agent._on_device(rollout_arrays(batch, H)))
    done = data.terminated | data.truncated
    policy, value = agent.policy, agent.value
    with torch.no_grad():
        out = recurrent_outputs(policy, value, data)  # type: ignore[arg-type]
        for r in range(3):
            h, c = data.core_state[r : r + 1, 0], data.core_state[r : r + 1, 1]
            for t in range(6):
                h, c = policy.cell(policy.features(data.obs[r, t : t + 1]), (h, c))
                torch.testing.assert_close(out.row_values[r, t], value(data.obs[r, t : t + 1], h)[0])
                if t < 5 and bool(done[r, t]):
                    if bool(data.truncated[r, t]):  # the cut episode's bootstrap, before the reset
                        k = int(data.final_index[r, t])
                        hf, _ = policy.cell(policy.features(data.final_obs[k : k + 1]), (h, c))
                        want = value(data.final_obs[k : k + 1], hf)[0]
                        torch.testing.assert_close(out.final_values[k], want)
                    h, c = torch.zeros_like(h), torch.zeros_like(c)


def test_updates_train_the_cnn_core_and_value_and_checkpoints_restore_them() -> None:
    cfg = config(epochs=2, minibatches=2)
    agent = APPOAgent(cfg, GRIDS, device="cpu", seed=0)
    twin = APPOAgent(cfg, GRIDS, device="cpu", seed=0)  # same seed: same initial networks
    for name, tensor in agent.value.state_dict().items():
        torch.testing.assert_close(tensor, twin.value.state_dict()[name])
    before = agent.export_weights()
    value_before = agent.value.state_dict()["torso.convs.0.weight"].clone()
    result = agent.update(rollouts(np.random.default_rng(3), GRIDS, rows=4, steps=5))
    assert not result.skipped and all(np.isfinite(v) for v in result.metrics.values())
    after = agent.export_weights()
    for name in ("core.weight_hh", "torso.convs.0.weight", "logits.weight"):
        assert not np.array_equal(before[name], after[name]), name
    assert not torch.equal(value_before, agent.value.state_dict()["torso.convs.0.weight"])
    twin.load_state_dict(agent.state_dict())
    batch = rollouts(np.random.default_rng(4), GRIDS, rows=4, steps=5)
    torch.testing.assert_close(twin.targets(batch).vs, agent.targets(batch).vs)
    policy = NumpyAPPOPolicy(cfg, GRIDS, seed=0)
    policy.load_weights(after)
    actions, logp = policy.sample(frames(np.random.default_rng(5), GRIDS, 2))
    assert actions.shape == (2,) and np.isfinite(logp).all()


def test_the_config_takes_an_lstm_core_on_every_torso() -> None:
    for torso in ("mlp", "minatar_cnn", "nature_cnn"):
        config(torso).check()


# ---------------------------------------------------------------------------------------------
# MinAtar Breakout without its trail, and a recurrent CNN run through serial mode
# ---------------------------------------------------------------------------------------------


@requires_minatar
def test_breakout_without_its_trail_is_breakout_less_one_channel() -> None:
    from zmqrl.config import EnvConfig
    from zmqrl.envs.factory import make_env
    from zmqrl.envs.minatar import BREAKOUT_NO_TRAIL

    env = make_env(EnvConfig(id=BREAKOUT_NO_TRAIL, max_episode_steps=50))
    full = make_env(EnvConfig(id="MinAtar/Breakout-v1"))  # (paddle, ball, trail, brick)
    assert env.observation_space.shape == (3, 10, 10) and env.observation_space.dtype == np.uint8
    assert env.spec is not None and env.spec.max_episode_steps == 50
    obs, _ = env.reset(seed=3)
    want, _ = full.reset(seed=3)
    for t in range(30):
        np.testing.assert_array_equal(obs, want[[0, 1, 3]])
        assert env.observation_space.contains(obs)
        obs, reward, terminated, _, _ = env.step(t % 3)
        want, reward_full, _, _, _ = full.step(t % 3)
        assert reward == reward_full
        if terminated:
            break
    env.close()
    full.close()


@requires_minatar
def test_a_serial_recurrent_minatar_run_checkpoints_evaluates_and_plays(run_root: Path) -> None:
    import zmqrl
    from zmqrl.config import EnvConfig
    from zmqrl.envs.factory import make_env

    cfg = zmqrl.load_config(
        REPO / "configs" / "minatar_breakout_lstm_appo.yaml",
        [
            f"run.dir={run_root}",
            "run.name=t",
            "agent.batch_size=64",
            "agent.epochs=1",
            "agent.minibatches=2",
            "actor.num_actors=1",
            "actor.envs_per_actor=4",
            "actor.rollout_length=16",
            "actor.max_steps_per_s=null",
            "env.max_episode_steps=40",
            "learner.max_updates=2",
            "learner.max_seconds=null",
            "learner.eval_interval=2",
            "learner.eval_episodes=2",
            "learner.checkpoint_interval=2",
        ],
    )
    result = zmqrl.train(cfg, mode="serial")
    assert result.state == "finished" and result.learner["updates"] == 2
    policy = zmqrl.load_policy(result.run_dir)
    assert policy.recurrent
    env = make_env(EnvConfig(id=cfg.env.id, max_episode_steps=40), training=False)

    def play(policy: Any) -> list[int]:
        """Four greedy steps of an episode from seed 0, the policy's state started over."""
        obs, _ = env.reset(seed=0)
        policy.reset()
        actions = [int(policy.act(obs))]
        for _ in range(3):
            obs, *_ = env.step(actions[-1])
            actions.append(int(policy.act(obs)))
        return actions

    first = play(policy)
    assert play(policy) == first  # a new episode from a zero state: the same greedy actions again
    if importlib.util.find_spec("onnxruntime") is not None:  # the onnx extra: the export plays them too
        from zmqrl.checkpoints.onnx_export import export_onnx
        from zmqrl.checkpoints.onnx_policy import OnnxPolicy

        assert play(OnnxPolicy(export_onnx(result.run_dir, run_root / "policy.onnx").path)) == first
    env.close()
