"""Logs: one line a record, naming the process (role and id, as its log file is named); `--log-level`
reaches every process `launch` starts; a crashed process's last lines and its log's path are shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

REPO = Path(__file__).resolve().parents[1]
# `2026-12-01 14:03:07.512 INFO actor-3 zmqrl.actor: message`
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (zmqrl[\w.]*): "
)
CRASH = "actor crash injected by tests/test_logging.py"


class _CrashOnStep(gym.Wrapper[Any, Any, Any, Any]):
    def step(self, action: Any) -> Any:
        raise RuntimeError(CRASH)


def crashing_in_actors() -> gym.Env[Any, Any]:
    """CartPole, except in an actor process (``python -m zmqrl actor ...``), whose first step raises:
    a bug in the actor's code as the supervisor sees it. The learner and `launch` build it fine."""
    env = gym.make("CartPole-v1")
    return _CrashOnStep(env) if sys.argv[1:2] == ["actor"] else env


def records(path: Path) -> list[tuple[str, str, str]]:
    """``(level, label, logger)`` of each record line of a log (tracebacks and prints left out)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = RECORD.match(line)
        if match:
            found.append((match.group(1), match.group(2), match.group(3)))
    return found


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_a_record_is_one_line_with_time_level_process_and_module() -> None:
    code = (
        "import logging\nfrom zmqrl.cli.process import setup_logging\nsetup_logging('info', 'actor-3')\n"
        "logging.getLogger('zmqrl.actor').info('up')\nlogging.getLogger('zmqrl.actor').debug('hidden')\n"
    )
    lines = run_python(code).stderr.splitlines()
    assert len(lines) == 1, lines
    assert RECORD.match(lines[0]) and lines[0].endswith(" INFO actor-3 zmqrl.actor: up"), lines


def test_setting_up_again_relabels_instead_of_doubling_lines_and_debug_says_who_started() -> None:
    """The actor relabels itself once its id is settled (``--id auto``)."""
    code = (
        "import logging\nfrom zmqrl.cli.process import setup_logging\nsetup_logging('debug', 'actor')\n"
        "setup_logging('debug', 'actor-7')\nlogging.getLogger('zmqrl.actor').warning('once')\n"
    )
    lines = [line.split(" ", 2)[2] for line in run_python(code, "--id", "auto").stderr.splitlines()]
    assert len(lines) == 3, lines
    assert re.fullmatch(r"DEBUG actor zmqrl: pid \d+: zmqrl --id auto \(log level debug\)", lines[0])
    assert re.fullmatch(r"DEBUG actor-7 zmqrl: pid \d+: zmqrl --id auto \(log level debug\)", lines[1])
    assert lines[2] == "WARNING actor-7 zmqrl.actor: once"


def test_a_program_that_configured_logging_itself_keeps_its_handlers() -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr, format='mine %(message)s', level='INFO')\n"
        "from zmqrl.cli.process import setup_logging\nsetup_logging('debug', 'learner-0')\n"
        "logging.getLogger('zmqrl').info('hello')\n"
    )
    assert run_python(code).stderr.splitlines() == ["mine hello"]


@pytest.mark.slow
@pytest.mark.heavy  # a real launch: kept out of the ~10-minute default suite
def test_launch_logs_each_process_to_its_file_passes_on_the_level_and_shows_a_crash(run_root: Path) -> None:
    """run_root (tests/conftest.py) kills whatever a timed-out launch leaves behind."""
    from tests.conftest import tiny_overrides

    run_dir = run_root / "t"
    overrides = tiny_overrides(
        run_root,
        env__id="tests.test_logging:crashing_in_actors",
        learner__max_updates=100_000,
        supervisor__max_restarts=0,  # the actor's crash at start is a crash loop at once: given up
    )
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml"), "--plain"]
    cmd += ["--log-level", "debug", *(arg for item in overrides for arg in ("--set", item))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    logs = run_dir / "logs"
    assert "log_level: debug" in (run_dir / "config.yaml").read_text()  # how the children got it

    learner = records(logs / "learner-0.log")
    assert {label for _, label, _ in learner} == {"learner-0"}, learner
    assert ("INFO", "learner-0", "zmqrl.learner") in learner
    assert ("DEBUG", "learner-0", "zmqrl") in learner  # --log-level debug reached the child
    actor = records(logs / "actor-0.log")
    assert ("DEBUG", "actor-0", "zmqrl") in actor and ("INFO", "actor-0", "zmqrl.actor") in actor
    assert CRASH in (logs / "actor-0.log").read_text()

    # The supervisor's console: the crashed actor's last lines under its log's full path.
    lines = out.splitlines()
    heading = f"last lines of {logs / 'actor-0.log'}:"
    starts = [i for i, line in enumerate(lines) if line.endswith(heading)]
    assert starts, out
    tail = lines[starts[0] + 1 : starts[0] + 16]
    assert any(line.startswith("    ") and f"RuntimeError: {CRASH}" in line for line in tail), out
    assert any(str(logs / "actor-0.log") in line and "crash loop" in line for line in lines), out


def test_log_level_on_a_role_started_by_hand_overrides_the_config(tmp_path: Path) -> None:
    """`zmqrl learner --log-level warning` keeps its INFO records (replay size, device) out; the
    learner stops at once here, on a port in use."""
    import socket

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    sets = {
        "run.dir": tmp_path,
        "run.log_level": "info",
        "transport.samples": f"tcp://127.0.0.1:{squatter.getsockname()[1]}",
        "transport.heartbeat": f"ipc://{tmp_path}/hb",
        "transport.control": f"ipc://{tmp_path}/ctl",
    }
    args = ["learner", str(REPO / "configs" / "cartpole_dqn.yaml"), "--log-level", "warning"]
    args += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zmqrl", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        squatter.close()
    assert result.returncode == 1 and result.stderr.splitlines()[-1].startswith("error: cannot bind samples")
    assert " INFO learner-0 " not in result.stderr, result.stderr
