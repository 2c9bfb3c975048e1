"""make_env / make_vector_env / sample_spec without Atari: error messages for missing extras, and the
next-step autoreset semantics the actor relies on."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest

from zmqrl.config import EnvConfig
from zmqrl.envs.factory import (
    ATARI_INSTALL_HINT,
    MUJOCO_INSTALL_HINT,
    EnvError,
    action_bounds,
    make_env,
    make_vector_env,
    sample_spec,
)

# Far enough for CartPole (pushed one way) to fall over, which takes about 10 steps.
MAX_STEPS_TO_FALL = 200
# CartPole's reset draws every state variable from U(-0.05, 0.05).
CARTPOLE_RESET_BOUND = 0.05


def test_plain_env_unchanged() -> None:
    env = make_env(EnvConfig(id="CartPole-v1", max_episode_steps=7))
    assert env.spec is not None and env.spec.max_episode_steps == 7
    spec = sample_spec(env)
    assert spec.obs_shape == (4,) and spec.obs_dtype == "float32" and spec.num_actions == 2
    env.close()


def test_training_flag_does_not_change_plain_envs() -> None:
    train = make_env(EnvConfig(id="CartPole-v1"), training=True)
    evaluation = make_env(EnvConfig(id="CartPole-v1"), training=False)
    assert str(train) == str(evaluation)


def test_unknown_id_is_env_error() -> None:
    with pytest.raises(EnvError, match="could not be made"):
        make_env(EnvConfig(id="NoSuchEnv-v0"))


def test_missing_ale_py_names_the_atari_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` now raises ImportError
    for cfg in (EnvConfig(id="ALE/Pong-v5", preprocess="atari"), EnvConfig(id="ALE/Pong-v5")):
        with pytest.raises(EnvError) as info:
            make_env(cfg)
        assert ATARI_INSTALL_HINT in str(info.value)


@pytest.fixture
def without_mujoco(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`import mujoco` fails, and gymnasium's MuJoCo modules are imported afresh (and so fail too)."""
    saved = {name: mod for name, mod in sys.modules.items() if name.startswith("gymnasium.envs.mujoco")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mujoco", None)
    yield
    for name in [n for n in sys.modules if n.startswith("gymnasium.envs.mujoco")]:
        del sys.modules[name]  # half-imported leftovers; monkeypatch then restores the originals


def test_missing_mujoco_names_the_mujoco_extra(without_mujoco: None) -> None:
    with pytest.raises(EnvError) as info:
        make_env(EnvConfig(id="HalfCheetah-v5"))
    assert MUJOCO_INSTALL_HINT in str(info.value)


def test_other_missing_dependency_keeps_gymnasium_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> gym.Env:
        raise gym.error.DependencyNotInstalled("Box2D is not installed, run `pip install swig`")

    monkeypatch.setattr(gym, "make", fail)
    with pytest.raises(EnvError, match="swig") as info:
        make_env(EnvConfig(id="LunarLander-v3"))
    assert MUJOCO_INSTALL_HINT not in str(info.value) and ATARI_INSTALL_HINT not in str(info.value)


def test_bad_preprocess_is_env_error() -> None:
    with pytest.raises(EnvError, match="preprocess"):
        make_env(EnvConfig(preprocess="mujoco"))


def test_vector_env_spec_uses_single_spaces() -> None:
    vec = make_vector_env(EnvConfig(id="CartPole-v1"), 3)
    assert vec.num_envs == 3
    assert vec.observation_space.shape == (3, 4)  # batched: what sample_spec must *not* use
    spec = sample_spec(vec)
    assert spec.obs_shape == (4,) and spec.num_actions == 2
    vec.close()


def test_vector_env_rejects_zero_envs() -> None:
    with pytest.raises(EnvError, match="num_envs"):
        make_vector_env(EnvConfig(), 0)


def test_vector_env_autoreset_is_next_step() -> None:
    """After sub-env 0 ends, its next step ignores the action and returns (reset obs, 0, False, False).

    Two identical vector envs take the same actions except at that autoreset step, where they differ;
    if the action were used, their sub-env 0 would diverge from then on.
    """
    if hasattr(gym.vector, "AutoresetMode"):
        assert (
            make_vector_env(EnvConfig(), 1).metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        )
    vec_a = make_vector_env(EnvConfig(id="CartPole-v1"), 2)
    vec_b = make_vector_env(EnvConfig(id="CartPole-v1"), 2)
    obs_a, _ = vec_a.reset(seed=11)
    obs_b, _ = vec_b.reset(seed=11)
    np.testing.assert_array_equal(obs_a, obs_b)
    push_left = np.zeros(2, dtype=np.int64)
    for _ in range(MAX_STEPS_TO_FALL):
        obs_a, reward, terminated, _, info = vec_a.step(push_left)
        vec_b.step(push_left)
        if terminated[0]:
            break
    else:
        pytest.fail("CartPole pushed left did not fall")
    assert reward[0] == 1.0  # the terminal step itself is an ordinary transition, with its final obs
    assert "final_obs" not in info  # that is same-step autoreset's key; next-step puts nothing there
    assert np.abs(obs_a[0]).max() > CARTPOLE_RESET_BOUND  # really the fallen state, not a reset one

    # The autoreset step: different actions, same result, which is a fresh episode's first obs.
    obs_a, reward_a, term_a, trunc_a, _ = vec_a.step(np.array([0, 0]))
    obs_b, reward_b, term_b, trunc_b, _ = vec_b.step(np.array([1, 0]))
    np.testing.assert_array_equal(obs_a[0], obs_b[0])
    assert np.abs(obs_a[0]).max() <= CARTPOLE_RESET_BOUND
    assert reward_a[0] == 0.0 and not term_a[0] and not trunc_a[0]
    assert reward_b[0] == 0.0 and not term_b[0] and not trunc_b[0]
    # Sub-env 1 was not reset; it stepped as usual with its (identical) action.
    np.testing.assert_array_equal(obs_a[1], obs_b[1])

    # From here the sub-env plays on normally: a real step rewards 1 and the two stay in lockstep.
    obs_a, reward_a, *_ = vec_a.step(np.array([1, 1]))
    obs_b, reward_b, *_ = vec_b.step(np.array([1, 1]))
    np.testing.assert_array_equal(obs_a, obs_b)
    assert reward_a[0] == 1.0
    vec_a.close()
    vec_b.close()


def test_action_bounds() -> None:
    assert action_bounds(make_env(EnvConfig(id="CartPole-v1"))) == {}
    bounds = action_bounds(make_env(EnvConfig(id="Pendulum-v1")))
    np.testing.assert_array_equal(bounds["action_low"], np.array([-2.0], dtype=np.float32))
    np.testing.assert_array_equal(bounds["action_high"], np.array([2.0], dtype=np.float32))
    vec_bounds = action_bounds(make_vector_env(EnvConfig(id="Pendulum-v1"), 2))
    assert vec_bounds["action_low"].shape == (1,)  # one sub-env's bounds, not the batched space's
