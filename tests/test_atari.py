"""Atari preprocessing (env.preprocess: atari) and the Nature CNN torso.

The env tests need ale-py (which ships the ROMs) and OpenCV (gymnasium's resize); they are skipped,
saying so, where those are not installed. The network tests always run.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl.agents.conv import HIDDEN_FEATURES, NatureCNN
from zmqrl.config import AtariConfig, EnvConfig
from zmqrl.envs.factory import ATARI_INSTALL_HINT, EnvError, make_env, make_vector_env, sample_spec

_MISSING = [name for name in ("ale_py", "cv2") if importlib.util.find_spec(name) is None]
needs_ale = pytest.mark.skipif(
    bool(_MISSING), reason=f"Atari tests need {', '.join(_MISSING)}: pip install -e '.[atari]'"
)

PONG = "ALE/Pong-v5"
# Space Invaders has lives and scores 5-30 points per invader, so one short random game shows both
# reward clipping (|r| > 1) and a lost life; with seed 3 the first life goes after ~320 agent steps.
INVADERS = "ALE/SpaceInvaders-v5"
INVADERS_SEED = 3
MAX_RANDOM_STEPS = 2_000
STACK_SHAPE = (4, 84, 84)


def _atari(env_id: str = PONG, **atari: Any) -> EnvConfig:
    return EnvConfig(id=env_id, preprocess="atari", atari=AtariConfig(**atari))


def _frame(env: gym.Env[Any, Any]) -> int:
    """Emulator frames since the episode began (counted by ALE itself, below every wrapper)."""
    return int(env.unwrapped.ale.getEpisodeFrameNumber())  # type: ignore[attr-defined]


def _wrapper(env: gym.Env[Any, Any], kind: type) -> Any:
    """The first wrapper of type ``kind`` in ``env``'s chain, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, kind):
            return env
        env = env.env
    return None


@needs_ale
def test_observation_is_stacked_uint8_channel_first() -> None:
    env = make_env(_atari())
    obs, _ = env.reset(seed=0)
    assert obs.shape == STACK_SHAPE and obs.dtype == np.uint8
    assert env.observation_space.shape == STACK_SHAPE and env.observation_space.dtype == np.uint8
    obs, *_ = env.step(0)
    assert obs.shape == STACK_SHAPE and obs.dtype == np.uint8
    spec = sample_spec(env)
    assert spec.obs_shape == STACK_SHAPE and spec.obs_dtype == "uint8" and spec.num_actions == 6
    env.close()


@needs_ale
def test_frames_are_stacked_oldest_first() -> None:
    env = make_env(_atari(noop_max=0))
    first, _ = env.reset(seed=0)
    assert all((first[i] == first[-1]).all() for i in range(3))  # padded with the reset frame
    obs = first
    for _ in range(3):
        previous = obs
        obs, *_ = env.step(0)
        np.testing.assert_array_equal(obs[:-1], previous[1:])  # the window slides by one frame
    env.close()


@needs_ale
@pytest.mark.parametrize("frame_skip", [4, 2])
def test_frame_skip_repeats_each_action(frame_skip: int) -> None:
    """One agent step is exactly ``frame_skip`` emulator frames (ALE v5's own skip of 4 is turned off)."""
    env = make_env(_atari(frame_skip=frame_skip, noop_max=0))
    env.reset(seed=0)
    assert _frame(env) == 0
    for step in range(1, 4):
        env.step(0)
        assert _frame(env) == step * frame_skip
    assert env.unwrapped._frameskip == 1  # type: ignore[attr-defined]
    env.close()


@needs_ale
def test_noop_reset_starts_at_random_frames() -> None:
    noop_max = 30
    env = make_env(_atari(noop_max=noop_max))
    starts = set()
    for seed in range(8):
        env.reset(seed=seed)
        assert 1 <= _frame(env) <= noop_max
        starts.add(_frame(env))
    assert len(starts) > 1
    env.close()


@needs_ale
def test_max_episode_steps_counts_agent_steps() -> None:
    env = make_env(EnvConfig(id=PONG, preprocess="atari", max_episode_steps=5, atari=AtariConfig(noop_max=0)))
    env.reset(seed=0)
    for _ in range(4):
        assert not env.step(0)[3]
    assert env.step(0)[3]  # truncated at the 5th agent step = 20 frames, not the 5th frame
    assert _frame(env) == 20
    env.close()


@needs_ale
def test_training_clips_rewards_and_ends_on_life_loss_evaluation_does_neither() -> None:
    """Train and eval envs play the same seeded game in lockstep; only what they report differs."""
    cfg = _atari(INVADERS, terminal_on_life_loss=True, clip_rewards=True)
    train, evaluation = make_env(cfg, training=True), make_env(cfg, training=False)
    obs_train, _ = train.reset(seed=INVADERS_SEED)
    obs_eval, _ = evaluation.reset(seed=INVADERS_SEED)
    np.testing.assert_array_equal(obs_train, obs_eval)
    assert isinstance(train.action_space, gym.spaces.Discrete)
    rng = np.random.default_rng(0)
    raw_rewards: list[float] = []
    for _ in range(MAX_RANDOM_STEPS):
        action = int(rng.integers(train.action_space.n))
        _, r_train, term_train, _, info_train = train.step(action)
        _, r_eval, term_eval, trunc_eval, info_eval = evaluation.step(action)
        assert r_train == np.sign(float(r_eval))
        raw_rewards.append(float(r_eval))
        if term_train:
            break
    else:
        pytest.fail("no life was lost in a random Space Invaders game")
    assert max(raw_rewards) > 1.0  # the eval env saw the raw score, the training env only its sign
    assert info_train["lives"] == info_eval["lives"] == 2  # the first of three lives was lost ...
    assert not term_eval and not trunc_eval  # ... which ends the training episode only
    assert _wrapper(train, gym.wrappers.AtariPreprocessing).terminal_on_life_loss
    assert not _wrapper(evaluation, gym.wrappers.AtariPreprocessing).terminal_on_life_loss
    assert _wrapper(evaluation, gym.wrappers.TransformReward) is None
    train.close()
    evaluation.close()


