"""Liveness for real (issue 9): OS processes, signals, injected faults (``ZMQRL_TEST_HOOKS``), and
the shipped supervisor defaults. Each test measures its times and asserts only the issue's bounds,
waiting on conditions with generous deadlines so a loaded 2-core machine does not flake."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml
import zmq

from tests import run_state
from tests.conftest import processes_mentioning, tiny_overrides, wait_until
from tests.test_launch import REPO, Launch, assert_nothing_left, wait_for_log
from zmqrl.runtime.testhooks import (
    ACTOR_HANG_ONCE,
    DEADLOCK_ONCE,
    HOOKS_ENV,
    INGEST_FAULT_ONCE,
    SLOW_CHECKPOINT,
)
from zmqrl.supervisor.liveness import os_stopped

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
# The bounds.
REPLACED_WITHIN = 5.0  # seconds from a fault (SIGKILL or SIGSTOP) to a new process in the slot
CTRL_C_WITHIN = 5.0  # seconds from Ctrl-C to `launch` gone, a stopped child included
# A fault is dealt to a process the supervisor has heard do useful work (run_state.WorkHeard): a
# kill from outside of a working process is replaced at the base delay and never counts towards
# the restart cap (zmqrl/supervisor/restarts.py).


def default_supervisor(run_root: Path, **extra: object) -> list[str]:
    """tiny_overrides with every supervisor setting left at its shipped default (item 16 is about
    the defaults; tiny_overrides shortens the heartbeat interval and stop_grace)."""
    return [item for item in tiny_overrides(run_root, **extra) if not item.startswith("supervisor.")] + [
        f"{k.replace('__', '.')}={v}" for k, v in extra.items() if k.startswith("supervisor__")
    ]


def with_hooks(hooks: str) -> dict[str, str]:
    return {**os.environ, HOOKS_ENV: hooks}


def slot_pid(run_dir: Path, role: str, index: int = 0) -> int | None:
    for pid, cmd in processes_mentioning(f"{run_dir}/config.yaml"):
        if role == "learner" and " learner " in cmd:
            return pid
        if role == "actor" and re.search(rf" actor .*--id {index}( |$)", cmd):
            return pid
    return None


def wait_for_pid(
    run_dir: Path, role: str, index: int = 0, other_than: int | None = None, timeout: float = 60
) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = slot_pid(run_dir, role, index)
        if pid is not None and pid != other_than:
            return pid
        time.sleep(0.01)
    raise AssertionError(f"no new {role}-{index} process within {timeout} s")


def stats_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "stats.json").read_text())


def log_times(path: Path, text: str) -> list[float]:
    """Unix times of the log lines containing ``text`` (logging's default asctime, local time)."""
    found = []
    for line in path.read_text().splitlines():
        if text in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
            found.append(stamp.timestamp())
    return found


# ---------------------------------------------------------------------- item 1: a failing ingest
def test_a_learner_whose_ingest_raises_exits_non_zero_with_the_traceback_in_its_log(
    run_root: Path, tmp_path: Path
) -> None:
    """Started by hand, with a real actor feeding it: the learner must not go on half-alive."""
    run_dir = run_root / "t"
    run_dir.mkdir(parents=True)
    overrides = tiny_overrides(run_root, learner__max_updates=100_000)
    learner_log = run_dir / "learner.log"
    cmd = [sys.executable, "-m", "zmqrl", "learner", str(REPO / "configs" / "cartpole_dqn.yaml")]
    cmd += [a for item in overrides for a in ("--set", item)]
    env = with_hooks(f"{INGEST_FAULT_ONCE}={tmp_path / 'fired'}")
    health = tmp_path / "learner-health.json"
    with open(learner_log, "wb") as out:
        learner = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=run_state.with_health_file(health, env)
        )
    actor: subprocess.Popen[bytes] | None = None
    try:
        endpoints = run_state.wait_for_endpoints(health, 60, learner)
        actor_cmd = [sys.executable, "-m", "zmqrl", "actor", str(run_dir / "config.yaml"), "--id", "0"]
        actor_cmd += [
            "--set",
            f"transport.samples={endpoints['samples']}",
            "--set",
            f"transport.weights={endpoints['weights']}",
        ]
        with open(run_dir / "actor.log", "wb") as out:
            actor = subprocess.Popen(actor_cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        code = learner.wait(timeout=90)
        text = learner_log.read_text()
        assert code == 1, text
        # The insert runs on the training thread now (the intake process only receives and checks):
        # its failure is the learner's own, with its traceback.
        assert "Traceback (most recent call last)" in text and "in insert" in text
        assert "RuntimeError: test hook: replay add failed" in text
        assert actor.wait(timeout=60) == 0, "the actor leaves with its failed learner"
        assert "stop announced by the learner: learner failed" in (run_dir / "actor.log").read_text()
    finally:
        for proc in (learner, actor):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert_nothing_left(run_dir)


def test_a_supervised_run_recovers_from_a_learner_whose_ingest_failed(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault fires after the first checkpoint (the marker file is removed then), so the restarted
    learner resumes from it and the run finishes."""
    run_dir = run_root / "t"
    marker = tmp_path / "fired"
    marker.touch()  # present: the hook is off until the test removes it
    monkeypatch.setenv(HOOKS_ENV, f"{INGEST_FAULT_ONCE}={marker}")  # inherited by every process
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=1500,
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__restart_backoff=0.2,
        )
    )
    wait_until((run_dir / "checkpoints" / "latest").is_file, 90, "a first checkpoint")
    marker.unlink()  # the next batch the learner accepts raises as it is inserted
    run_state.wait_for_process_row(run_dir, "learner-0", run_state.noticed, 30, "gone", launch.running)
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    assert marker.exists(), "the hook fired"
    assert "learner-0 exited with code 1" in launch.output
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert "Traceback (most recent call last)" in log and "RuntimeError: test hook: replay add failed" in log
    stats = stats_of(run_dir)
    assert stats["learner"]["resumed_from"]["updates"] >= 100, "the replacement resumed from a checkpoint"
    assert stats["learner"]["state"] == "finished" and stats["learner"]["updates"] == 1500
    assert stats["learner"]["restarts"] == 1
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 3: busy is not dead, hung is
def test_a_learner_busy_in_checkpoints_for_longer_than_heartbeat_timeout_is_not_killed(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = run_root / "t"
    monkeypatch.setenv(HOOKS_ENV, f"{SLOW_CHECKPOINT}=4")
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=600,
            learner__checkpoint_interval=50,
            learner__eval_interval=0,
            supervisor__heartbeat_timeout=2.0,
        )
    )
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert log.count("test hook: checkpoint write sleeps 4 s") >= 2, (
        "the final checkpoint is written on the main thread"
    )
    assert "killing" not in launch.output, launch.output
    stats = stats_of(run_dir)
    assert stats["learner"]["restarts"] == 0 and stats["learner"]["state"] == "finished"
    assert stats["learner"]["updates"] == 600
    assert_nothing_left(run_dir)


def test_a_learner_whose_main_loop_deadlocks_ends_itself_as_hung_and_is_restarted(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its watchdog (issue 23 item 9) ends it at progress_timeout with exit 3 and its stacks in its
    log; the supervisor restarts it from its checkpoint and the run finishes."""
    run_dir = run_root / "t"
    monkeypatch.setenv(HOOKS_ENV, f"{DEADLOCK_ONCE}={tmp_path / 'fired'}")
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=400,
            learner__eval_interval=0,
            supervisor__progress_timeout=4.0,  # must exceed heartbeat_timeout (3)
            supervisor__restart_backoff=0.2,
        )
    )
    # The hook marks its firing by creating its file, just before the main loop deadlocks.
    wait_until((tmp_path / "fired").exists, 90, "the main loop to deadlock")
    deadlocked_at = time.monotonic()
    run_state.wait_for_process_row(
        run_dir, "learner-0", run_state.noticed, 30, "ended as hung", launch.running
    )
    noticed_after = time.monotonic() - deadlocked_at
    assert "learner-0 exited with code 3 (hung: its watchdog ended it)" in launch.output
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert "learner-0 hung: its main loop made no progress for" in log
    assert "block_forever" in log, "the main thread's stack is in the log"
    stats = stats_of(run_dir)
    assert stats["learner"]["restarts"] == 1 and stats["learner"]["updates"] == 400
    assert noticed_after < 4.0 + 5.0, f"a hang noticed only after {noticed_after:.1f} s"
    assert_nothing_left(run_dir)


