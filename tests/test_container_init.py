"""zmqrl.cli.container_init, the image's pid 1, with plain child processes standing in for roles:
it passes on the role's exit code and stop signals, and ends a role that stopped beating (SIGSTOP)
with exit 3, so that a container engine's `restart: on-failure` replaces it. docker/compose.yaml's
real run of it is tests/test_compose.py."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from zmqrl.cli.container_init import (
    CHECK_SECONDS,
    DEAD_FACTOR,
    EXIT_HUNG,
    EXIT_NOT_FOUND,
    POLL_SECONDS,
    stale_verdict,
)
from zmqrl.runtime.health import HealthRecord, write_health

# A stand-in role: beats into $ZMQRL_HEALTH_FILE every 0.05 s (heartbeat_timeout 0.3 s), runs
# the body given, and writes its last state.
ROLE = """
import os, sys, threading, time
from pathlib import Path
from zmqrl.runtime.health import HealthRecord, health_clock, write_health
path = Path(os.environ["ZMQRL_HEALTH_FILE"])
state = ["running"]
def beat():
    now, clock = time.time(), health_clock()
    record = HealthRecord("actor", 7, os.getpid(), state[0], now, 1, now, 0.3, 60.0, progress_clock=clock)
    write_health(path, record)
def beats():
    while state[0] == "running":
        beat()
        time.sleep(0.05)
beating = threading.Thread(target=beats, daemon=True)
beating.start()
def final(last):  # the role's last state, written once its beating thread has stopped
    state[0] = last
    beating.join()
    beat()
"""


def start_init(run_root: Path, body: str) -> tuple[subprocess.Popen[bytes], Path]:
    run_root.mkdir(parents=True, exist_ok=True)
    health = run_root / "health.json"
    script = run_root / "role.py"
    script.write_text(ROLE + textwrap.dedent(body))
    env = {**os.environ, "ZMQRL_HEALTH_FILE": str(health)}
    cmd = [sys.executable, "-m", "zmqrl.cli.container_init", sys.executable, str(script)]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE), health


def child_of(init: subprocess.Popen[bytes]) -> int:
    found: list[int] = []

    def spawned() -> bool:
        children = Path(f"/proc/{init.pid}/task/{init.pid}/children").read_text().split()
        found[:] = [int(c) for c in children]
        return bool(found)

    wait_until(spawned, 30, "the init to start its child")
    return found[0]


def test_a_stopped_role_is_killed_and_the_init_exits_3(run_root: Path) -> None:
    init, health = start_init(run_root, "time.sleep(60)\n")
    try:
        wait_until(health.exists, 30, "the first beat")
        role = child_of(init)
        stopped_at = time.monotonic()
        os.kill(role, signal.SIGSTOP)  # its beating thread stops with it: no watchdog can act
        assert init.wait(timeout=30) == EXIT_HUNG
        took = time.monotonic() - stopped_at
        # 2 x heartbeat_timeout (0.6 s), judged once a second.
        assert took < 10, f"replaced after {took:.1f} s"
        assert not Path(f"/proc/{role}").exists() or "Z" in Path(f"/proc/{role}/stat").read_text().split()[2]
        assert init.stderr is not None
        assert b"has not beaten" in init.stderr.read()
    finally:
        init.kill()
        init.wait()


def test_the_role_exit_code_and_signal_deaths_pass_through(run_root: Path) -> None:
    init, _ = start_init(run_root, "final('finished'); sys.exit(5)\n")
    assert init.wait(timeout=30) == 5
    init, _ = start_init(run_root, "time.sleep(60)\n")
    try:
        os.kill(child_of(init), signal.SIGKILL)  # an OOM kill inside the container
        assert init.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        init.kill()
        init.wait()


def test_stop_signals_reach_the_role(run_root: Path) -> None:
    body = """
    import signal
    signal.signal(signal.SIGTERM, lambda *_: (final('stopped'), sys.exit(0)))
    Path(f"{path}.armed").touch()
    time.sleep(60)
    """
    init, health = start_init(run_root, body)
    try:
        # Not the first beat: the role beats (from a thread) before its SIGTERM handler is set.
        armed = Path(f"{health}.armed")
        wait_until(armed.exists, 30, "the role's SIGTERM handler")
        init.send_signal(signal.SIGTERM)  # what `docker stop` sends pid 1
        assert init.wait(timeout=30) == 0, "the role stopped cleanly, so the container exits 0"
    finally:
        init.kill()
        init.wait()


def test_a_role_ending_after_its_last_state_is_left_alone(run_root: Path) -> None:
    # Finished, then a cleanup with no beats: not a stopped process. The silence is the scenario
    # (elapsed time is what is tested): past the init's limit (DEAD_FACTOR x the role's 0.3 s
    # heartbeat_timeout) for two of its checks (one every CHECK_SECONDS, after a POLL_SECONDS nap),
    # so the init has judged the silent role at least once before it exits.
    silent = DEAD_FACTOR * 0.3 + 2 * (CHECK_SECONDS + POLL_SECONDS)
    init, _ = start_init(run_root, f"final('finished'); time.sleep({silent})\n")
    assert init.wait(timeout=30) == 0


def test_a_command_that_is_not_there() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli.container_init", "no-such-zmqrl-command"], capture_output=True
    )
    assert done.returncode == EXIT_NOT_FOUND and b"cannot run" in done.stderr


@pytest.mark.parametrize(
    ("beat_age", "state", "since_freeze", "pid_matches", "ends"),
    [
        (0.5, "running", None, True, False),  # within 2 x 3 s
        (7.0, "running", None, True, True),  # silent past 6 s: stopped
        (7.0, "finished", None, True, False),  # ending by itself
        (7.0, "running", None, False, False),  # another process's file
        (7.0, "running", 1.0, True, False),  # the init was frozen 1 s ago (docker pause): grace
    ],
)
def test_stale_verdict(
    tmp_path: Path, beat_age: float, state: str, since_freeze: float | None, pid_matches: bool, ends: bool
) -> None:
    now, clock = 1_000_000.0, 5_000.0
    path = tmp_path / "health.json"
    assert stale_verdict(path, 42, now=now, clock_now=clock) is None, "no file yet: starting"
    beat = clock - beat_age
    record = HealthRecord("actor", 1, 42, state, now, 3, now, 3.0, 60.0, clock=beat, progress_clock=beat)
    write_health(path, record)  # its wall times say nothing: the monotonic clock decides
    thawed = math.inf if since_freeze is None else since_freeze
    verdict = stale_verdict(path, 42 if pid_matches else 43, thawed, now=now, clock_now=clock)
    assert (verdict is not None) == ends, verdict
