"""`zmqrl export` of Dict-observation policies: one graph input per key (its name, dtype and
shape, any batch), in which onnxruntime picks the actions `load_policy` picks on the env's raw
Dict; the metadata lists the keys and a file whose keys are not its graph's is refused; `zmqrl
eval --onnx` plays the file, and refuses an env whose keys are not the model's, naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from typer.testing import CliRunner

import zmqrl
from tests.conftest import REPO
from tests.test_dict_observations import grid_goal
from tests.test_export import ACTION_ATOL, trained_checkpoint
from zmqrl.checkpoints.onnx_export import export_onnx
from zmqrl.checkpoints.onnx_policy import OnnxModelError, OnnxPolicy
from zmqrl.cli.app import app
from zmqrl.config import load_config
from zmqrl.evaluator.greedy import evaluate_checkpoint
from zmqrl.evaluator.onnx_eval import evaluate_onnx, spaces_problem

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

# Tiny serial runs of the shipped GridGoal configs (the grid through the MinAtar CNN, the goal as it
# is). APPO's logits start near zero: before some 30 updates every observation picks action 0.
RUNS: dict[str, dict[str, object]] = {
    "dqn": {"learner.max_updates": 20, "learner.min_replay_size": 100, "learner.eval_interval": 20},
    "appo": {"learner.max_updates": 30, "learner.eval_interval": 30},
}
GRID_GOAL_APPO = ["agent.kind=appo", "agent.torso=minatar_cnn", "env.id=zmqrl/GridGoal-v0"]
# GridGoal's keys, in the records' order, as onnxruntime lists the graph's inputs.
GRID_GOAL_INPUTS = [("goal", "tensor(float)", ["batch", 2]), ("grid", "tensor(uint8)", ["batch", 1, 7, 7])]
GRID_GOAL_KEYS = "{goal: float32 [2], grid: uint8 [1, 7, 7]}"
OBSERVATIONS = 300
DICT_REACH = "env.id=tests.example_envs:make_dict_reach_env"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per agent: the run directory of a tiny serial GridGoal run, and its export."""
    from zmqrl.serial import run_serial

    root = tmp_path_factory.mktemp("grid-goal")
    out = {}
    for kind, values in RUNS.items():
        config = f"grid_goal_{kind}.yaml"
        overrides = grid_goal(config, root / kind, **{"learner.eval_episodes": 2, **values})
        assert run_serial(load_config(REPO / "configs" / config, overrides))["learner"]["state"] == "finished"
        export_onnx(root / kind / "t", root / f"{kind}.onnx")
        out[kind] = (root / kind / "t", root / f"{kind}.onnx")
    return out


