"""Serial mode: one thread, no sockets, the launched run's components, and bit-identical repeats."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.conftest import tiny_config, tiny_overrides
from zmqrl.config import Config, load_config
from zmqrl.serial import run_serial


class RecordingLogger:
    """Keeps every scalar, and the threads alive whenever one is written."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, int, float]] = []
        self.threads: set[str] = set()

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, step, float(value)))
        self.threads.update(t.name for t in threading.enumerate())

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def serial_config(run_dir: Path, **extra: object) -> Config:
    values: dict[str, object] = {
        "actor__num_actors": 2,
        "learner__max_updates": 240,
        "learner__eval_interval": 80,
        "learner__log_interval": 20,
        "learner__checkpoint_interval": 100,
    }
    values.update(extra)
    return tiny_config(run_dir, **values)


def losses(logger: RecordingLogger) -> list[tuple[str, int, float]]:
    return [s for s in logger.scalars if s[0].startswith(("losses/", "charts/"))]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"learner__samples_per_insert": 4.0, "learner__samples_per_insert_tolerance": 64},
        {"replay__prioritized": True, "actor__envs_per_actor": 2},
    ],
    ids=["one-update-per-batch", "replay-ratio", "prioritized-vector-actors"],
)
def test_two_serial_runs_with_one_seed_give_bit_identical_losses_and_eval_returns(
    tmp_path: Path, extra: dict[str, Any]
) -> None:
    runs = []
    for name in ("a", "b"):
        logger = RecordingLogger()
        stats = run_serial(serial_config(tmp_path / name, **extra), logger=logger)
        runs.append((stats, logger))
    (first, log_a), (second, log_b) = runs
    assert first["learner"]["state"] == "finished" and first["learner"]["updates"] == 240
    history_a = [(e["updates"], e["samples"], e["mean"], e["std"]) for e in first["learner"]["eval_history"]]
    history_b = [(e["updates"], e["samples"], e["mean"], e["std"]) for e in second["learner"]["eval_history"]]
    assert len(history_a) == 3 and history_a == history_b
    assert losses(log_a) and losses(log_a) == losses(log_b), "every loss and episode return, bit for bit"
    assert [a["steps"] for a in first["actors"]] == [a["steps"] for a in second["actors"]]


def test_a_different_seed_gives_a_different_run(tmp_path: Path) -> None:
    a, b = RecordingLogger(), RecordingLogger()
    run_serial(serial_config(tmp_path / "a"), logger=a)
    run_serial(serial_config(tmp_path / "b", run__seed=1), logger=b)
    assert losses(a) != losses(b)


def test_serial_mode_runs_in_one_thread_without_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sockets(*args: object, **kwargs: object) -> None:
        raise AssertionError("serial mode opened a ZeroMQ context")

    monkeypatch.setattr(zmq.Context, "__init__", no_sockets)
    before = {t.name for t in threading.enumerate()}  # e.g. what earlier tests left in this process
    logger = RecordingLogger()
    stats = run_serial(serial_config(tmp_path), logger=logger)
    assert stats["learner"]["state"] == "finished"
    assert logger.threads <= before, f"serial mode started threads: {logger.threads - before}"


def test_serial_mode_uses_the_learners_components_end_to_end(tmp_path: Path) -> None:
    """Weights go through the wire to every actor, batches through the wire into replay, and the
    learner's reports, stats file and checkpoints are those of a launched run."""
    cfg = serial_config(tmp_path)
    stats = run_serial(cfg, logger=RecordingLogger())
    learner, actors = stats["learner"], stats["actors"]
    assert learner["weights_version"] > 1
    assert all(a["weights_loaded"] > 1 and a["weights_version"] > 1 for a in actors)
    assert learner["samples"] == sum(a["samples"] for a in actors)
    assert learner["lost_batches"] == 0 and set(learner["per_actor"]) == {0, 1}
    assert (cfg.run_dir / "learner-stats.json").is_file()
    assert (cfg.run_dir / "checkpoints" / "latest").is_file()


def test_serial_replay_ratio_is_held(tmp_path: Path) -> None:
    stats = run_serial(
        serial_config(tmp_path, learner__samples_per_insert=2.0, learner__samples_per_insert_tolerance=64),
        logger=RecordingLogger(),
    )
    learner = stats["learner"]
    sampled = learner["updates"] * 32
    inserted = learner["samples"] - 200  # the ratio counts from min_replay_size
    assert np.isclose(sampled / inserted, 2.0, rtol=0.2), (sampled, inserted)


def test_serial_mode_trains_dqn_on_a_factory_env_to_its_optimum(tmp_path: Path) -> None:
    """The example env of the test package, by import path, with one-hot Discrete observations."""
    cfg = serial_config(
        tmp_path,
        env__id="tests.example_envs:make_env",
        env__kwargs="{length: 6}",
        actor__num_actors=1,
        learner__max_updates=600,
        learner__min_replay_size=100,
        learner__eval_interval=200,
        agent__lr=0.001,
        agent__target_update_interval=50,
    )
    stats = run_serial(cfg, logger=RecordingLogger())
    assert stats["learner"]["eval_history"][-1]["mean"] == -5.0  # straight to the goal: 5 steps of -1


def test_an_agent_registered_in_code_trains_in_serial_mode(tmp_path: Path) -> None:
    """In-code registration reaches only this process: exactly what serial mode runs in."""
    from tests.plugins.linear_q import PLUGIN
    from zmqrl.agents.registry import AgentPlugin, register_agent, unregister_agent

    register_agent(
        AgentPlugin(
            name="my_linear_q", config_class=_renamed(PLUGIN.config_class), make_learner=PLUGIN.make_learner
        )
    )
    try:
        items = tiny_overrides(
            tmp_path,
            env__max_episode_steps=50,
            learner__max_updates=150,
            learner__min_replay_size=100,
            replay__prioritized="true",
        )
        agent = ["agent.kind=my_linear_q", "agent.batch_size=16"]
        cfg = load_config(None, [i for i in items if not i.startswith("agent.")] + agent)
        stats = run_serial(cfg, logger=RecordingLogger())
    finally:
        unregister_agent("my_linear_q")
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["updates"] == 150 and learner["eval_history"]
    assert all(a["weights_version"] > 1 for a in stats["actors"])


def _renamed(config_class: type) -> type:
    """The plugin's config class under another kind name (a plugin's kind defaults to its name)."""
    import dataclasses

    return dataclasses.make_dataclass(
        "MyLinearQConfig", [("kind", str, dataclasses.field(default="my_linear_q"))], bases=(config_class,)
    )
