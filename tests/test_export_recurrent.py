"""`zmqrl export` of recurrent policies (APPO with `agent.core: lstm`, R2D2): the graph is one step of
the LSTM, its state `core_h`, `core_c` inputs after the observation's and `core_h_next`,
`core_c_next` outputs after the action; `OnnxPolicy` carries that state from call to call as
`load_policy` does, so over whole episodes it picks the actions `load_policy` picks; the metadata
says the width (format 2, which readers before it refuse) and malformed widths are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import zmqrl
from tests.test_export import ACTION_ATOL, FRAMES, observations, trained_checkpoint
from tests.test_export_dict import grid_goal_space, raw_dicts
from zmqrl.checkpoints.onnx_export import export_onnx
from zmqrl.checkpoints.onnx_policy import OnnxModelError, OnnxPolicy
from zmqrl.evaluator.greedy import evaluate_checkpoint
from zmqrl.evaluator.onnx_eval import evaluate_onnx

ort = pytest.importorskip("onnxruntime")

LSTM = "agent.core=lstm"
AGENTS = {
    "appo-discrete": ["agent.kind=appo", LSTM],
    "appo-continuous": ["agent.kind=appo", LSTM, "env.id=Pendulum-v1"],
    "appo-minatar_cnn": ["agent.kind=appo", LSTM, "agent.torso=minatar_cnn", f"env.id={FRAMES}"],
    "appo-masked": ["agent.kind=appo", LSTM, "env.id=zmqrl/PickLargest-v0"],
    "r2d2": ["agent.kind=r2d2"],
    "r2d2-nature_cnn": ["agent.kind=r2d2", "agent.torso=nature_cnn", f"env.id={FRAMES}"],
}
# Steps of the compared episodes, and the envs (rows) played side by side.
STEPS, ENVS = 40, 6


def exported(tmp_path: Path, overrides: list[str]) -> tuple[zmqrl.DeployedPolicy, OnnxPolicy]:
    cfg = trained_checkpoint(tmp_path / "ckpt", overrides)
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    return zmqrl.load_policy(tmp_path / "ckpt", config=cfg), OnnxPolicy(tmp_path / "p.onnx")


def assert_same(actions: np.ndarray, expected: np.ndarray) -> None:
    assert actions.dtype == expected.dtype and actions.shape == expected.shape
    if expected.dtype == np.int64:
        assert np.array_equal(actions, expected)
    else:
        np.testing.assert_allclose(actions, expected, rtol=0, atol=ACTION_ATOL)


@pytest.mark.parametrize("case", list(AGENTS))
def test_over_episodes_the_exported_model_picks_the_actions_load_policy_picks(
    tmp_path: Path, case: str
) -> None:
    deployed, policy = exported(tmp_path, AGENTS[case])
    obs = observations(deployed.config, STEPS * ENVS).reshape(STEPS, ENVS, *deployed.observation_space.shape)
    assert deployed.recurrent and policy.recurrent and policy.metadata.core == 64

    picked = []
    for t in range(STEPS):
        if t == STEPS // 2:  # new episodes: both start over from a zero state
            deployed.reset()
            policy.reset()
        expected = deployed.act(obs[t])
        assert_same(policy.act(obs[t]), expected)
        picked.append(expected)
    assert policy.core_state().shape == (ENVS, 2, 64) and np.abs(policy.core_state()).max() > 0.01

    from_zero = []  # every step as an episode's first
    for t in range(1, STEPS):
        policy.reset()
        from_zero.append(policy.act(obs[t]))
    assert not np.array_equal(np.stack(from_zero), np.stack(picked[1:])), "a state that changes nothing"
    if picked[0].dtype == np.int64:
        assert len(np.unique(np.stack(picked))) > 1, "a policy that always picks one action checks little"


def test_the_graph_takes_and_gives_the_state_after_the_observation_and_the_action(tmp_path: Path) -> None:
    _, policy = exported(tmp_path, AGENTS["r2d2"])
    session = ort.InferenceSession(str(policy.path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("obs", "tensor(float)", ["batch", 4]),
        ("core_h", "tensor(float)", ["batch", 64]),
        ("core_c", "tensor(float)", ["batch", 64]),
    ]
    assert [o.name for o in session.get_outputs()] == ["action", "core_h_next", "core_c_next"]
    for batch in (1, 7):
        zeros = np.zeros((batch, 64), np.float32)
        action, h, c = session.run(
            None, {"obs": np.zeros((batch, 4), np.float32), "core_h": zeros, "core_c": zeros}
        )
        assert action.shape == (batch,) and h.shape == c.shape == (batch, 64)
        assert np.abs(h).max() > 0 and np.all(np.abs(h) < 1)  # h = o * tanh(c)
    props = {p.key: p.value for p in onnx.load(str(policy.path)).metadata_props}
    assert props["zmqrl.format"] == "2" and props["zmqrl.core"] == "64" and props["zmqrl.agent"] == "r2d2"


def test_one_observation_steps_one_row(tmp_path: Path) -> None:
    deployed, policy = exported(tmp_path, AGENTS["appo-continuous"])
    obs = observations(deployed.config, 5)
    for row in obs:
        assert_same(policy.act(row), deployed.act(row))
    assert policy.core_state().shape == (1, 2, 64)


def test_a_recurrent_dict_policy_takes_its_keys_then_the_state(tmp_path: Path) -> None:
    overrides = ["agent.kind=appo", LSTM, "agent.torso=minatar_cnn", "env.id=zmqrl/GridGoal-v0"]
    deployed, policy = exported(tmp_path, overrides)
    names = [i.name for i in ort.InferenceSession(str(policy.path)).get_inputs()]
    assert names == ["goal", "grid", "core_h", "core_c"]
    space = grid_goal_space()
    for step in range(10):
        obs = raw_dicts(space, ENVS, seed=step)
        assert np.array_equal(policy.act(obs), deployed.act(obs))


def test_eval_onnx_plays_the_episodes_eval_plays_for_the_checkpoint(tmp_path: Path) -> None:
    """Each env's row keeps its own state over its episode (zmqrl.evaluator.greedy.evaluate)."""
    exported(tmp_path, AGENTS["appo-discrete"])
    onnx_returns = evaluate_onnx(tmp_path / "p.onnx", 3, seed=5).returns
    assert onnx_returns == evaluate_checkpoint(tmp_path / "ckpt", 3, seed=5).returns


