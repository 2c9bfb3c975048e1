"""`zmqrl launch` for real: separate OS processes over loopback TCP, signals, and cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests import run_state
from tests.conftest import processes_mentioning, tiny_overrides, wait_until
from zmqrl.runtime.testhooks import CRASH_AFTER_UPDATES, HOOKS_ENV

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


class Launch:
    """A `zmqrl launch` subprocess whose output is collected line by line as it runs."""

    def __init__(self, overrides: list[str], *extra: str) -> None:
        cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml"), *extra]
        for item in overrides:
            cmd += ["--set", item]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{text!r} never appeared; output so far:\n{self.output}")
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self._reader.join(timeout=5)
            raise AssertionError(f"launch still running after {timeout} s; output:\n{self.output}") from None
        self._reader.join(timeout=5)
        return code


def wait_for_process(text: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = processes_mentioning(text)
        if found:
            return found[0][0]
        time.sleep(0.05)
    raise AssertionError(f"no process with {text!r} in its command line")


def log_count(path: Path, text: str) -> int:
    return path.read_text().count(text) if path.is_file() else 0


def wait_for_log(path: Path, text: str, timeout: float, times: int = 1) -> None:
    wait_until(lambda: log_count(path, text) >= times, timeout, f"{text!r} x{times} in {path}")


def assert_nothing_left(run_dir: Path) -> None:
    deadline = time.monotonic() + 5
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(run_dir)) == [], "child processes were left behind"


def launch_until_actor_runs(run_root: Path, **extra: object) -> tuple[Launch, int]:
    """A launch whose actor 0 is past its start-up (the supervisor's snapshot shows its main loop
    running); returns it and that actor's pid."""
    launch = Launch(tiny_overrides(run_root, **extra))
    row = run_state.wait_until_up(run_root / "t", "actor-0", 90, alive=launch.running)
    assert row.pid is not None
    return launch, row.pid


@pytest.mark.heavy  # runs for its 25 s budget by design: with the heavy runs
def test_launch_replaces_a_killed_actor_then_goes_on_degraded_and_reports(run_root: Path) -> None:
    run_dir = run_root / "t"
    overrides = tiny_overrides(
        run_root,
        actor__num_actors=2,
        learner__max_updates=100_000,
        learner__max_seconds=25,  # outlasts two actor start-ups on a loaded 2-core machine
        learner__eval_interval=0,
        supervisor__restart_backoff=0.5,
    )
    launch = Launch(overrides)
    first = run_state.wait_until_up(run_dir, "actor-1", 60, alive=launch.running)
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)  # from outside: replaced at the base delay
    # The replacement runs once it has loaded the learner's weights (it waits for them first).
    replacement = run_state.wait_for_process_row(
        run_dir,
        "actor-1",
        lambda row: row.restarts == 1 and row.pid != first.pid and row.state == "running",
        40,
        "replaced and acting",
        launch.running,
    )
    assert replacement.weights_version is not None and replacement.weights_version >= 1
    assert "actor-1 killed by SIGKILL from outside" in launch.output
    assert "restarting it in 0.5 s" in launch.output, "a kill from outside: the base delay"
    # Its replacements cannot start (a bad edit of the run's config.yaml, which the others read
    # before): exit 2 needs the operator, so the slot is given up at once, not restarted in a loop.
    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace("actor:\n", "actor:\n  no_such_setting: 1\n", 1))
    assert replacement.pid is not None
    os.kill(replacement.pid, signal.SIGKILL)
    run_state.wait_for_process_row(
        run_dir, "actor-1", lambda row: row.state == "given up", 30, "given up", launch.running
    )

    code = launch.finish(timeout=120)
    assert code == 0, launch.output
    assert "== learner ==" in launch.output and "actor_id" in launch.output
    given_up = [line for line in launch.output.splitlines() if "degraded" in line]
    assert len(given_up) == 1 and "actor-1 exited with code 2, which restarting cannot fix" in given_up[0]
    assert "unknown key 'actor.no_such_setting'" in given_up[0], "the role's own reason, in one line"
    assert_nothing_left(run_dir)

    stats = run_state.run_stats(run_dir)
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["updates"] > 0 and learner["samples"] > 0
    actors = {a["actor_id"]: a for a in stats["actors"]}
    assert set(actors) == {0, 1}
    assert actors[0]["weights_version"] >= 2, "actor 0 never adopted published weights"
    assert actors[0]["samples"] > 0 and actors[0]["restarts"] == 0 and actors[0]["exit_code"] == 0
    assert actors[0]["end"] == "stopped"
    assert actors[1]["restarts"] == 2 and actors[1]["exit_code"] == 2 and actors[1]["end"] == "given up"
    assert stats["outcome"] == "finished"
    assert actors[0]["state"] == "stopped", "actor 0 was told to stop, by the supervisor or the learner"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_process(run_root: Path, signum: int, code: int) -> None:
    run_dir = run_root / "t"
    launch, _ = launch_until_actor_runs(run_root, learner__max_updates=1_000_000)  # past start-up
    launch.proc.send_signal(signum)
    assert launch.finish(timeout=60) == code, launch.output
    assert f"{signal.Signals(signum).name} received" in launch.output
    assert_nothing_left(run_dir)
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["learner"]["state"] == "stopped"


