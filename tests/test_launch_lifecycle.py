"""`zmqrl launch` for real, issue 23: a console nobody reads (item 5), a learner stopped by a signal
from outside (item 6), actors that run out of steps under a replay ratio and an env that starts
processes of its own (item 11). Real processes for seconds each: part of the heavy run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import run_state
from tests.conftest import REPO, processes_mentioning, tiny_overrides, wait_until
from tests.test_launch import Launch, assert_nothing_left, learner_pid

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"


class PipedLaunch:
    """A launch whose stdout is a pipe the test reads, or stops reading and fills."""

    def __init__(self, overrides: list[str]) -> None:
        cmd = [sys.executable, "-m", "zmqrl", "launch", str(CONFIG)]
        for item in overrides:
            cmd += ["--set", item]
        self.read_end, self.write_end = os.pipe()
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=self.write_end,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.text = ""
        self.reading = threading.Event()
        self.reading.set()
        self.parked = threading.Event()  # the reader waits for `reading`, no read in flight
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            if not self.reading.is_set():
                self.parked.set()
            self.reading.wait()
            self.parked.clear()
            chunk = os.read(self.read_end, 65536)
            if not chunk:
                return
            self.text += chunk.decode(errors="replace")

    def fill(self) -> int:
        """Stop reading and fill the pipe, as a reader that went away would; returns bytes written."""
        self.reading.clear()
        # A description of its own for the same pipe: O_NONBLOCK on the shared one would make the
        # launch's writes fail instead of block.
        filler = os.open(f"/proc/self/fd/{self.write_end}", os.O_WRONLY | os.O_NONBLOCK)
        written = _fill(filler)
        # The reader's read in flight takes one chunk of the first filling; then it reads no more.
        wait_until(self.parked.is_set, 30, "the reader to stop reading")
        written += _fill(filler)
        os.close(filler)
        os.close(self.write_end)  # the launch holds its own copy
        return written

    def resume(self) -> None:
        self.reading.set()

    def writer_blocked(self) -> bool:
        """Whether the launch is asleep in a write to its full stdout pipe."""
        try:
            return "pipe_write" in Path(f"/proc/{self.proc.pid}/wchan").read_text()  # (anon_)pipe_write
        except OSError:
            return False


def _fill(fd: int) -> int:
    """Write to non-blocking ``fd`` until it is full; returns bytes written."""
    written = 0
    try:
        while True:
            written += os.write(fd, b"#" * 4096)
    except BlockingIOError:
        return written


def test_a_launch_whose_stdout_nobody_reads_keeps_its_roles_alive_and_stops_cleanly(run_root: Path) -> None:
    """The console write blocks the supervisor's loop for several heartbeat timeouts: the roles
    hear the supervisor's heartbeat all the same (its own thread), keep training, and the run
    neither ends nor judges anyone dead for the time it did not listen."""
    run_dir = run_root / "t"
    launch = PipedLaunch(
        tiny_overrides(run_root, learner__max_updates=1_000_000, supervisor__heartbeat_timeout=2.0)
    )
    try:
        run_state.wait_until_up(run_dir, "actor-0", 90, alive=lambda: launch.proc.poll() is None)
        launch.fill()
        wait_until(launch.writer_blocked, 30, "the launch to block on its full stdout")
        published_before = run_state.published_version(run_dir)
        blocked_at = time.monotonic()
        while time.monotonic() - blocked_at < 4 * 2.0:  # four heartbeat timeouts
            assert launch.writer_blocked(), "the launch was unblocked before the test let it"
            assert launch.proc.poll() is None
            time.sleep(0.2)
        assert len(processes_mentioning(f"{run_dir}/config.yaml")) == 2, "a role left the blocked run"
        for name in ("learner-0", "actor-0"):
            assert "supervisor silent" not in (run_dir / "logs" / f"{name}.log").read_text()
        assert run_state.published_version(run_dir) > published_before, "the learner stopped training"
        launch.resume()
        wait_until(lambda: not launch.writer_blocked(), 30, "the launch to write again")
        for _ in range(3):  # a few turns of its loop after the stall (each answer is one): nobody judged dead
            snap = run_state.wait_for_snapshot(run_dir, lambda s: True, 30, "an answer after the stall")
            assert all(run_state.is_up(r) and r.restarts == 0 for r in snap.processes), snap.processes
    finally:
        launch.resume()
        interrupted = time.monotonic()
        launch.proc.send_signal(signal.SIGINT)
        code = launch.proc.wait(timeout=60)
        took = time.monotonic() - interrupted
    launch._reader.join(timeout=10)
    assert code == 130, launch.text
    assert "killing it" not in launch.text and "restarting" not in launch.text, launch.text
    assert "learner finished" not in launch.text
    print(f"\nCtrl-C after the stall took {took:.2f} s")
    assert_nothing_left(run_dir)


def test_a_learner_sigtermed_from_outside_is_restarted_and_the_run_finishes(run_root: Path) -> None:
    """Item 6: it stopped cleanly on the signal and exited 0, and launch said "learner finished"."""
    run_dir = run_root / "t"
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=2000,
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__restart_backoff=0.2,
        )
    )
    wait_until((run_dir / "checkpoints" / "latest").is_file, 90, "a first checkpoint")
    os.kill(learner_pid(run_dir), signal.SIGTERM)
    run_state.wait_for_process_row(run_dir, "learner-0", run_state.noticed, 30, "gone", launch.running)
    assert "learner finished" not in launch.output
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    assert "learner-0 killed by SIGTERM from outside" in launch.output
    assert "restarting it from its latest checkpoint" in launch.output
    stats = run_state.run_stats(run_dir)
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["updates"] == 2000 and learner["restarts"] == 1
    assert learner["end"] == "finished" and stats["outcome"] == "finished"
    actor = stats["actors"][0]
    assert actor["restarts"] == 0, "the actor outlived its learner's restart"
    assert learner["resumed_from"]["updates"] >= 100, "the replacement resumed from a checkpoint"
    assert_nothing_left(run_dir)


def test_actors_at_max_steps_under_a_replay_ratio_end_the_run_instead_of_hanging_it(run_root: Path) -> None:
    """Item 11: with learner.samples_per_insert the learner waited forever for data no actor would
    send any more; now it is asked to end the run once every actor is done, as serial mode does."""
    run_dir = run_root / "t"
    launch = Launch(
        tiny_overrides(
            run_root,
            actor__num_actors=2,
            actor__max_steps=1500,
            learner__max_updates=1_000_000,
            learner__samples_per_insert=8.0,
            learner__samples_per_insert_tolerance=100,
            learner__eval_interval=0,
        )
    )
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    assert "every actor is done (actor.max_steps): asking the learner to end the run" in launch.output
    stats = run_state.run_stats(run_dir)
    assert stats["learner"]["state"] == "finished" and stats["learner"]["ended"] == "actor max_steps"
    assert [a["end"] for a in stats["actors"]] == ["finished", "finished"]
    assert (
        "every actor reached actor.max_steps: ending the run"
        in (run_dir / "logs" / "learner-0.log").read_text()
    )
    assert_nothing_left(run_dir)


def test_an_envs_own_processes_die_with_their_actor(run_root: Path) -> None:
    """Item 11: only the child's pid was killed, and an env's subprocess outlived its actor. The
    actor is stopped (SIGSTOP) so the supervisor kills it; then the run is stopped."""
    run_dir = run_root / "t"
    tag = f"{run_dir}/env-helper"
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=1_000_000,
            learner__eval_interval=0,
            env__id="tests.example_envs:make_env_with_helper",
            env__kwargs=f"{{tag: {tag}}}",
        )
    )
    try:
        actor = run_state.wait_until_up(run_dir, "actor-0", 90, alive=launch.running).pid
        assert actor is not None

        def helpers_of(pid: int) -> list[int]:
            found = []
            for helper, _ in processes_mentioning(tag):
                stat = Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:  # its parent
                    found.append(helper)
            return found

        wait_until(lambda: helpers_of(actor), 30, "the actor's env helper")
        helper = helpers_of(actor)[0]
        os.kill(actor, signal.SIGSTOP)
        run_state.wait_for_process_row(
            run_dir, "actor-0", run_state.noticed, 30, "found stopped", launch.running
        )
        wait_until(lambda: not Path(f"/proc/{helper}").exists(), 10, "the helper to die with its actor")
        run_state.wait_until_up(run_dir, "actor-0", 60, restarts=1, alive=launch.running)
    finally:
        launch.proc.send_signal(signal.SIGINT)
        code = launch.finish(timeout=60)
    assert code == 130, launch.output
    assert_nothing_left(run_dir)  # the helpers' command lines name the run directory too
