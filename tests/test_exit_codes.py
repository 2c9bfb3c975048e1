"""Exit codes of the role commands: the user's settings exit 2 with one line, zmqrl's bugs exit 1
with a traceback, wherever either happens (building the role or inside its run())."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests import run_state
from zmqrl.agents import make_learner
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.errors import ConfigError
from zmqrl.spec import SampleSpec

CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32")

# Runs the real CLI after replacing one function, to stand in for a bug in zmqrl's own code.
INJECT_BUG = """
import sys
import zmqrl.learner.trainer as trainer
import zmqrl.learner.main as learner

def broken(*args, **kwargs):
    raise ValueError("injected bug")

setattr(learner.Learner if sys.argv[1] == "__init__" else trainer, sys.argv[1], broken)
from zmqrl.cli.app import main

sys.argv = ["zmqrl", *sys.argv[2:]]
main()
"""


def role_args(tmp_path: Path, role: str, *overrides: str) -> list[str]:
    """A role command that needs no other process: nothing listens on heartbeat and control."""
    config = tmp_path / "run.yaml"
    config.write_text("")
    sets = [
        f"run.dir={tmp_path}",
        "run.name=t",
        "transport.samples=tcp://127.0.0.1:0",
        "transport.weights=tcp://127.0.0.1:0",
        f"transport.heartbeat=ipc://{tmp_path}/heartbeat",
        f"transport.control=ipc://{tmp_path}/control",
        *overrides,
    ]
    return [role, str(config), *(arg for item in sets for arg in ("--set", item))]


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- make_learner's contract


def test_make_agent_reports_settings_that_cannot_work_here_as_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"agent.torso 'nature_cnn' needs image observations"):
        make_learner(DQNConfig(torso="nature_cnn"), CARTPOLE)
    with pytest.raises(ConfigError, match=r"larger frames than 20x20"):
        make_learner(
            DQNConfig(torso="nature_cnn"),
            SampleSpec((4, 20, 20), "uint8", (), "int64", num_actions=6),
        )
    with pytest.raises(ConfigError, match="needs a Discrete action space"):
        make_learner(DQNConfig(), PENDULUM)
    with pytest.raises(ConfigError, match="needs a continuous"):
        make_learner(SACConfig(), CARTPOLE)
    with pytest.raises(ConfigError, match="finite action bounds"):
        make_learner(SACConfig(), replace(PENDULUM, action_low=-np.inf, action_high=1.0))
    with pytest.raises(ConfigError, match=r"agent.gamma"):
        make_learner(DQNConfig(gamma=2.0), CARTPOLE)


def test_make_agent_leaves_a_callers_mistake_a_plain_value_error() -> None:
    mismatched = DQNConfig()
    mismatched.kind = "sac"  # only code can build this pair; the config loader never does
    with pytest.raises(ValueError) as info:
        make_learner(mismatched, PENDULUM)
    assert not isinstance(info.value, ConfigError)


# -------------------------------------------------------------------------------- the real CLI


@pytest.mark.parametrize("role", ["learner", "actor"])
def test_a_setting_that_fails_only_when_the_agent_is_built_exits_2_with_one_line(
    tmp_path: Path, role: str
) -> None:
    result = run([sys.executable, "-m", "zmqrl", *role_args(tmp_path, role, "agent.torso=nature_cnn")])
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        "error: agent.torso 'nature_cnn' needs image observations (C, H, W); this env's observations "
        "have shape (4,): use agent.torso 'mlp', or env.preprocess 'atari'"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("where", ["__init__", "make_learner"])
def test_a_value_error_from_zmqrls_own_code_exits_1_with_a_traceback(tmp_path: Path, where: str) -> None:
    result = run([sys.executable, "-c", INJECT_BUG, where, *role_args(tmp_path, "learner")])
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "ValueError: injected bug" in result.stderr
    assert error_lines(result.stderr) == []


# --------------------------------------------------------------------------- actors without torch

ACTOR_WITHOUT_TORCH = """
import sys
from zmqrl.cli.app import main

sys.argv = ["zmqrl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("exit", code, "torch modules", len(loaded))
"""


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_an_mlp_actor_process_acts_without_importing_torch(tmp_path: Path, kind: str) -> None:
    """The acting side of the built-in agents with an MLP is numpy: an actor process starts in a
    fraction of the time torch's import takes (it never sends here: nothing listens)."""
    env = "CartPole-v1" if kind == "dqn" else "Pendulum-v1"
    args = role_args(
        tmp_path, "actor", f"agent.kind={kind}", f"env.id={env}", "actor.max_steps=40", "actor.send_batch=64"
    )
    result = run([sys.executable, "-c", ACTOR_WITHOUT_TORCH, *args, "--id", "0"])
    assert result.stdout.strip().splitlines()[-1] == "exit 0 torch modules 0", result.stdout + result.stderr


# --------------------------------------------------------------------------- stopped by a signal


def test_a_role_stopped_by_sigterm_from_outside_exits_143_not_0(tmp_path: Path) -> None:
    """Issue 23 item 6: exit 0 means finished or stopped on request; a role that an operator or
    the OOM killer's SIGTERM stopped (cleanly) exits 128 + 15, so a supervisor restarts it."""
    args = role_args(tmp_path, "actor", "actor.max_steps=100000000", "transport.connect_timeout=null")
    log_path = tmp_path / "actor.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    health = tmp_path / "actor-health.json"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zmqrl", *args, "--id", "0"],
            stdout=out,
            stderr=out,
            env=run_state.with_health_file(health, env),
        )
    try:
        run_state.wait_until_role_up(health, 60, proc)  # past start-up: its main loop runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SIGTERM: stopping cleanly" in log_path.read_text()
