"""The Atari throughput benchmark: well-formed rows, a clean skip without EnvPool, like-for-like sides.

No speed ratio is asserted (timing on a shared machine is noise); the benchmark prints it. The
tests need ale-py and OpenCV; those that measure EnvPool itself also need envpool.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from zmqrl.config import AtariConfig, EnvConfig
from zmqrl.envs.factory import EnvError, make_env
from zmqrl_bench import atari
from zmqrl_bench.report import BenchSettings

_MISSING_ALE = [name for name in ("ale_py", "cv2") if importlib.util.find_spec(name) is None]
needs_ale = pytest.mark.skipif(bool(_MISSING_ALE), reason=f"needs {_MISSING_ALE}: pip install -e '.[atari]'")
needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason="needs envpool: pip install envpool"
)

TINY = BenchSettings(quick=True, repeats=2, seconds=0.05)
PARITY_STEPS = 40


@needs_ale
@needs_envpool
def test_envpool_row_compares_both_sides_against_the_target() -> None:
    (row,) = atari.run(TINY)
    assert row.group == "atari"
    assert row.unit == "env frames/s"
    assert row.reference is not None and row.target == 1.5 and row.higher_is_better
    assert len(row.ours.values) == len(row.reference.values) == TINY.repeats
    assert min(row.ours.values) > 0 and min(row.reference.values) > 0
    assert "LAYOUTS DIFFER" not in row.notes
    assert row.extra["sub_envs"] == atari.SUB_ENVS
    assert row.extra["cpu_ratio"] > 0
    assert row.to_json()["ratio"] == pytest.approx(row.ours.median / row.reference.median)


@needs_ale
def test_without_envpool_the_gymnasium_side_is_still_measured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_envpool(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("No module named 'envpool'")

    monkeypatch.setattr(atari, "envpool_env", no_envpool)
    with caplog.at_level(logging.WARNING, logger="zmqrl_bench.atari"):
        (row,) = atari.run(TINY)
    assert row.reference is None and row.target is None and row.passed is None
    assert len(row.ours.values) == TINY.repeats and min(row.ours.values) > 0
    assert "pip install envpool" in row.notes
    assert "envpool not installed" in caplog.text


def test_without_the_atari_emulator_there_is_no_row_and_the_reason_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_ale(num_envs: int) -> Any:
        raise EnvError("env.id 'ALE/Pong-v5' needs the Atari emulator")

    monkeypatch.setattr(atari, "_gymnasium_env", no_ale)
    with caplog.at_level(logging.WARNING, logger="zmqrl_bench.atari"):
        assert atari.run(TINY) == []
    assert "Atari emulator" in caplog.text


@needs_ale
@needs_envpool
def test_both_sides_do_the_same_work_frame_for_frame() -> None:
    """Without randomness (no sticky actions, exactly one no-op) EnvPool as the bench configures it
    and zmqrl's training env give identical observations and clipped rewards, step by step."""
    one_noop = AtariConfig(noop_max=1)
    ours = make_env(
        EnvConfig(
            id=f"ALE/{atari.GAME}-v5",
            preprocess="atari",
            kwargs={"repeat_action_probability": 0.0},
            atari=one_noop,
        ),
        training=True,
    )
    assert isinstance(ours.action_space, gym.spaces.Discrete)
    num_actions = int(ours.action_space.n)
    pool = atari.envpool_env(1, one_noop, sticky=0.0)
    try:
        gym_obs, _ = ours.reset(seed=0)
        pool_obs, _ = pool.reset()
        assert pool_obs.shape == (1, *gym_obs.shape) and pool_obs.dtype == gym_obs.dtype == np.uint8
        np.testing.assert_array_equal(pool_obs[0], gym_obs)
        for t in range(PARITY_STEPS):
            action = t % num_actions
            gym_obs, gym_reward, *_ = ours.step(action)
            pool_obs, pool_reward, *_ = pool.step(np.array([action]))
            np.testing.assert_array_equal(pool_obs[0], gym_obs, err_msg=f"step {t}")
            assert float(pool_reward[0]) == gym_reward
    finally:
        ours.close()
        pool.close()
