"""APPO through the whole system: solved in serial mode, resumed from its checkpoint, run as processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import pytest

import zmqrl
from tests.conftest import tiny_overrides
from zmqrl.agents.configs import APPOConfig
from zmqrl.checkpoints.files import load_checkpoint
from zmqrl.learner.stopping import ENDED_TARGET_HELD

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cartpole_appo.yaml"


def appo(run_root: Path, **extra: object) -> zmqrl.Config:
    """configs/cartpole_appo.yaml, in ``run_root``, with the fast settings of the other run tests
    that apply to it (no replay-agent keys)."""
    items = [
        item
        for item in tiny_overrides(run_root)
        if not item.startswith(("agent.", "replay.", "learner.min_replay_size", "learner.sync_interval"))
    ]
    items += [f"{key.replace('__', '.')}={value}" for key, value in extra.items()]
    return zmqrl.load_config(CONFIG, items)


def test_serial_appo_solves_cartpole_and_its_policy_plays(run_root: Path) -> None:
    cfg = appo(
        run_root,
        learner__max_updates=250,
        learner__eval_interval=10,
        learner__eval_episodes=10,
        learner__target_return=475,
        learner__target_hold=2,
        learner__stop_at_target="true",
        actor__num_actors=2,
        actor__max_steps_per_s="null",
    )
    result = zmqrl.train(cfg, mode="serial")
    assert result.state == "finished"
    assert result.learner["ended"] == ENDED_TARGET_HELD, result.eval_history
    assert result.eval_history[-1]["mean"] >= 475
    assert result.updates < 250
    # Every env step an actor took went through the queue: rollouts are trained on once each.
    assert result.learner["samples"] == sum(a["steps"] for a in result.actors)
    assert result.learner["updates"] * cfg.agent.batch_size <= result.learner["samples"]
    policy = zmqrl.load_policy(result.run_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(policy.act(obs)))
        total += float(reward)
        done = terminated or truncated
    env.close()
    assert total >= 400


def test_a_resumed_appo_learner_continues_from_its_checkpoint(run_root: Path) -> None:
    first = zmqrl.train(
        appo(run_root, learner__max_updates=20, learner__checkpoint_interval=10, learner__eval_interval=0),
        mode="serial",
    )
    assert first.updates == 20
    more = appo(run_root, learner__max_updates=30, learner__eval_interval=0)
    resumed = zmqrl.train(more, mode="serial", resume=True)
    assert resumed.learner["resumed_from"]["updates"] == 20
    assert resumed.updates == 30
    # The optimiser's state came back with the networks: Adam's step count went on from 20 updates.
    state = load_checkpoint(resumed.run_dir / "checkpoints" / "latest")
    steps = [s["step"] for s in state["agent"]["optimizer"]["state"].values()]
    assert steps and all(float(step) == 30 * cfg_steps_per_update(more) for step in steps)


def cfg_steps_per_update(cfg: zmqrl.Config) -> int:
    agent = cfg.agent
    assert isinstance(agent, APPOConfig)
    return agent.epochs * agent.minibatches


@pytest.mark.slow
def test_appo_runs_as_processes_with_the_queue_between_actors_and_learner(run_root: Path) -> None:
    cfg = appo(
        run_root,
        learner__max_updates=40,
        actor__num_actors=2,
        evaluator__enabled="true",
        evaluator__episodes=2,
        evaluator__interval_seconds=0.5,
    )
    result = zmqrl.train(cfg, mode="processes")
    assert result.state == "finished" and result.exit_code == 0 and result.updates == 40
    stats = json.loads((result.run_dir / "stats.json").read_text())
    learner = stats["learner"]
    assert learner["samples"] >= 40 * cfg.agent.batch_size
    assert learner["bad_messages"] == 0
    assert all(row["samples"] > 0 for row in stats["actors"]), stats["actors"]
    # The evaluator process scored the published APPO weights (its numpy policy acts greedily).
    evaluator = stats["evaluator"]
    assert evaluator["evaluations"] >= 1, evaluator
    assert all(math.isfinite(e["mean"]) for e in evaluator["eval_history"])
    assert evaluator["evaluated_version"] == learner["weights_version"]


def test_serial_appo_is_deterministic_for_a_seed(run_root: Path) -> None:
    results = []
    for name in ("a", "b"):
        cfg = appo(run_root / name, learner__max_updates=12, learner__eval_interval=6, actor__num_actors=2)
        results.append(zmqrl.train(cfg, mode="serial"))
    first, second = results
    assert [e["mean"] for e in first.eval_history] == [e["mean"] for e in second.eval_history]
    weights = [load_checkpoint(r.run_dir / "checkpoints" / "latest")["agent"] for r in results]
    for name, tensor in weights[0]["policy"].items():
        assert (tensor == weights[1]["policy"][name]).all(), name