@contextlib.contextmanager
def port_taken_by_someone_else() -> Iterator[str]:
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.PULL)
    squatter.bind("tcp://127.0.0.1:0")
    try:
        yield squatter.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        squatter.close(0)
        ctx.term()


def test_port_in_use_names_the_port_and_leaves_no_children(run_root: Path) -> None:
    with port_taken_by_someone_else() as taken:
        launch = Launch(tiny_overrides(run_root, transport__samples=taken))
        code = launch.finish(timeout=90)
    assert code != 0
    assert f"cannot bind samples on {taken}: address already in use" in launch.output
    assert_nothing_left(run_root / "t")


def test_supervisor_port_in_use_fails_before_starting_anything(run_root: Path) -> None:
    with port_taken_by_someone_else() as taken:
        launch = Launch(tiny_overrides(run_root, transport__heartbeat=taken))
        code = launch.finish(timeout=60)
    assert code == 1
    assert f"cannot bind heartbeat on {taken}" in launch.output
    assert not (run_root / "t" / "logs").exists()


def test_children_die_with_a_sigkilled_supervisor(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch, _ = launch_until_actor_runs(run_root, learner__max_updates=1_000_000)
    launch.proc.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    launch.finish(timeout=30)
    assert_nothing_left(run_dir)


def test_a_hung_actor_is_detected_by_its_silence_and_replaced(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch, victim = launch_until_actor_runs(
        run_root, learner__max_updates=1_000_000, supervisor__heartbeat_timeout=2.0
    )
    # Past start-up: a stopped process is judged by the OS's word and its silence alike, both
    # within heartbeat_timeout.
    os.kill(victim, signal.SIGSTOP)  # alive to the OS, silent to the supervisor
    stopped_at = time.monotonic()
    run_state.wait_for_process_row(
        run_dir,
        "actor-0",
        run_state.noticed,
        30,
        "found stopped",
        launch.running,
    )
    detected_after = time.monotonic() - stopped_at
    replacement = wait_for_process(f"{run_dir}/config.yaml --id 0", 30)
    assert replacement != victim
    assert "actor-0 stopped from outside" in launch.output, "the operator is told why it was replaced"
    assert detected_after < 2.0 + 3.0, f"hang detected only after {detected_after:.1f} s"
    launch.proc.send_signal(signal.SIGINT)
    assert launch.finish(timeout=60) == 130, launch.output
    assert_nothing_left(run_dir)


def test_children_leave_when_the_supervisor_hangs(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch, _ = launch_until_actor_runs(
        run_root, learner__max_updates=1_000_000, supervisor__heartbeat_timeout=2.0
    )
    os.kill(launch.proc.pid, signal.SIGSTOP)  # alive to the kernel (no parent-death signal), but silent
    try:
        deadline = time.monotonic() + 20
        while processes_mentioning(f"{run_dir}/config.yaml") and time.monotonic() < deadline:
            time.sleep(0.1)
        left = processes_mentioning(f"{run_dir}/config.yaml")
    finally:
        launch.proc.kill()
        launch.finish(timeout=30)
    assert left == [], "children outlived their hung supervisor"
    assert "supervisor silent for" in (run_dir / "logs" / "learner-0.log").read_text()
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()  # noticed itself, or was told by the learner
    # Silent after it was heard, or never heard at all (stopped before the actor's first contact).
    assert any(
        reason in actor_log
        for reason in ("supervisor silent for", "no supervisor at", "stop announced by the learner")
    )


def test_a_killed_learner_is_restarted_from_its_checkpoint_and_the_run_completes(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=3000,
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__restart_backoff=0.2,
            checkpoint__replay=True,
        )
    )
    wait_until((run_dir / "checkpoints" / "latest").is_file, 90, "a first checkpoint")
    published_before = int((run_dir / "weights-version").read_text().split()[0])
    os.kill(learner_pid(run_dir), signal.SIGKILL)

    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    assert_nothing_left(run_dir)
    assert "restarting it from its latest checkpoint" in launch.output
    stats = run_state.run_stats(run_dir)
    assert stats["learner"]["restarts"] == 1
    assert stats["learner"]["resumed_from"]["path"] == str(run_dir / "checkpoints" / "latest")
    assert stats["learner"]["resumed_from"]["updates"] >= 100
    assert stats["learner"]["state"] == "finished" and stats["learner"]["updates"] == 3000
    assert stats["learner"]["weights_version"] > published_before
    assert stats["actors"][0]["weights_version"] > published_before, "actors follow the restarted learner"


def learner_pid(run_dir: Path) -> int:
    found = [pid for pid, cmd in processes_mentioning(f"{run_dir}/config.yaml") if " learner " in cmd]
    assert found, "no learner process"
    return found[0]


def test_a_run_with_curve_keys_trains_over_encrypted_authenticated_sockets(run_root: Path) -> None:
    keys_dir = run_root / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "zmqrl", "keys", str(keys_dir)], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    assert (keys_dir / "server.key_secret").is_file() and (keys_dir / "authorized" / "client.key").is_file()
    again = subprocess.run(
        [sys.executable, "-m", "zmqrl", "keys", str(keys_dir)], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 1 and again.stderr.startswith("error:"), "existing keys are never overwritten"

    run_dir = run_root / "t"
    launch = Launch(tiny_overrides(run_root, learner__max_updates=200, transport__keys_dir=str(keys_dir)))
    assert launch.finish(timeout=120) == 0, launch.output
    assert_nothing_left(run_dir)
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["learner"]["samples"] > 0 and stats["learner"]["updates"] == 200
    assert stats["actors"][0]["weights_version"] >= 2


def test_binding_beyond_loopback_without_keys_is_refused_before_anything_binds(run_root: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "zmqrl",
            "learner",
            str(REPO / "configs" / "cartpole_dqn.yaml"),
            *[
                arg
                for item in tiny_overrides(run_root, transport__samples="tcp://0.0.0.0:0")
                for arg in ("--set", item)
            ],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "zmqrl keys" in result.stderr and "--insecure" in result.stderr
    assert_nothing_left(run_root / "t")


def test_a_learner_failing_past_its_restarts_stops_the_run_with_a_clear_error(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every learner process fails 50 updates after its start (resumed from its checkpoint each
    time): useful work, but no healthy run, so the failures count and the cap ends the run."""
    run_dir = run_root / "t"
    monkeypatch.setenv(HOOKS_ENV, f"{CRASH_AFTER_UPDATES}=50")  # inherited by every process
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=1_000_000,
            learner__checkpoint_interval=50,
            supervisor__max_restarts=1,
            supervisor__restart_backoff=0.2,
        )
    )
    assert launch.finish(timeout=120) == 1, launch.output
    lines = [line for line in launch.output.splitlines() if "crash loop" in line]
    assert len(lines) == 1, launch.output
    assert "error: learner-0 failed 2 times in" in lines[0]
    assert "RuntimeError: test hook: the learner fails at update" in lines[0], "the last error of its log"
    assert f"zmqrl launch --resume {run_dir}" in lines[0]
    assert "restarting it from its latest checkpoint in 0.2 s" in launch.output
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["outcome"].startswith("failed (exit code 1)") and stats["learner"]["end"] == "given up"
    assert_nothing_left(run_dir)


def test_a_run_whose_every_actor_is_down_for_good_stops_instead_of_waiting_forever(run_root: Path) -> None:
    """The actor's replacements cannot start (a bad edit of the run's config.yaml, which the
    learner read before): once its slot is given up no process is left to feed the learner."""
    run_dir = run_root / "t"
    launch, actor_pid = launch_until_actor_runs(
        run_root, learner__max_updates=1_000_000, supervisor__max_restarts=1, supervisor__restart_backoff=0.2
    )
    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace("actor:\n", "actor:\n  no_such_setting: 1\n", 1))
    os.kill(actor_pid, signal.SIGKILL)
    assert launch.finish(timeout=90) == 2, launch.output  # its replacement needs the operator
    lines = [line for line in launch.output.splitlines() if "error: every actor was given up" in line]
    assert len(lines) == 1, launch.output
    assert "actor-0: given up after 1 restart(s), exit code 2" in lines[0]
    assert "unknown key 'actor.no_such_setting'" in lines[0]
    assert_nothing_left(run_dir)


def test_a_stopped_run_continues_when_launched_again_or_with_resume(run_root: Path) -> None:
    run_dir = run_root / "t"
    overrides = tiny_overrides(run_root, learner__max_updates=1500, learner__checkpoint_interval=100)
    first = Launch(overrides)
    wait_until(lambda: run_state.checkpointed_updates(run_dir) > 0, 90, "a first checkpoint")
    first.proc.send_signal(signal.SIGINT)
    assert first.finish(timeout=60) == 130, first.output
    stopped_at = json.loads((run_dir / "learner-stats.json").read_text())["updates"]
    assert 0 < stopped_at < 1500

    again = Launch(overrides)  # the same command: a stopped run is continued, not overwritten
    assert again.finish(timeout=120) == 0, again.output
    assert "holds a stopped run: continuing it" in again.output
    stats = run_state.run_stats(run_dir)["learner"]
    assert stats["state"] == "finished" and stats["updates"] == 1500
    assert stats["resumed_from"]["updates"] == stopped_at, "continued from the stopped run's final checkpoint"

    more = subprocess.run(
        [
            sys.executable,
            "-m",
            "zmqrl",
            "launch",
            "--resume",
            str(run_dir),
            "--set",
            "learner.max_updates=1600",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert more.returncode == 0, more.stdout + more.stderr
    assert json.loads((run_dir / "stats.json").read_text())["learner"]["updates"] == 1600
    assert_nothing_left(run_dir)


def test_a_closed_console_does_not_stop_the_supervisor_from_cleaning_up(run_root: Path) -> None:
    run_dir = run_root / "t"
    progress_seconds = 1.0  # a progress line on the console this often
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml")]
    overrides = tiny_overrides(
        run_root, learner__max_updates=1_000_000, supervisor__progress_seconds=progress_seconds
    )
    for item in overrides:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for_process(f"{run_dir}/config.yaml --id 0", 60)
    assert proc.stdout is not None
    proc.stdout.close()  # whoever watched the console went away: every write now fails
    # Progress lines hit the closed pipe meanwhile: the supervisor's loop (the one that prints
    # them, and answers `zmqrl status`) is still answering two progress intervals after the close,
    # so at least one was due and written in between. The SIGINT notice and the final report
    # below hit the pipe anyway.
    closed = run_state.wait_for_snapshot(
        run_dir, lambda s: s.state == "running", 30, "the supervisor's loop", lambda: proc.poll() is None
    )
    run_state.wait_for_snapshot(
        run_dir,
        lambda s: s.elapsed >= closed.elapsed + 2 * progress_seconds,
        30,
        "the supervisor to answer two progress intervals after its console closed",
        lambda: proc.poll() is None,
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert_nothing_left(run_dir)


def test_launching_into_a_finished_run_starts_a_fresh_numbered_run(run_root: Path) -> None:
    """A finished run's TensorBoard events and checkpoints are never mixed with a new run's."""
    run_dir = run_root / "t"
    overrides = tiny_overrides(run_root, learner__max_updates=300)
    first = Launch(overrides)
    assert first.finish(timeout=120) == 0, first.output
    events_before = sorted(p.name for p in (run_dir / "tb").rglob("*") if p.is_file())
    assert events_before, "the first run wrote no TensorBoard events"

    again = Launch(overrides)
    assert again.finish(timeout=120) == 0, again.output
    assert f"{run_dir} holds a finished run: this run goes to {run_root / 't-2'}" in again.output
    assert sorted(p.name for p in (run_dir / "tb").rglob("*") if p.is_file()) == events_before
    second = json.loads((run_root / "t-2" / "stats.json").read_text())["learner"]
    assert second["state"] == "finished" and second["updates"] == 300
    assert_nothing_left(run_root)
