"""Checkpoints: atomic writes, safe loading, and `zmqrl eval` on what a run leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.agents import make_learner
from zmqrl.checkpoints.files import load_checkpoint, save_checkpoint
from zmqrl.checkpoints.policy import checkpoint_path
from zmqrl.config import Config, load_config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.evaluator.greedy import evaluate_checkpoint


def saved_agent(path: Path, cfg: Config | None = None) -> None:
    cfg = cfg or load_config(None, ["agent.hidden_sizes=[16]"])
    env = make_env(cfg.env)
    agent = make_learner(cfg.agent, sample_spec(env), seed=0)
    save_checkpoint(path, {"agent": agent.state_dict(), "config": cfg.to_dict(), "counters": {"updates": 0}})


def test_checkpoint_round_trip_without_leftover_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "latest"
    saved_agent(path)
    payload = load_checkpoint(path)
    assert payload["counters"] == {"updates": 0} and payload["config"]["env"]["id"] == "CartPole-v1"
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest"]


def test_overwriting_a_checkpoint_replaces_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "best"
    save_checkpoint(path, {"x": torch.zeros(3)})
    save_checkpoint(path, {"x": torch.ones(3)})
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(3))


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04 truncated zip"])
def test_corrupt_or_foreign_files_are_refused_with_one_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a readable zmqrl checkpoint"):
        load_checkpoint(path)


def test_truncated_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latest"
    saved_agent(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable zmqrl checkpoint"):
        load_checkpoint(path)


def test_a_plain_torch_file_is_not_a_zmqrl_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not a zmqrl checkpoint"):
        load_checkpoint(path)


def test_evaluate_checkpoint_plays_greedy_episodes_from_the_stored_config(tmp_path: Path) -> None:
    path = tmp_path / "best"
    saved_agent(path)
    result = evaluate_checkpoint(path, episodes=3, seed=5, overrides=["env.max_episode_steps=20"])
    assert len(result.returns) == 3 and max(result.lengths) <= 20
    assert np.isclose(result.mean, np.mean(result.returns))


def zmqrl_eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmqrl", "eval", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_zmqrl_eval_prints_mean_and_std_and_refuses_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "best"
    saved_agent(path)
    ok = zmqrl_eval(str(path), "--episodes", "2")
    assert ok.returncode == 0, ok.stderr
    assert "mean return" in ok.stdout and "± " in ok.stdout and "over 2 episodes" in ok.stdout
    (tmp_path / "junk").write_bytes(b"junk")
    bad = zmqrl_eval(str(tmp_path / "junk"))
    assert bad.returncode == 1 and bad.stderr.startswith("error:") and len(bad.stderr.splitlines()) == 1
    missing = zmqrl_eval(str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such checkpoint" in missing.stderr


def test_zmqrl_eval_of_a_run_directory_plays_its_latest(tmp_path: Path) -> None:
    """As `zmqrl export` and zmqrl.load_policy take it: the directory a run's summary names."""
    run = tmp_path / "runs" / "cartpole"
    saved_agent(run / "checkpoints" / "latest")
    ok = zmqrl_eval(str(run), "--episodes", "1")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"{run / 'checkpoints' / 'latest'}: mean return"), ok.stdout
    latest = run / "checkpoints" / "latest"
    assert checkpoint_path(run) == checkpoint_path(run / "checkpoints") == checkpoint_path(latest) == latest
    empty = zmqrl_eval(str(tmp_path / "runs"), "--episodes", "1")  # no checkpoint there
    assert empty.returncode == 2 and "no such checkpoint" in empty.stderr, empty.stderr
