"""configs/zoo/ holds one tuned config per classic-control and MuJoCo locomotion task (issue 28):
a user who changes env.id finds the one for their task there, and the supervisor's no-progress
warning points at it. Each must load, name its run after its file, and build its env."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest

from zmqrl.config import load_config

ZOO = Path(__file__).resolve().parents[1] / "configs" / "zoo"
TASKS = {
    "CartPole-v1": "dqn",
    "Acrobot-v1": "dqn",
    "MountainCar-v0": "dqn",
    "MountainCarContinuous-v0": "sac",
    "Pendulum-v1": "sac",
    "HalfCheetah-v5": "sac",
    "Hopper-v5": "sac",
    "Walker2d-v5": "sac",
    "Ant-v5": "sac",
}
CONFIGS = sorted(ZOO.glob("*.yaml"))


def test_the_zoo_has_exactly_one_config_per_task_and_nothing_else() -> None:
    ids = Counter(load_config(path).env.id for path in CONFIGS)
    assert ids == Counter(list(TASKS)), "one config per task in TASKS (add the task here with its config)"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_zoo_config_names_its_algorithm_and_builds_its_env(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.run.name == path.stem and cfg.agent.kind == TASKS[cfg.env.id]
    assert path.stem.endswith("_" + cfg.agent.kind)
    env = gym.make(cfg.env.id, **cfg.env.kwargs)
    try:
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
    finally:
        env.close()
