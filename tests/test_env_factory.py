"""env.id as an import path to a factory of one's own, observation spaces beyond Box, and the
errors that say what to fix; then a real `zmqrl launch` that trains DQN on such an env."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from tests import example_envs
from tests.conftest import launch_to_the_end, processes_mentioning, tiny_overrides
from zmqrl.config import EnvConfig, load_config
from zmqrl.envs.factory import EnvError, OneHotObservation, make_env, make_vector_env, sample_spec
from zmqrl.runtime.run_fingerprint import run_fingerprint

CORRIDOR = "tests.example_envs:make_env"
HERE = __name__  # this module, importable as tests.test_env_factory: factories for the error cases


def not_an_env() -> object:
    return object()


def dict_observations() -> gym.Env[Any, Any]:
    env = example_envs.Corridor()
    env.observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(3)})  # type: ignore[assignment]
    return env


def with_space(space: gym.Space[Any]) -> gym.Env[Any, Any]:
    env = example_envs.Corridor()
    env.observation_space = space  # type: ignore[assignment]
    return env


def shifted_discrete() -> gym.Env[Any, Any]:
    """Observations numbered from 10, as Discrete(n, start=10) allows."""
    return with_space(gym.spaces.Discrete(4, start=10))


NOT_A_FACTORY = 42


def env_error(env_id: str, **kwargs: Any) -> str:
    with pytest.raises(EnvError) as info:
        make_env(EnvConfig(id=env_id, kwargs=kwargs))
    return str(info.value)


# ------------------------------------------------------------------------------- factory paths


def test_an_import_path_is_called_with_env_kwargs() -> None:
    env = make_env(EnvConfig(id=CORRIDOR, kwargs={"length": 4, "max_steps": 9}))
    corridor = env.unwrapped
    assert isinstance(corridor, example_envs.Corridor)
    assert (corridor.length, corridor.max_steps) == (4, 9)
    env.close()


def test_max_episode_steps_applies_to_a_factory_env() -> None:
    env = make_env(EnvConfig(id=CORRIDOR, max_episode_steps=3))
    env.reset(seed=0)
    ends = [env.step(example_envs.LEFT)[3] for _ in range(3)]  # walking into the wall: never the goal
    assert ends == [False, False, True]  # truncated by the TimeLimit, before the factory's own 25


def test_a_gymnasium_module_colon_id_still_goes_to_gymnasium() -> None:
    # gymnasium's own "module:Env-v0" form: what follows the colon is not an attribute name.
    env = make_env(EnvConfig(id="gymnasium.envs.classic_control:CartPole-v1"))
    assert env.spec is not None and env.spec.id == "CartPole-v1"
    env.close()


def test_a_module_that_cannot_be_imported_says_how_to_make_it_importable() -> None:
    message = env_error("no_such_package.envs:make_env")
    assert "env.id 'no_such_package.envs:make_env'" in message
    assert "cannot import module 'no_such_package.envs'" in message and "PYTHONPATH" in message


def test_a_missing_factory_names_the_module_and_suggests_close_names() -> None:
    message = env_error("tests.example_envs:make_envs")
    assert "module 'tests.example_envs' has no attribute 'make_envs'" in message
    assert "did you mean 'make_env'" in message


def test_a_factory_path_to_something_not_callable_is_refused() -> None:
    assert "not a callable" in env_error(f"{HERE}:NOT_A_FACTORY")


def test_env_kwargs_the_factory_does_not_take_are_a_config_error() -> None:
    message = env_error(CORRIDOR, lenght=4)
    assert f"env.id '{CORRIDOR}'" in message and "does not take env.kwargs ['lenght']" in message


def test_a_factory_must_return_a_gymnasium_env() -> None:
    message = env_error(f"{HERE}:not_an_env")
    assert f"env.id '{HERE}:not_an_env'" in message and "builtins.object, not a gymnasium.Env" in message


def test_atari_preprocessing_wants_a_registered_ale_id() -> None:
    with pytest.raises(EnvError, match="registered ALE id"):
        make_env(EnvConfig(id=CORRIDOR, preprocess="atari"))


def test_an_unknown_registered_id_lists_close_matches_and_the_import_path_form() -> None:
    message = env_error("CartPol-v1")
    assert "did you mean 'CartPole-v1'" in message
    assert "mypackage.envs:make_env" in message


def test_an_id_with_no_close_match_still_mentions_the_import_path_form() -> None:
    message = env_error("Zzzzzzzzzzzz-v0")
    assert "did you mean" not in message and "import path" in message


# ----------------------------------------------------------------------------- observation spaces


def test_discrete_observations_are_one_hot_float32() -> None:
    env = make_env(EnvConfig(id=CORRIDOR, kwargs={"length": 4}))
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, np.array([1, 0, 0, 0], np.float32))
    obs, *_ = env.step(example_envs.RIGHT)
    assert obs.dtype == np.float32
    np.testing.assert_array_equal(obs, np.array([0, 1, 0, 0], np.float32))


def test_a_discrete_start_offset_is_taken_off() -> None:
    env = OneHotObservation(shifted_discrete())
    assert env.observation(12).tolist() == [0.0, 0.0, 1.0, 0.0]


def test_the_spec_and_fingerprint_see_the_encoded_box() -> None:
    cfg = load_config(None, [f"env.id={CORRIDOR}", "env.kwargs={length: 5}"])
    env = make_env(cfg.env)
    spec = sample_spec(env)
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((5,), "float32", 2)
    fingerprint = run_fingerprint(cfg, spec)
    assert fingerprint["env.id"] == CORRIDOR and fingerprint["obs.shape"] == [5]


def test_vector_envs_encode_every_sub_env() -> None:
    vec = make_vector_env(EnvConfig(id=CORRIDOR, kwargs={"length": 3}), 2)
    obs, _ = vec.reset(seed=0)
    np.testing.assert_array_equal(obs, np.array([[1, 0, 0], [1, 0, 0]], np.float32))
    assert sample_spec(vec).obs_shape == (3,)
    vec.close()


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(2))),
        gym.spaces.MultiDiscrete([3, 2]),
        gym.spaces.MultiBinary(4),
        gym.spaces.Text(8),
    ],
    ids=lambda space: type(space).__name__,
)
def test_other_observation_spaces_are_refused_naming_the_space(
    space: gym.Space[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[HERE], "SPACE", space, raising=False)
    message = env_error(f"{HERE}:env_with_space")
    assert f"observation space {type(space).__name__}" in message
    assert "Box observations, and Discrete ones (one-hot encoded)" in message


def env_with_space() -> gym.Env[Any, Any]:
    """The corridor with the observation space the current test put in ``SPACE``."""
    return with_space(sys.modules[HERE].SPACE)


def test_registered_ids_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    gym.register(id="ZmqrlTestDictObs-v0", entry_point=f"{HERE}:dict_observations")
    try:
        # A Dict is taken (one record field per key) when its entries are Boxes: this one's is not.
        message = env_error("ZmqrlTestDictObs-v0")
        assert "entry 'cell' is Discrete(3)" in message and "Dict observations of Box entries" in message
    finally:
        gym.registry.pop("ZmqrlTestDictObs-v0")


# ------------------------------------------------------------------------------ a real launch


@pytest.mark.slow
def test_launch_trains_dqn_on_a_factory_env_to_its_optimum(run_root: Path) -> None:
    """Learner, actor and evaluator all build the env from the import path, with Discrete
    observations one-hot encoded alike, and greedy DQN ends walking straight to the goal."""
    length = 6
    config = run_root.parent / "corridor.yaml"
    config.write_text(f"env:\n  id: {CORRIDOR}\n  kwargs: {{length: {length}}}\n")
    overrides = tiny_overrides(
        run_root,
        learner__max_updates=600,
        learner__min_replay_size=100,
        learner__eval_interval=200,
        agent__lr=0.001,
        agent__target_update_interval=50,
        evaluator__enabled="true",  # a third process that makes the env: evaluates the final weights
        evaluator__episodes=2,
    )
    result = launch_to_the_end(config, overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    learner = json.loads((run_root / "t" / "learner-stats.json").read_text())
    evaluator = json.loads((run_root / "t" / "evaluator-stats.json").read_text())
    history = evaluator["eval_history"]
    optimum = example_envs.Corridor(length=length).optimal_return
    assert learner["updates"] == 600 and history, (learner, evaluator)
    assert evaluator["evaluated_version"] == learner["weights_version"]  # the final weights were played
    assert history[-1]["mean"] == optimum, history  # greedy on a deterministic env: exactly optimal
    assert processes_mentioning(str(run_root)) == []
