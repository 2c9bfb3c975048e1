"""`zmqrl export` writes a checkpoint's greedy policy as ONNX, and `zmqrl eval --onnx` plays it
without torch (issue 41, item 3): every built-in agent and torso picks, in onnxruntime, the
actions `load_policy` picks; the model says what it takes and which run it came from; a file
that is no zmqrl export is refused with one line; a missing extra prints the install hint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import zmqrl
from tests.conftest import REPO
from zmqrl.agents import make_learner
from zmqrl.checkpoints.files import load_checkpoint, save_checkpoint
from zmqrl.checkpoints.onnx_export import OnnxExportError, export_onnx
from zmqrl.checkpoints.onnx_policy import OnnxModelError, OnnxPolicy, OnnxUnavailable
from zmqrl.checkpoints.policy import load_checkpoint_weights, make_eval_agent
from zmqrl.cli.app import app
from zmqrl.code_trust import UntrustedCode
from zmqrl.config import Config, load_config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.evaluator.greedy import evaluate_checkpoint
from zmqrl.evaluator.onnx_eval import evaluate_onnx
from zmqrl.runtime.run_fingerprint import run_fingerprint

onnx = pytest.importorskip("onnx")  # the onnx extra (dev installs it)
pytest.importorskip("onnxruntime")

FRAMES = "tests.example_envs:make_frames_env"  # (4, 36, 36) uint8: both CNN torsos take it
# Observations each model is compared on.
OBSERVATIONS = 300
# Continuous actions: the same float32 operations on both sides, in another order of summation
# (numpy's BLAS against onnxruntime's kernels) and with another tanh; that moves an action by a
# few float32 ulps (measured: at most ~1e-6 on Pendulum, whose bounds are +-2).
ACTION_ATOL = 1e-5

AGENTS = {
    "dqn-mlp": ["agent.kind=dqn", "agent.dueling=true"],
    "dqn-nature_cnn": ["agent.kind=dqn", "agent.torso=nature_cnn", f"env.id={FRAMES}"],
    "dqn-minatar_cnn": ["agent.kind=dqn", "agent.torso=minatar_cnn", f"env.id={FRAMES}"],
    "sac": ["agent.kind=sac", "env.id=Pendulum-v1"],
    "appo-discrete": ["agent.kind=appo"],
    "appo-continuous": ["agent.kind=appo", "env.id=Pendulum-v1"],
    "appo-nature_cnn": ["agent.kind=appo", "agent.torso=nature_cnn", f"env.id={FRAMES}"],
    "appo-minatar_cnn": ["agent.kind=appo", "agent.torso=minatar_cnn", f"env.id={FRAMES}"],
}


def trained_checkpoint(path: Path, overrides: list[str]) -> Config:
    """A checkpoint of a fresh agent whose acting weights were moved well away from their initial
    draw (APPO's heads start near zero: every action would tie), as a trained one's are."""
    cfg = load_config(None, [*overrides, "agent.hidden_sizes=[32, 32]"])
    env = make_env(cfg.env)
    agent = make_learner(cfg.agent, sample_spec(env), seed=0)
    env.close()
    rng = np.random.default_rng(1)
    weights = agent.export_weights()
    agent.load_weights({k: (v + rng.normal(0, 0.5, v.shape)).astype(np.float32) for k, v in weights.items()})
    save_checkpoint(path, {"agent": agent.state_dict(), "config": cfg.to_dict(), "counters": {"updates": 0}})
    return cfg


def observations(cfg: Config, count: int) -> np.ndarray:
    """Observations inside the env's declared space, drawn with a seed: uniform over the
    frames' bytes, uniform in [-3, 3] where a float bound is wider (CartPole's velocities are
    unbounded; its real states, all near 0, would hardly move a random network's choice)."""
    env = make_env(cfg.env, training=False)
    space = env.observation_space
    env.close()
    if np.issubdtype(space.dtype, np.integer):
        space.seed(0)
        return np.stack([space.sample() for _ in range(count)])
    low, high = np.maximum(space.low, -3.0), np.minimum(space.high, 3.0)
    return np.random.default_rng(0).uniform(low, high, (count, *space.shape)).astype(space.dtype)


@pytest.fixture
def cartpole(tmp_path: Path) -> tuple[Path, Path, Config]:
    """A CartPole DQN checkpoint and its export."""
    checkpoint, model = tmp_path / "ckpt", tmp_path / "policy.onnx"
    cfg = trained_checkpoint(checkpoint, AGENTS["dqn-mlp"])
    export_onnx(checkpoint, model)
    return checkpoint, model, cfg


@pytest.mark.parametrize("case", list(AGENTS))
def test_the_exported_model_picks_the_actions_load_policy_picks(tmp_path: Path, case: str) -> None:
    cfg = trained_checkpoint(tmp_path / "ckpt", AGENTS[case])
    export_onnx(tmp_path / "ckpt", tmp_path / "policy.onnx", config=cfg)  # a Config of ours: trusted
    deployed = zmqrl.load_policy(tmp_path / "ckpt", config=cfg)
    exported = OnnxPolicy(tmp_path / "policy.onnx")
    obs = observations(cfg, OBSERVATIONS)

    expected, actions = deployed.act(obs), exported.act(obs)

    assert actions.dtype == expected.dtype and actions.shape == expected.shape
    if expected.dtype == np.int64:
        assert np.array_equal(actions, expected)
        assert len(np.unique(expected)) > 1, "a policy that always picks one action checks little"
    else:
        np.testing.assert_allclose(actions, expected, rtol=0, atol=ACTION_ATOL)
        space = deployed.action_space
        assert np.all(actions >= space.low) and np.all(actions <= space.high)
    assert exported.act(obs[0]).shape == expected[0].shape  # one observation, as load_policy's act


def test_the_metadata_carries_the_specs_the_env_and_the_runs_fingerprint(
    cartpole: tuple[Path, Path, Config],
) -> None:
    _, model, cfg = cartpole
    props = {p.key: p.value for p in onnx.load(str(model)).metadata_props}
    env = make_env(cfg.env, training=False)
    fingerprint = run_fingerprint(cfg, sample_spec(env))
    env.close()

    assert json.loads(props["zmqrl.observation"]) == {"shape": [4], "dtype": "float32"}
    assert json.loads(props["zmqrl.action"]) == {"dtype": "int64", "shape": [], "n": 2}
    assert json.loads(props["zmqrl.fingerprint"]) == json.loads(json.dumps(fingerprint))
    assert json.loads(props["zmqrl.env"])["id"] == "CartPole-v1"
    assert props["zmqrl.agent"] == "dqn" and props["zmqrl.format"] == "1"
    assert props["zmqrl.checkpoint"] == "ckpt" and props["zmqrl.weights_version"] == "0"


def test_an_evaluators_weights_only_best_exports_with_its_version(
    tmp_path: Path, cartpole: tuple[Path, Path, Config]
) -> None:
    """``checkpoints/best`` holds the acting weights alone (zmqrl/evaluator/scoring.py writes it)."""
    checkpoint, _, cfg = cartpole
    env = make_env(cfg.env, training=False)
    agent = make_eval_agent(cfg, env)
    env.close()
    load_checkpoint_weights(agent, load_checkpoint(checkpoint), checkpoint)
    weights = agent.export_weights()
    best = {"contents": "weights", "agent_kind": "dqn", "version": 7, "config": cfg.to_dict()}
    save_checkpoint(tmp_path / "best", {**best, "weights": {k: torch.tensor(v) for k, v in weights.items()}})
    export_onnx(tmp_path / "best", tmp_path / "best.onnx")
    exported = OnnxPolicy(tmp_path / "best.onnx")
    assert exported.metadata.weights_version == 7
    obs = observations(cfg, 50)
    assert np.array_equal(exported.act(obs), OnnxPolicy(cartpole[1]).act(obs))


def test_continuous_bounds_in_the_metadata_are_the_envs(tmp_path: Path) -> None:
    export_onnx(
        tmp_path / "ckpt", tmp_path / "p.onnx", config=trained_checkpoint(tmp_path / "ckpt", AGENTS["sac"])
    )
    action = OnnxPolicy(tmp_path / "p.onnx").metadata.action
    assert (action.dtype, action.shape, action.low, action.high) == ("float32", (1,), (-2.0,), (2.0,))


def test_the_graph_runs_from_plain_onnxruntime_on_any_batch(cartpole: tuple[Path, Path, Config]) -> None:
    import onnxruntime as ort

    _, model, _ = cartpole
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for batch in (1, 7):
        (actions,) = session.run(["action"], {"obs": np.zeros((batch, 4), np.float32)})
        assert actions.shape == (batch,) and actions.dtype == np.int64


def test_eval_onnx_plays_the_episodes_eval_plays_for_the_checkpoint(
    cartpole: tuple[Path, Path, Config],
) -> None:
    checkpoint, model, _ = cartpole
    assert evaluate_onnx(model, 3, seed=5).returns == evaluate_checkpoint(checkpoint, 3, seed=5).returns


def test_zmqrl_eval_onnx_never_imports_torch(cartpole: tuple[Path, Path, Config]) -> None:
    _, model, _ = cartpole
    probe = (
        "import sys\n"
        f"sys.argv = ['zmqrl', 'eval', '--onnx', {str(model)!r}, '--episodes', '2']\n"
        "from zmqrl.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'torch' not in sys.modules, 'zmqrl eval --onnx imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mean return" in done.stdout and "over 2 episodes" in done.stdout


def test_the_cli_exports_and_plays(tmp_path: Path, cartpole: tuple[Path, Path, Config]) -> None:
    checkpoint, _, _ = cartpole
    model = tmp_path / "cli.onnx"
    exported = CliRunner().invoke(app, ["export", str(checkpoint), "-o", str(model)])
    assert exported.exit_code == 0, exported.output
    assert "dqn greedy policy of ckpt" in exported.output and "-> 2 actions" in exported.output
    played = CliRunner().invoke(app, ["eval", "--onnx", str(model), "-e", "2"])
    assert played.exit_code == 0, played.output
    assert "mean return" in played.output


def test_an_env_that_names_code_is_refused_unless_trusted(tmp_path: Path) -> None:
    cfg = trained_checkpoint(tmp_path / "ckpt", AGENTS["dqn-minatar_cnn"])
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", trust_config=True)
    with pytest.raises(UntrustedCode):
        evaluate_onnx(tmp_path / "p.onnx", 1)
    assert len(evaluate_onnx(tmp_path / "p.onnx", 1, trust_config=True).returns) == 1
    assert cfg.env.id == FRAMES


def test_an_env_the_model_does_not_fit_is_refused(cartpole: tuple[Path, Path, Config]) -> None:
    _, model, _ = cartpole
    with pytest.raises(ValueError, match=r"takes observations \[4\] float32, the env gives \[6\] float32"):
        evaluate_onnx(model, 1, overrides=["env.id=Acrobot-v1"])


def test_a_plugin_agent_is_refused_naming_the_agents_that_export(tmp_path: Path) -> None:
    """A plugin's greedy rule is its own code, which the exporter cannot know."""
    cfg = load_config(
        None, ["env.id=tests.example_envs:make_env", "agent.kind=tests.plugins.linear_q:PLUGIN"]
    )
    save_checkpoint(tmp_path / "ckpt", {"agent": {}, "config": cfg.to_dict()})
    with pytest.raises(OnnxExportError, match="knows the greedy rule of dqn, sac, appo, r2d2 only"):
        export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    assert not (tmp_path / "p.onnx").exists()


def test_a_file_that_is_no_onnx_model_is_refused_with_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "policy.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(OnnxModelError, match="not a readable ONNX model"):
        OnnxPolicy(garbage)
    result = CliRunner().invoke(app, ["eval", "--onnx", str(garbage)])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and result.output.count("\n") == 1


def test_an_output_whose_folder_cannot_be_made_is_refused_before_the_export(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    checkpoint = tmp_path / "latest"
    checkpoint.write_bytes(b"never read: the output is checked first")
    result = CliRunner().invoke(app, ["export", str(checkpoint), "-o", str(blocker / "p.onnx")])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --output: cannot make {blocker}: {blocker} is a file")


def test_an_onnx_model_without_zmqrl_metadata_is_refused(
    tmp_path: Path, cartpole: tuple[Path, Path, Config]
) -> None:
    model = onnx.load(str(cartpole[1]))
    del model.metadata_props[:]
    onnx.save(model, str(tmp_path / "foreign.onnx"))
    with pytest.raises(OnnxModelError, match="not a zmqrl export"):
        OnnxPolicy(tmp_path / "foreign.onnx")


def test_malformed_metadata_is_refused_naming_the_key(
    tmp_path: Path, cartpole: tuple[Path, Path, Config]
) -> None:
    model = onnx.load(str(cartpole[1]))
    props = {p.key: p.value for p in model.metadata_props}
    for key, value, says in [
        ("zmqrl.observation", '{"shape": [-4], "dtype": "float32"}', "not a list of positive integers"),
        ("zmqrl.observation", '{"shape": [4], "dtype": "object"}', "dtype 'object' is not one of"),
        ("zmqrl.action", '{"dtype": "int64", "shape": [], "n": NaN}', "NaN is no strict JSON"),
        ("zmqrl.env", "[]", "not a JSON object"),
    ]:
        onnx.helper.set_model_props(model, {**props, key: value})
        onnx.save(model, str(tmp_path / "bad.onnx"))
        with pytest.raises(OnnxModelError, match=f"malformed zmqrl metadata {key} \\(.*{says}"):
            OnnxPolicy(tmp_path / "bad.onnx")


def test_a_missing_extra_prints_the_install_hint(
    tmp_path: Path, cartpole: tuple[Path, Path, Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, model, _ = cartpole
    monkeypatch.setitem(sys.modules, "onnx", None)  # what importlib then reports as not installed
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(OnnxUnavailable):
        OnnxPolicy(model)
    for args in (["export", str(checkpoint), "-o", str(tmp_path / "x.onnx")], ["eval", "--onnx", str(model)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1
        assert result.output.strip().endswith("pip install 'zmqrl[onnx]'"), result.output
    assert not (tmp_path / "x.onnx").exists()


def test_eval_takes_a_checkpoint_or_an_onnx_file_not_both(cartpole: tuple[Path, Path, Config]) -> None:
    checkpoint, model, _ = cartpole
    for args in (["eval"], ["eval", str(checkpoint), "--onnx", str(model)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "give a CHECKPOINT or --onnx FILE" in result.output