@pytest.mark.parametrize(
    "props, says",
    [
        ({"zmqrl.core": "0"}, "malformed zmqrl metadata zmqrl.core \\('0' is not a width from 1"),
        ({"zmqrl.core": "64x"}, "malformed zmqrl metadata zmqrl.core"),
        ({"zmqrl.core": None}, "malformed zmqrl metadata zmqrl.core \\(missing"),
        ({"zmqrl.format": "1"}, "zmqrl.core \\(set in a format 1 export"),
        (
            {"zmqrl.core": "32"},
            "input 'core_h': the graph takes float32 \\[64\\].*metadata says float32 \\[32\\]",
        ),
        ({"zmqrl.format": "3"}, "export format '3', this zmqrl reads 1 and 2"),
    ],
)
def test_a_malformed_state_declaration_is_refused(
    tmp_path: Path, props: dict[str, str | None], says: str
) -> None:
    _, policy = exported(tmp_path, AGENTS["r2d2"])
    model = onnx.load(str(policy.path))
    values = {p.key: p.value for p in model.metadata_props}
    values = {k: v for k, v in {**values, **props}.items() if v is not None}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, values)
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(OnnxModelError, match=says):
        OnnxPolicy(tmp_path / "bad.onnx")


def test_a_stateless_file_that_claims_a_state_is_refused(tmp_path: Path) -> None:
    """A format-1 graph has no state inputs: metadata saying otherwise names the difference."""
    cfg = trained_checkpoint(tmp_path / "ckpt", ["agent.kind=dqn"])
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    model = onnx.load(str(tmp_path / "p.onnx"))
    values = {p.key: p.value for p in model.metadata_props}
    onnx.helper.set_model_props(model, {**values, "zmqrl.format": "2", "zmqrl.core": "64"})
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(
        OnnxModelError, match="expected the outputs \\['action', 'core_h_next', 'core_c_next'\\]"
    ):
        OnnxPolicy(tmp_path / "bad.onnx")