@needs_ale
def test_flags_off_mean_raw_rewards_and_whole_games_in_training() -> None:
    env = make_env(_atari(INVADERS, terminal_on_life_loss=False, clip_rewards=False), training=True)
    assert not _wrapper(env, gym.wrappers.AtariPreprocessing).terminal_on_life_loss
    assert _wrapper(env, gym.wrappers.TransformReward) is None
    env.close()


@needs_ale
def test_repeat_action_probability_default_kept_and_override_applied() -> None:
    default = make_env(_atari())
    assert default.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)  # type: ignore[attr-defined]
    cfg = EnvConfig(id=PONG, preprocess="atari", kwargs={"repeat_action_probability": 0.0})
    deterministic = make_env(cfg)
    assert deterministic.unwrapped.ale.getFloat("repeat_action_probability") == 0.0  # type: ignore[attr-defined]
    default.close()
    deterministic.close()


@needs_ale
def test_env_frameskip_other_than_one_is_refused() -> None:
    with pytest.raises(EnvError, match="frame_skip"):
        make_env(EnvConfig(id=PONG, preprocess="atari", kwargs={"frameskip": 4}))


@needs_ale
def test_rgb_frames_are_moved_channel_first() -> None:
    env = make_env(_atari(grayscale=False, noop_max=0))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(0)
    assert obs.shape == (12, 84, 84) and obs.dtype == np.uint8
    newest = _wrapper(env, gym.wrappers.FrameStackObservation).obs_queue[-1]  # (84, 84, 3)
    np.testing.assert_array_equal(obs[-3:], newest.transpose(2, 0, 1))
    assert NatureCNN(obs.shape)(torch.from_numpy(obs[None])).shape == (1, HIDDEN_FEATURES)
    env.close()


@needs_ale
def test_missing_opencv_names_the_atari_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)  # AtariPreprocessing's `import cv2` now fails
    with pytest.raises(EnvError) as info:
        make_env(_atari())
    assert ATARI_INSTALL_HINT in str(info.value)


@needs_ale
def test_vector_env_of_atari() -> None:
    vec = make_vector_env(_atari(), 2)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (2, *STACK_SHAPE) and obs.dtype == np.uint8
    assert sample_spec(vec).obs_shape == STACK_SHAPE
    vec.close()


# --- NatureCNN -------------------------------------------------------------------------------------


def test_cnn_output_shape_and_flat_size() -> None:
    net = NatureCNN(STACK_SHAPE)
    assert net.out_features == HIDDEN_FEATURES
    assert net.fc[0].in_features == 3136  # 64 channels x 7 x 7, as in the paper
    assert net(torch.zeros(5, *STACK_SHAPE)).shape == (5, HIDDEN_FEATURES)


def test_cnn_other_screen_sizes() -> None:
    net = NatureCNN((1, 64, 48))
    assert net(torch.zeros(2, 1, 64, 48)).shape == (2, HIDDEN_FEATURES)
    with pytest.raises(ValueError, match="too small"):
        NatureCNN((4, 16, 16))
    with pytest.raises(ValueError, match="C, H, W"):
        NatureCNN((84, 84))


def test_cnn_uint8_and_float_pixels_agree() -> None:
    net = NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(0))
    pixels = torch.randint(
        0, 256, (3, *STACK_SHAPE), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    as_float = pixels.to(torch.float32)
    out = net(pixels)
    torch.testing.assert_close(out, net(as_float))
    assert out.dtype == torch.float32 and (out >= 0).all()  # ReLU output
    assert torch.equal(
        as_float, pixels.to(torch.float32)
    )  # the caller's float tensor was not scaled in place


def test_cnn_rejects_channel_last_input() -> None:
    net = NatureCNN(STACK_SHAPE)
    with pytest.raises(ValueError, match="channel-first"):
        net(torch.zeros(1, 84, 84, 4))


def test_cnn_same_generator_seed_same_weights_whatever_the_global_rng() -> None:
    torch.manual_seed(1)
    a = NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(7))
    c = NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(8))
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
        assert not torch.equal(tensor, c.state_dict()[name]), name


def test_cnn_with_generator_leaves_global_rng_alone() -> None:
    torch.manual_seed(3)
    before = torch.get_rng_state()
    NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.get_rng_state(), before)


def test_cnn_generator_init_matches_torch_default_bounds() -> None:
    net = NatureCNN(STACK_SHAPE, generator=torch.Generator().manual_seed(0))
    for layer in net.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            bound = 1.0 / np.sqrt(np.prod(layer.weight.shape[1:]))
            assert layer.bias is not None
            assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
            assert layer.weight.abs().max() > 0.9 * bound  # the full range is used, not a narrower one
