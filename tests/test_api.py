"""The Python API: load_config, train (serial and processes), load_policy, and their errors."""

from __future__ import annotations

import io
import math
import signal
import socket
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import zmqrl
from tests.conftest import tiny_overrides
from zmqrl.config import EnvConfig, LearnerConfig
from zmqrl.transport.sockets import BindError


def overrides(run_root: Path, **extra: object) -> list[str]:
    """A small fast run, as the `section.key=value` items the API also takes."""
    return tiny_overrides(run_root, **extra)


def test_load_config_takes_a_mapping_or_set_items_and_names_bad_keys(tmp_path: Path) -> None:
    cfg = zmqrl.load_config(
        "configs/cartpole_dqn.yaml", overrides={"learner.max_updates": 77, "agent.lr": 0.01}
    )
    assert cfg.learner.max_updates == 77 and cfg.agent.lr == 0.01
    assert zmqrl.load_config(None, ["actor.num_actors=3"]).actor.num_actors == 3
    with pytest.raises(zmqrl.ConfigError, match=r"learner\.max_updatez"):
        zmqrl.load_config("configs/cartpole_dqn.yaml", overrides={"learner.max_updatez": 1})


def test_a_config_built_in_code_is_checked_like_a_file() -> None:
    cfg = zmqrl.Config(env=EnvConfig(id="CartPole-v1"), learner=LearnerConfig(max_updates=10))
    assert zmqrl.validate(cfg).learner.max_updates == 10
    with pytest.raises(zmqrl.ConfigError, match=r"learner\.sync_interval"):
        zmqrl.validate(replace(cfg, learner=LearnerConfig(sync_interval=0)))


def test_train_serially_returns_the_stats_and_the_policy_acts(run_root: Path) -> None:
    cfg = zmqrl.load_config(None, overrides(run_root, learner__max_updates=200, learner__eval_interval=100))
    result = zmqrl.train(cfg, mode="serial")
    assert isinstance(result, zmqrl.TrainResult)
    assert result.mode == "serial" and result.state == "finished" and result.updates == 200
    assert result.run_dir == cfg.run_dir and (result.run_dir / "stats.json").is_file()
    assert [e["updates"] for e in result.eval_history] == [100, 200]
    assert math.isfinite(result.final_eval) and len(result.actors) == 1
    policy = zmqrl.load_policy(result.run_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert env.action_space.contains(int(action))
    assert policy.act(np.stack([obs, obs])).shape == (2,)
    assert policy.weights_version > 0 and policy.path.name == "latest"
    env.close()


def test_a_serial_run_ends_when_every_actor_reached_its_max_steps(run_root: Path) -> None:
    """No data would come any more (a replay ratio would wait for it forever): the run ends, with
    its reason, as a launched run does when the supervisor asks."""
    cfg = zmqrl.load_config(
        None,
        overrides(
            run_root,
            actor__num_actors=2,
            actor__max_steps=600,
            learner__max_updates=10**6,
            learner__samples_per_insert=1.0,
            learner__eval_interval=0,
        ),
    )
    result = zmqrl.train(cfg, mode="serial")
    assert result.state == "finished" and result.ended == "actor max_steps"
    steps = [row["steps"] for row in result.actors]
    assert len(steps) == 2 and all(600 <= n < 600 + cfg.actor.send_batch for n in steps), steps
    assert 0 < result.updates < 10**6


def test_train_never_mixes_a_new_run_into_a_finished_one(run_root: Path) -> None:
    cfg = zmqrl.load_config(None, overrides(run_root, learner__max_updates=50, learner__eval_interval=0))
    first = zmqrl.train(cfg, mode="serial")
    second = zmqrl.train(cfg, mode="serial")
    assert second.run_dir == first.run_dir.with_name(first.run_dir.name + "-2")


def test_train_in_processes_runs_what_launch_runs(run_root: Path) -> None:
    cfg = zmqrl.load_config(None, overrides(run_root, actor__num_actors=2))
    out = io.StringIO()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = zmqrl.train(cfg, mode="processes", out=out)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers, (
        "handlers restored"
    )
    assert result.mode == "processes" and result.state == "finished" and result.exit_code == 0
    assert result.updates == 300 and len(result.actors) == 2
    assert all(row["steps"] > 0 for row in result.actors)
    assert result.eval_history and (result.run_dir / "logs").is_dir()
    assert "learner" in out.getvalue()


def test_a_failed_run_raises_training_failed_with_the_partial_result(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The learner's insert fails on its second batch; with no restarts allowed the run fails.
    monkeypatch.setenv("ZMQRL_TEST_HOOKS", f"ingest_fault_once={tmp_path / 'fired'}")
    cfg = zmqrl.load_config(None, overrides(run_root, supervisor__max_restarts=0))
    with pytest.raises(zmqrl.TrainingFailed, match="logs") as failure:
        zmqrl.train(cfg, mode="processes", out=io.StringIO())
    assert failure.value.result.run_dir == cfg.run_dir
    assert failure.value.result.exit_code != 0


def test_what_launch_refuses_before_starting_anything_train_raises(run_root: Path) -> None:
    """As `zmqrl launch`, train() checks the env, the device and the learner's ports first: one
    error naming what to change, and no run directory or process made."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    with held, pytest.raises(BindError, match=f"port {port}.*transport.samples"):
        zmqrl.train(
            zmqrl.load_config(None, overrides(run_root, transport__samples=f"tcp://127.0.0.1:{port}"))
        )
    with pytest.raises(zmqrl.ConfigError, match="CartPole-v9"):
        zmqrl.train(zmqrl.load_config(None, overrides(run_root, env__id="CartPole-v9")))
    assert not (run_root / "t").exists()
    run_root.mkdir(parents=True, exist_ok=True)
    (run_root / "afile").write_text("")
    for mode in ("processes", "serial"):
        with pytest.raises(zmqrl.ConfigError, match=r"run\.dir: cannot make .*afile is a file"):
            zmqrl.train(zmqrl.load_config(None, overrides(run_root / "afile")), mode=mode)  # type: ignore[arg-type]


def test_a_learner_that_cannot_start_fails_the_run_with_its_reason(run_root: Path) -> None:
    """A failure the checks cannot see (an ipc path whose directory is missing): the learner's own
    error is in TrainingFailed's message, not only in its log."""
    endpoint = f"ipc://{run_root}/no-such-dir/samples"
    cfg = zmqrl.load_config(
        None, overrides(run_root, transport__samples=endpoint, supervisor__max_restarts=0)
    )
    with pytest.raises(zmqrl.TrainingFailed) as failure:
        zmqrl.train(cfg, out=io.StringIO())
    message = str(failure.value)
    assert "the learner exited with code 1 before it was ready: cannot bind samples on" in message
    assert endpoint in message and "error: error:" not in message
    assert failure.value.result.failure in message and failure.value.result.state == "failed"


def test_unknown_mode_and_missing_checkpoint_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(zmqrl.ConfigError, match="processes, serial"):
        zmqrl.train(zmqrl.Config(), mode="threads")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="train first"):
        zmqrl.load_policy(tmp_path)