def raw_dicts(space: gym.spaces.Dict, count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of Dict observations as a vector env gives them (``{key: (count, ...)}``)."""
    space.seed(seed)
    samples = [space.sample() for _ in range(count)]
    return {key: np.stack([s[key] for s in samples]) for key in space.spaces}


def grid_goal_space() -> gym.spaces.Dict:
    return gym.make("zmqrl/GridGoal-v0").observation_space  # type: ignore[return-value]


@pytest.mark.parametrize("kind", list(RUNS))
def test_the_graph_takes_one_input_per_key(exported: dict[str, tuple[Path, Path]], kind: str) -> None:
    session = ort.InferenceSession(str(exported[kind][1]), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == GRID_GOAL_INPUTS
    assert [(o.name, o.type, o.shape) for o in session.get_outputs()] == [
        ("action", "tensor(int64)", ["batch"])
    ]
    for batch in (1, 5):
        feeds = {"goal": np.zeros((batch, 2), np.float32), "grid": np.zeros((batch, 1, 7, 7), np.uint8)}
        assert session.run(["action"], feeds)[0].shape == (batch,)


@pytest.mark.parametrize("kind", [*RUNS, "appo-moved"])
def test_the_exported_model_picks_the_actions_load_policy_picks(
    tmp_path: Path, exported: dict[str, tuple[Path, Path]], kind: str
) -> None:
    """On the serial runs' checkpoints, and on APPO weights moved well away from their first draw
    (as test_export's ``trained_checkpoint``), which pick every action often."""
    if kind == "appo-moved":
        cfg = trained_checkpoint(tmp_path / "ckpt", GRID_GOAL_APPO)
        export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
        deployed, policy = zmqrl.load_policy(tmp_path / "ckpt", config=cfg), OnnxPolicy(tmp_path / "p.onnx")
    else:
        deployed, policy = zmqrl.load_policy(exported[kind][0]), OnnxPolicy(exported[kind][1])
    obs = raw_dicts(grid_goal_space(), OBSERVATIONS)

    expected, actions = deployed.act(obs), policy.act(obs)

    assert actions.dtype == expected.dtype == np.int64 and np.array_equal(actions, expected)
    assert len(np.unique(expected)) > 1, "a policy that always picks one action checks little"
    records = zmqrl.types.to_records(obs, policy.obs_dtype)  # what make_env's env gives
    assert np.array_equal(policy.act(records), expected)
    assert policy.act({key: value[3] for key, value in obs.items()}) == expected[3]  # one observation
    assert policy.act(records[3]) == expected[3]


@pytest.mark.parametrize("agent", ["sac", "appo"])
def test_continuous_dict_policies_export_their_bounded_mean(tmp_path: Path, agent: str) -> None:
    cfg = trained_checkpoint(tmp_path / "ckpt", [f"agent.kind={agent}", DICT_REACH])
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    deployed, policy = zmqrl.load_policy(tmp_path / "ckpt", config=cfg), OnnxPolicy(tmp_path / "p.onnx")
    obs = raw_dicts(gym.spaces.Dict(deployed.observation_space.spaces), OBSERVATIONS)

    expected, actions = deployed.act(obs), policy.act(obs)

    assert actions.dtype == expected.dtype == np.float32 and actions.shape == (OBSERVATIONS, 2)
    np.testing.assert_allclose(actions, expected, rtol=0, atol=ACTION_ATOL)
    assert np.all(np.abs(actions) <= 1.0) and np.ptp(actions[:, 0]) > 0.1
    assert [i.name for i in ort.InferenceSession(str(tmp_path / "p.onnx")).get_inputs()] == [
        "position",
        "view",
    ]


def test_a_masked_policy_of_several_keys_obeys_the_mask_field(tmp_path: Path) -> None:
    """PickLargest with a third key: the mask is the records' field ``action_mask``, a graph input."""
    overrides = ["env.id=zmqrl/PickLargest-v0", "env.kwargs={extra_key: progress}", "agent.kind=dqn"]
    cfg = trained_checkpoint(tmp_path / "ckpt", overrides)
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    policy = OnnxPolicy(tmp_path / "p.onnx")
    env = gym.make("zmqrl/PickLargest-v0", extra_key="progress")
    obs = raw_dicts(env.observation_space, OBSERVATIONS)  # type: ignore[arg-type]
    mask = obs["action_mask"]
    mask[:, 0] = 0  # a taken slot the network may well prefer
    mask[~mask.any(axis=1), -1] = 1  # a state with no legal move is terminal: never acted on

    actions = policy.act(obs)  # the env's int8 mask, as a raw Dict gives it

    assert obs["action_mask"][np.arange(OBSERVATIONS), actions].all(), "an illegal action was picked"
    assert np.array_equal(actions, zmqrl.load_policy(tmp_path / "ckpt", config=cfg).act(obs))
    assert "action_mask" in [i.name for i in ort.InferenceSession(str(tmp_path / "p.onnx")).get_inputs()]


def test_the_metadata_lists_each_key(exported: dict[str, tuple[Path, Path]]) -> None:
    model = exported["dqn"][1]
    props = {p.key: p.value for p in onnx.load(str(model)).metadata_props}
    assert json.loads(props["zmqrl.observation"]) == {
        "keys": [
            {"name": "goal", "shape": [2], "dtype": "float32"},
            {"name": "grid", "shape": [1, 7, 7], "dtype": "uint8"},
        ]
    }
    metadata = OnnxPolicy(model).metadata
    assert [(e.key, e.shape, e.dtype) for e in metadata.obs_keys] == [
        ("goal", (2,), "float32"),
        ("grid", (1, 7, 7), "uint8"),
    ]
    assert metadata.observation_text() == GRID_GOAL_KEYS


def test_the_cli_names_the_keys_and_eval_plays_the_file(
    tmp_path: Path, exported: dict[str, tuple[Path, Path]]
) -> None:
    run_dir, model = exported["appo"]
    done = CliRunner().invoke(app, ["export", str(run_dir), "-o", str(tmp_path / "cli.onnx")])
    assert done.exit_code == 0, done.output
    assert f"obs {GRID_GOAL_KEYS} -> 4 actions" in done.output
    played = CliRunner().invoke(app, ["eval", "--onnx", str(tmp_path / "cli.onnx"), "-e", "3"])
    assert played.exit_code == 0, played.output
    assert "over 3 episodes" in played.output
    assert (
        evaluate_onnx(model, 4, seed=3).returns
        == evaluate_checkpoint(run_dir / "checkpoints" / "latest", 4, seed=3).returns
    )


def rewritten(tmp_path: Path, model: Path, keys: list[Any] | dict[str, Any]) -> Path:
    """``model`` with its zmqrl.observation replaced by ``keys`` (a list: ``{"keys": keys}``)."""
    loaded = onnx.load(str(model))
    props = {p.key: p.value for p in loaded.metadata_props}
    observation = {"keys": keys} if isinstance(keys, list) else keys
    onnx.helper.set_model_props(loaded, {**props, "zmqrl.observation": json.dumps(observation)})
    onnx.save(loaded, str(tmp_path / "bad.onnx"))
    return tmp_path / "bad.onnx"


GOAL = {"name": "goal", "shape": [2], "dtype": "float32"}
GRID = {"name": "grid", "shape": [1, 7, 7], "dtype": "uint8"}


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ([GRID], r"the graph's inputs are \['goal', 'grid'\], its metadata describes \['grid'\]"),
        ([GOAL, GRID, {**GOAL, "name": "speed"}], r"its metadata describes \['goal', 'grid', 'speed'\]"),
        ([GRID, GOAL], r"its metadata describes \['grid', 'goal'\]"),
        (
            [GOAL, {**GRID, "dtype": "float32"}],
            r"input 'grid': the graph takes uint8 \[1, 7, 7\] .*says float32",
        ),
        ([{**GOAL, "shape": [3]}, GRID], r"input 'goal': the graph takes float32 \[2\] .*says float32 \[3\]"),
    ],
    ids=["missing", "extra", "reordered", "mistyped", "misshapen"],
)
def test_metadata_whose_keys_are_not_the_graphs_inputs_is_refused(
    tmp_path: Path, exported: dict[str, tuple[Path, Path]], keys: list[Any], says: str
) -> None:
    with pytest.raises(OnnxModelError, match=says):
        OnnxPolicy(rewritten(tmp_path, exported["dqn"][1], keys))


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ([GOAL, {**GRID, "dtype": "object"}], "key 'grid': dtype 'object' is not one of"),
        ([GOAL, {**GRID, "shape": [1, 0, 7]}], "key 'grid': shape .* is not a list of positive integers"),
        ([GOAL, {**GRID, "name": "grid.x"}], "must be an identifier"),
        ([GOAL, GOAL], "key 'goal' is listed twice"),
        ([GOAL, {**GRID, "name": "action"}], "or is the name of the graph's state or output"),
        ([GOAL, {**GRID, "low": 0}], "by its name, shape and dtype alone"),
        ([GOAL, ["grid", [1, 7, 7], "uint8"]], "by its name, shape and dtype alone"),
        ([], "a list of 1 to 16 keys"),
        ({"keys": [GOAL, GRID], "shape": [2], "dtype": "float32"}, "described by 'keys' alone"),
    ],
    ids=["dtype", "shape", "name", "twice", "output", "extra-field", "not-an-object", "empty", "both"],
)
def test_malformed_key_descriptions_are_refused_naming_the_metadata_key(
    tmp_path: Path, exported: dict[str, tuple[Path, Path]], keys: Any, says: str
) -> None:
    with pytest.raises(OnnxModelError, match=f"malformed zmqrl metadata zmqrl.observation \\(.*{says}"):
        OnnxPolicy(rewritten(tmp_path, exported["dqn"][1], keys))


