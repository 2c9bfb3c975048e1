"""Chaos: actors SIGKILLed and SIGSTOPped at random, the learner killed once. Every failure is
detected and its slot refilled within 5 s, the run completes, nothing is left behind."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from tests import run_state
from tests.conftest import processes_mentioning, tiny_overrides, wait_until
from tests.test_launch import Launch, assert_nothing_left

# A stress test of minutes of real processes: part of the heavy run (`pytest -m heavy`, in CI).
pytestmark = [pytest.mark.slow, pytest.mark.heavy]
REPLACED_WITHIN = 5.0  # seconds from a fault to a new process in that slot
FAULTS = 6  # actor faults, besides the one learner kill (each takes ~3-5 s: restart + start-up)


def slot_pid(run_dir: Path, slot: str) -> int | None:
    """Pid of the live process in a slot ("learner" or "--id N"), if any."""
    for pid, cmd in processes_mentioning(f"{run_dir}/config.yaml"):
        if (slot == "learner" and " learner " in cmd) or (
            slot != "learner" and re.search(rf"{slot}( |$)", cmd)
        ):
            return pid
    return None


def wait_for_new_process(run_dir: Path, slot: str, old_pid: int) -> float:
    started = time.monotonic()
    while time.monotonic() - started < 30:
        pid = slot_pid(run_dir, slot)
        if pid is not None and pid != old_pid:
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"slot {slot} never got a new process")


def test_random_kills_and_hangs_are_repaired_and_the_run_completes(run_root: Path) -> None:
    run_dir = run_root / "t"
    rng = random.Random(0)
    launch = Launch(
        tiny_overrides(
            run_root,
            actor__num_actors=3,
            learner__max_updates=1_000_000,
            learner__max_seconds=30,  # per learner incarnation: outlasts the faults after a restart
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__heartbeat_timeout=2.0,
            supervisor__restart_backoff=0.2,
            supervisor__restart_backoff_max=0.5,
            supervisor__max_restarts=50,
        )
    )
    wait_until((run_dir / "checkpoints" / "latest").is_file, 90, "the learner to be training")

    repairs: list[tuple[str, str, float]] = []
    learner_fault_at = rng.randrange(2, FAULTS - 2)
    for n in range(FAULTS + 1):
        if n == learner_fault_at:
            slot, how = "learner", signal.SIGKILL
        else:
            slot, how = f"--id {rng.randrange(3)}", rng.choice([signal.SIGKILL, signal.SIGSTOP])
        # Fault only a process that is up (heartbeating): one still importing torch is covered by
        # supervisor.startup_timeout, not by the heartbeat timeout this test measures.
        name = "learner-0" if slot == "learner" else f"actor-{slot.split()[-1]}"
        restarts = sum(1 for s_, _, _ in repairs if s_ == slot)
        run_state.wait_until_up(run_dir, name, 60, restarts=restarts, alive=launch.running)
        wait_until(lambda s=slot: slot_pid(run_dir, s) is not None, 10, f"a process in slot {slot}")
        pid = slot_pid(run_dir, slot)
        assert pid is not None
        time.sleep(rng.uniform(0.3, 1.0))  # the scenario: faults at random moments; nothing depends on it
        os.kill(pid, how)
        repairs.append((slot, signal.Signals(how).name, wait_for_new_process(run_dir, slot, pid)))

    code = launch.finish(timeout=180)
    summary = "\n".join(f"{slot:8} {how:8} replaced after {t:.2f} s" for slot, how, t in repairs)
    print("\n" + summary)
    assert code == 0, launch.output
    assert all(t < REPLACED_WITHIN for _, _, t in repairs), summary
    assert_nothing_left(run_dir)

    stats = run_state.run_stats(run_dir)
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["restarts"] == 1 and learner["updates"] > 0
    faults_per_actor = {i: sum(1 for slot, _, _ in repairs if slot == f"--id {i}") for i in range(3)}
    for row in stats["actors"]:
        assert row["restarts"] == faults_per_actor[row["actor_id"]], (row, faults_per_actor)
        assert row["weights_version"] <= learner["weights_version"], "an actor cannot be ahead of its learner"
    assert learner["resumed_from"]["updates"] >= 100, "the killed learner's replacement resumed"