def test_with_the_default_settings_a_hung_actor_is_replaced_within_ten_seconds(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 9: its main loop stops (not held back by a full queue): its own watchdog ends
    it (exit 3), so the supervisor, or compose's `restart: on-failure`, replaces it."""
    run_dir = run_root / "t"
    monkeypatch.setenv(HOOKS_ENV, f"{ACTOR_HANG_ONCE}={tmp_path / 'fired'}")
    launch = Launch(default_supervisor(run_root, learner__max_updates=1_000_000, learner__eval_interval=0))
    try:
        actor_log = run_dir / "logs" / "actor-0.log"
        # The one record of when its main loop stopped is the hook's own line (its time stamp).
        wait_for_log(actor_log, "test hook: the main loop hangs now", 90)
        hung_pid = wait_for_pid(run_dir, "actor", 0)
        hung_at = log_times(actor_log, "test hook: the main loop hangs now")[0]
        wait_for_pid(run_dir, "actor", 0, other_than=hung_pid, timeout=60)
        replaced = time.time() - hung_at
        print(f"\nhung actor replaced {replaced:.2f} s after its main loop stopped")
        assert replaced < 10.0, launch.output
        launch.wait_for("actor-0 exited with code 3 (hung: its watchdog ended it)", 10)
        log = actor_log.read_text()
        assert "actor-0 hung: its main loop made no progress for" in log and "block_forever" in log
    finally:
        launch.proc.send_signal(signal.SIGINT)
        code = launch.finish(timeout=60)
    assert code == 130, launch.output
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 16: the defaults notice quickly
def test_with_the_default_settings_a_stopped_actor_is_replaced_within_five_seconds_start_up_included(
    run_root: Path,
) -> None:
    run_dir = run_root / "t"
    launch = Launch(default_supervisor(run_root, learner__max_updates=1_000_000, learner__eval_interval=0))
    try:
        # Stopped in start-up: as soon as its process exists, before its first heartbeat.
        first = wait_for_pid(run_dir, "actor", 0, timeout=90)
        os.kill(first, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert not run_state.is_up(run_state.process(run_dir, "actor-0")), "stopped past its start-up"
        second = wait_for_pid(run_dir, "actor", 0, other_than=first, timeout=30)
        in_start_up = time.monotonic() - stopped_at
        # Stopped while running, once the supervisor has heard it do useful work.
        run_state.wait_until_working(run_dir, "actor-0", 90, restarts=1, alive=launch.running)
        os.kill(second, signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_for_pid(run_dir, "actor", 0, other_than=second, timeout=30)
        running = time.monotonic() - stopped_at
        print(f"\nstopped actor replaced after {in_start_up:.2f} s (in start-up), {running:.2f} s (running)")
        assert in_start_up < REPLACED_WITHIN and running < REPLACED_WITHIN, (in_start_up, running)
        assert launch.output.count("is stopped by a signal") == 0  # not yet shutting down
        killed = re.findall(r"actor-0 \(pid \d+\) (stopped by a signal|no heartbeat) for", launch.output)
        assert killed == ["stopped by a signal", killed[1]], launch.output  # in start-up: no beat to miss
    finally:
        launch.proc.send_signal(signal.SIGINT)
        launch.finish(timeout=60)
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 18: Ctrl-C with a stopped child
def test_ctrl_c_while_an_actor_is_stopped_ends_within_five_seconds_with_nothing_left(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch = Launch(
        default_supervisor(
            run_root, actor__num_actors=2, learner__max_updates=1_000_000, supervisor__heartbeat_timeout=30
        )  # a long timeout: the stopped actor is still in place when Ctrl-C comes
    )
    for name in ("actor-0", "actor-1"):
        run_state.wait_until_up(run_dir, name, 90, alive=launch.running)
    stopped = wait_for_pid(run_dir, "actor", 0)
    os.kill(stopped, signal.SIGSTOP)
    wait_until(lambda: os_stopped(stopped), 10, "actor-0 to be stopped by SIGSTOP")
    interrupted = time.monotonic()
    launch.proc.send_signal(signal.SIGINT)
    code = launch.finish(timeout=60)
    took = time.monotonic() - interrupted
    print(f"\nCtrl-C with a stopped actor took {took:.2f} s")
    assert code == 130, launch.output
    assert "actor-0" in launch.output and "is stopped by a signal; killing it" in launch.output
    assert took < CTRL_C_WITHIN, f"Ctrl-C took {took:.1f} s:\n{launch.output}"
    assert_nothing_left(run_dir)
    assert stats_of(run_dir)["shutdown_seconds"] < CTRL_C_WITHIN


# ---------------------------------------------------------------------- issue 23 item 3: a real crash loop
def test_actors_whose_env_fails_seconds_after_every_start_are_given_up_and_the_run_ends_non_zero(
    run_root: Path,
) -> None:
    """Each run does useful work for 3 s, then its env raises: far from a healthy run, so the
    backoff doubles and the cap gives the slot up; with no actor left the run ends with one line
    saying which role, how often, and the last error of its log."""
    run_dir = run_root / "t"
    launch = Launch(
        default_supervisor(
            run_root,
            env__id="tests.example_envs:make_failing_env",
            learner__max_updates=1_000_000,
            learner__eval_interval=0,
            supervisor__max_restarts=2,
        )
    )
    code = launch.finish(timeout=240)
    assert code == 1, launch.output
    delays = re.findall(
        r"actor-0 exited with code 1 \(before running healthily.*restarting it in ([\d.]+) s", launch.output
    )
    assert [float(d) for d in delays] == [0.5, 1.0], launch.output
    loops = [line for line in launch.output.splitlines() if "crash loop" in line]
    assert len(loops) == 1, launch.output
    assert "actor-0 failed 3 times in" in loops[0]
    assert "RuntimeError: test env: failing 3 s after it was made" in loops[0]
    ends = [line for line in launch.output.splitlines() if "error: every actor was given up" in line]
    assert len(ends) == 1 and "actor-0: given up after 2 restart(s), exit code 1" in ends[0], launch.output
    assert "RuntimeError: test env" in ends[0]
    stats = stats_of(run_dir)
    assert stats["outcome"] == "failed (exit code 1): every actor was given up"
    assert stats["actors"][0]["end"] == "given up" and stats["actors"][0]["restarts"] == 2
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 10: a heartbeat flood
def test_a_heartbeat_flood_neither_stalls_the_supervisor_nor_goes_uncounted(run_root: Path) -> None:
    run_dir = run_root / "t"
    junk = 10_000
    launch = Launch(default_supervisor(run_root, learner__max_updates=1_000_000, learner__eval_interval=0))
    ctx = zmq.Context()
    try:
        run_state.wait_until_working(run_dir, "actor-0", 90, alive=launch.running)
        endpoint = yaml.safe_load((run_dir / "config.yaml").read_text())["transport"]["heartbeat"]
        flood = ctx.socket(zmq.PUSH)
        flood.connect(endpoint)
        sent = threading.Event()

        def send() -> None:
            for i in range(junk):
                flood.send_multipart([b"\x92junk", f"{i}".encode()])
                if i % 500 == 0:
                    time.sleep(0.05)  # a flood spread over the next second or two
            flood.close(linger=10_000)
            sent.set()

        victim = wait_for_pid(run_dir, "actor", 0)
        flooder = threading.Thread(target=send, daemon=True)
        flooder.start()
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        wait_for_pid(run_dir, "actor", 0, other_than=victim, timeout=30)
        replaced = time.monotonic() - killed
        assert sent.wait(60), "the flood was not delivered"
        run_state.wait_until_up(run_dir, "actor-0", 90, restarts=1, alive=launch.running)
    finally:
        interrupted = time.monotonic()
        launch.proc.send_signal(signal.SIGINT)
        code = launch.finish(timeout=60)
        ctx.destroy(linger=0)
    took = time.monotonic() - interrupted
    print(f"\nunder a flood: actor replaced after {replaced:.2f} s; Ctrl-C took {took:.2f} s")
    assert code == 130, launch.output
    assert replaced < REPLACED_WITHIN and took < CTRL_C_WITHIN + 5
    stats = stats_of(run_dir)
    assert stats["bad_messages"] == junk, stats["bad_messages"]
    assert stats["shutdown_seconds"] < CTRL_C_WITHIN
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 20: rates across a restart
def test_after_a_learner_restart_rates_are_over_the_same_span_as_the_counts(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=3000,
            learner__checkpoint_interval=50,
            learner__eval_interval=0,
            supervisor__restart_backoff=0.2,
        )
    )
    # When each incarnation is up (past start-up, training or waiting for replay), as the
    # supervisor's snapshot shows it (within a heartbeat interval and a poll).
    up = [0.0, 0.0]
    run_state.wait_until_up(run_dir, "learner-0", 90, alive=launch.running)
    up[0] = time.time()
    wait_until(lambda: run_state.checkpointed_updates(run_dir) >= 1000, 120, "1000 updates checkpointed")
    os.kill(wait_for_pid(run_dir, "learner"), signal.SIGKILL)
    killed_wall = time.time()
    run_state.wait_until_up(run_dir, "learner-0", 90, restarts=1, alive=launch.running)
    up[1] = time.time()
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    learner = stats_of(run_dir)["learner"]
    assert learner["restarts"] == 1 and learner["updates"] == 3000
    ended = (run_dir / "learner-stats.json").stat().st_mtime
    first, second = killed_wall - up[0], ended - up[1]
    print(
        f"\nlearner spans {first:.1f} s + {second:.1f} s; stats duration {learner['duration']:.1f} s, "
        f"{learner['updates_per_s']:.0f} updates/s"
    )
    assert learner["updates_per_s"] == pytest.approx(learner["updates"] / learner["duration"], rel=0.02)
    # The counts restored come from the last checkpoint (at most 50 updates before the kill).
    assert learner["duration"] == pytest.approx(first + second, abs=1.5 + 0.1 * (first + second))
    assert learner["duration"] > second + 0.5 * first, "only the last incarnation's time was counted"
    assert_nothing_left(run_dir)


# ---------------------------------------------------------------------- item 17: chaos
@dataclass
class Fault:
    actor: int
    signal: str
    seconds: float  # from the fault to a new process in the slot


def run_chaos(run_root: Path, faults: int, seconds: float, seed: int = 0) -> list[Fault]:
    """``faults`` SIGKILL/SIGSTOP faults spread over about ``seconds``, on 3 actors under the shipped
    supervisor defaults, each on an actor the supervisor has heard do useful work; returns each
    fault's replacement time. The run is interrupted at the end and must leave nothing behind."""
    import random

    rng = random.Random(seed)
    run_dir = run_root / "t"
    launch = Launch(
        default_supervisor(
            run_root,
            actor__num_actors=3,
            actor__max_steps_per_s=500,  # leaves CPU for the replacements' start-ups on 2 cores
            learner__max_updates=100_000_000,
            learner__eval_interval=0,
        )
    )
    working = run_state.WorkHeard()
    pending: dict[int, tuple[float, int, str]] = {}  # actor -> (fault time, old pid, signal)
    current: dict[int, int | None] = {}  # actor -> the pid last seen in its slot
    unprovoked: list[str] = []  # replacements the test did not cause (a healthy process killed)
    done: list[Fault] = []
    every = seconds / faults
    try:
        run_state.wait_for_launched_endpoints(run_dir, 90, launch.proc)  # the actors start now
        started = time.monotonic()
        next_fault = started
        while len(done) < faults:
            now = time.monotonic()
            assert now - started < 3 * seconds + 120, f"only {len(done)} faults done:\n{launch.output}"
            assert launch.proc.poll() is None, launch.output
            for i in range(3):
                pid = slot_pid(run_dir, "actor", i)
                if i in pending:
                    at, old, how = pending[i]
                    if pid is not None and pid != old:
                        done.append(Fault(i, how, now - at))
                        del pending[i]
                    elif now - at > 30:
                        raise AssertionError(f"actor {i} not replaced 30 s after {how}:\n{launch.output}")
                elif pid is not None and current.get(i) not in (None, pid):
                    unprovoked.append(f"actor {i}: pid {current[i]} -> {pid}")
                current[i] = pid if pid is not None else current.get(i)
            snap = run_state.snapshot(run_dir)
            # Ready for a fault: the process now in its slot, heard doing useful work.
            ready = [
                i
                for i in range(3)
                if snap is not None
                and i not in pending
                and (row := run_state.row_of(snap, f"actor-{i}")) is not None
                and row.pid == current.get(i)
                and working(snap, f"actor-{i}")
            ]
            if now >= next_fault and ready and len(done) + len(pending) < faults:
                i = rng.choice(ready)
                pid = slot_pid(run_dir, "actor", i)
                if pid is not None:
                    sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
                    os.kill(pid, sig)
                    pending[i] = (time.monotonic(), pid, sig.name)
                    next_fault = max(next_fault + every, now)
            time.sleep(0.03)
        elapsed = time.monotonic() - started
    finally:
        launch.proc.send_signal(signal.SIGINT)
        code = launch.finish(timeout=90)
    times = sorted(f.seconds for f in done)
    print(
        f"\n{faults} faults in {elapsed:.0f} s; replaced after min {times[0]:.2f} s, median "
        f"{statistics.median(times):.2f} s, max {times[-1]:.2f} s "
        f"(SIGSTOP max {max((f.seconds for f in done if f.signal == 'SIGSTOP'), default=0):.2f} s, "
        f"SIGKILL max {max((f.seconds for f in done if f.signal == 'SIGKILL'), default=0):.2f} s)"
    )
    warnings = "\n".join(line for line in launch.output.splitlines() if "warning" in line)
    assert code == 130, launch.output
    assert not unprovoked, f"{unprovoked}\n{warnings}"
    assert "degraded" not in launch.output and "learner-0 (pid" not in launch.output, launch.output
    slow = [f for f in done if f.seconds >= REPLACED_WITHIN]
    assert not slow, slow
    actors = {a["actor_id"]: a for a in stats_of(run_dir)["actors"]}
    for i in range(3):
        assert actors[i]["restarts"] == sum(1 for f in done if f.actor == i), f"{done}\n{warnings}"
    assert_nothing_left(run_dir)
    return done


def test_twenty_random_kills_and_stops_over_three_actors_are_each_repaired_within_five_seconds(
    run_root: Path,
) -> None:
    run_chaos(run_root, faults=20, seconds=60)


@pytest.mark.chaos
def test_chaos_a_hundred_faults_in_five_minutes_each_repaired_within_five_seconds(
    run_root: Path, request: pytest.FixtureRequest
) -> None:
    """The issue's goal, as stated; five minutes long, so only with `pytest -m chaos`."""
    if "chaos" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("five minutes long: run with -m chaos")
    faults = run_chaos(run_root, faults=100, seconds=300, seed=1)
    assert len(faults) == 100