class Renamed(gym.Env[Any, Any]):
    """GridGoal's spaces with one key renamed, or one added: a model of GridGoal reads neither."""

    def __init__(self, spaces: dict[str, gym.Space[Any]]) -> None:
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Discrete(4)


def test_an_env_whose_keys_are_not_the_models_is_refused_naming_the_key(
    exported: dict[str, tuple[Path, Path]],
) -> None:
    model = exported["dqn"][1]
    with pytest.raises(
        ValueError, match=r"key 'grid': the model takes \[1, 7, 7\] uint8, the env gives \[1, 5, 5\] uint8"
    ):
        evaluate_onnx(model, 1, overrides=["env.kwargs={size: 5}"])
    with pytest.raises(
        ValueError, match=r"the model takes observations \{goal: float32 \[2\], .*the env gives \[4\] float32"
    ):
        evaluate_onnx(model, 1, overrides=["env.id=CartPole-v1"])
    metadata = OnnxPolicy(model).metadata
    goal, grid = grid_goal_space().spaces["goal"], grid_goal_space().spaces["grid"]
    assert "has no key 'grid', which the model takes" in str(
        spaces_problem(metadata, Renamed({"goal": goal, "board": grid}))
    )
    extra = spaces_problem(metadata, Renamed({"goal": goal, "grid": grid, "speed": goal}))
    assert "has a key 'speed' the model does not take" in str(extra)
    assert spaces_problem(metadata, Renamed({"grid": grid, "goal": goal})) is None  # fed by name


def test_a_plain_model_refuses_a_dict_env(tmp_path: Path) -> None:
    cfg = trained_checkpoint(tmp_path / "ckpt", ["agent.kind=dqn"])
    export_onnx(tmp_path / "ckpt", tmp_path / "p.onnx", config=cfg)
    with pytest.raises(
        ValueError, match=r"takes observations \[4\] float32, the env gives \{goal: float32 \[2\]"
    ):
        evaluate_onnx(tmp_path / "p.onnx", 1, overrides=["env.id=zmqrl/GridGoal-v0"])
