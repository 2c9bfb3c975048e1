"""Shared fixtures: tiny fast configs, free loopback ports, and a check for leftover processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import zmq

from zmqrl.config import Config, load_config

# Every socket a test opens asks the OS for a free port on loopback.
ANY_PORT = "tcp://127.0.0.1:0"
# The repository root: where `python -m zmqrl` finds the test package's modules.
REPO = Path(__file__).resolve().parent.parent

torch.set_num_threads(1)


def tiny_overrides(run_dir: Path, **extra: object) -> list[str]:
    """Overrides for a run that trains a small DQN on CartPole for a few seconds."""
    values: dict[str, object] = {
        "run.dir": str(run_dir),
        "run.name": "t",
        "agent.hidden_sizes": "[32, 32]",
        "agent.batch_size": 32,
        "replay.capacity": 5000,
        "learner.max_updates": 300,
        "learner.min_replay_size": 200,
        "learner.sync_interval": 20,
        "learner.eval_interval": 150,
        "learner.eval_episodes": 2,
        "learner.progress_seconds": 1.0,
        "learner.republish_seconds": 0.2,
        "actor.num_actors": 1,
        "actor.send_batch": 16,
        # In-process tests share one GIL: an uncapped actor thread would starve the learner's.
        "actor.max_steps_per_s": 2000,
        "supervisor.heartbeat_interval": 0.2,
        "supervisor.progress_seconds": 1.0,
        "supervisor.stop_grace": 5.0,
        "transport.samples": ANY_PORT,
        "transport.weights": ANY_PORT,
        "transport.heartbeat": ANY_PORT,
        "transport.control": ANY_PORT,
        "supervisor.metrics_http": "127.0.0.1:0",  # tests run side by side: never the default port
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


def launch_to_the_end(
    config: Path, overrides: list[str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m zmqrl launch CONFIG --set ...`` from the repository root, run to its end.

    cwd: ``python -m zmqrl`` puts the working directory on sys.path, in the launch and in every
    process it starts, so modules of the test package (example envs, plugin agents) import there
    (a timeout leaves the run_root fixture to kill what is left)."""
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def tiny_config(run_dir: Path, **extra: object) -> Config:
    return load_config(None, tiny_overrides(run_dir, **extra))


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


@pytest.fixture
def run_root(tmp_path: Path) -> Iterator[Path]:
    """Where a test's runs go. At teardown, anything still running from there is SIGKILLed (even
    stopped processes), so a failing test cannot leave processes behind for the next one."""
    root = tmp_path / "runs"
    yield root
    for pid, _ in processes_mentioning(str(root)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context per test, destroyed without lingering so no socket outlives the test."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)
