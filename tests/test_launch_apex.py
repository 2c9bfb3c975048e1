"""`zmqrl launch` with the Ape-X features all on, as separate OS processes: prioritized replay fed
by actor priorities, the replay-ratio limiter, vectorized actors and the evaluator process; and the
limiter surviving paused actors and a killed learner without deadlocking."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import zmq

from tests import run_state
from tests.conftest import processes_mentioning, tiny_overrides, wait_until
from tests.test_launch import REPO, Launch, assert_nothing_left
from zmqrl.runtime.testhooks import HOOKS_ENV, INGEST_FAULT_ONCE

pytestmark = pytest.mark.slow


def apex_overrides(run_root: Path, **extra: object) -> list[str]:
    values: dict[str, object] = {
        "replay__prioritized": True,
        "learner__samples_per_insert": 8.0,
        "learner__samples_per_insert_tolerance": 500,
        "learner__max_policy_lag": 1000,
        "actor__num_actors": 2,
        "actor__envs_per_actor": 2,
        "evaluator__enabled": True,
        "evaluator__episodes": 2,
        "evaluator__interval_seconds": 0.5,
        "learner__target_return": 1.0,  # reached by any policy: exercises the evaluator's report
    }
    values.update(extra)
    return tiny_overrides(run_root, **values)


def test_apex_run_with_evaluator_finishes_and_reports_everything(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch = Launch(apex_overrides(run_root, learner__max_updates=400))
    code = launch.finish(timeout=180)
    assert code == 0, launch.output
    assert_nothing_left(run_dir)
    out = launch.output
    assert "evaluator: " in out and "target return 1 first reached" in out, out

    stats = run_state.run_stats(run_dir)
    learner, evaluator = stats["learner"], stats["evaluator"]
    assert learner["state"] == "finished" and learner["updates"] == 400 and learner["bad_messages"] == 0
    # 400 updates of 32 at 8 sampled per inserted: the learner waited for data rather than overfit.
    assert learner["samples_per_insert"] <= 8.0 + 500 * 8 / learner["samples"] + 0.5
    assert learner["eval_history"] == [], "with an evaluator process the learner does not evaluate"
    assert evaluator["evaluations"] >= 1 and evaluator["state"] == "stopped", evaluator
    assert evaluator["evaluated_version"] == learner["weights_version"], "the final weights get scored"
    assert {row["actor_id"] for row in stats["actors"]} == {0, 1}

    best = torch.load(run_dir / "checkpoints" / "best", weights_only=True)
    assert best["contents"] == "weights"
    videos = run_root / "videos"
    best_path = str(run_dir / "checkpoints" / "best")
    played = subprocess.run(
        [sys.executable, "-m", "zmqrl", "eval", best_path, "--episodes", "2", "--video", str(videos)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stderr
    assert "mean return" in played.stdout
    recorded = sorted(videos.glob("*.mp4"))
    assert len(recorded) == 2 and all(p.stat().st_size > 0 for p in recorded), played.stdout
    assert all(f"video: {p}" in played.stdout for p in recorded)


@pytest.mark.heavy  # liveness under faults, 35+ s each: the heavy run
def test_limited_run_survives_paused_actors_and_a_killed_learner(run_root: Path) -> None:
    run_dir = run_root / "t"
    launch = Launch(
        apex_overrides(
            run_root,
            evaluator__enabled=False,
            learner__max_updates=1_000_000,
            learner__max_seconds=20,  # per learner incarnation: outlasts slow actor start-ups and the pause
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__heartbeat_timeout=15.0,
            supervisor__restart_backoff=0.2,
        )
    )
    wait_until((run_dir / "checkpoints" / "latest").is_file, 90, "the learner to be training")
    actors = [pid for pid, cmd in processes_mentioning(f"{run_dir}/config.yaml") if " actor " in cmd]
    assert len(actors) == 2
    # The learner republishes its weights from its main loop: hearing them says the loop goes round.
    ctx = zmq.Context()
    weights = ctx.socket(zmq.SUB)
    weights.setsockopt(zmq.SUBSCRIBE, b"")
    weights.connect(run_state.wait_for_launched_endpoints(run_dir, 10)["weights"])
    for pid in actors:
        os.kill(pid, signal.SIGSTOP)

    def waiting_alive() -> bool:
        """Over a second, the learner's update count (its heartbeats, in the supervisor's snapshot)
        stays put while its weights keep being republished: it ran out of allowed updates and
        waits, and its loop still goes round: no deadlock."""
        before = run_state.snapshot(run_dir)
        heard, until = 0, time.monotonic() + 1.0
        while (left := until - time.monotonic()) > 0:
            if weights.poll(max(1, int(left * 1000))):
                weights.recv_multipart()
                heard += 1
        after = run_state.snapshot(run_dir)
        return before is not None and after is not None and 0 < before.updates == after.updates and heard >= 2

    try:
        # Well within heartbeat_timeout: the paused actors must not be judged dead meanwhile.
        wait_until(waiting_alive, 8, "the learner to wait for data while the actors are paused")
    finally:
        weights.close(linger=0)
        ctx.term()
    for pid in actors:
        os.kill(pid, signal.SIGCONT)
    learner = [pid for pid, cmd in processes_mentioning(f"{run_dir}/config.yaml") if " learner " in cmd]
    assert len(learner) == 1
    os.kill(learner[0], signal.SIGKILL)

    code = launch.finish(timeout=120)
    assert code == 0, launch.output
    assert_nothing_left(run_dir)
    stats = run_state.run_stats(run_dir)
    learner_stats = stats["learner"]
    assert learner_stats["state"] == "finished" and learner_stats["restarts"] == 1
    assert learner_stats["resumed_from"]["updates"] >= 100, "the replacement resumed from a checkpoint"
    assert learner_stats["updates"] > 100, "the resumed learner trained on the actors' new data"
    assert all(row["restarts"] == 0 for row in stats["actors"]), "paused actors are not replaced"


@pytest.mark.heavy  # liveness under faults, 35+ s each: the heavy run
def test_actors_stay_up_through_a_failed_learner_and_feed_its_replacement(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learner that fails by exception announces it on the weights channel. Hand-started actors
    leave with it, but under the supervisor the learner is restarted, so its actors stay. (The
    fault is a bug, exit 1: a checkpoint that cannot be written is the operator's, exit 2, and
    the supervisor gives that learner up at once.)"""
    run_dir = run_root / "t"
    marker = tmp_path / "fired"
    marker.touch()  # present: the hook is off until the test removes it
    monkeypatch.setenv(HOOKS_ENV, f"{INGEST_FAULT_ONCE}={marker}")  # inherited by every process
    launch = Launch(
        tiny_overrides(
            run_root,
            actor__num_actors=2,
            learner__max_updates=1_000_000,
            learner__max_seconds=30,  # per learner incarnation; outlasts slow start-ups
            learner__checkpoint_interval=50,
            learner__eval_interval=0,
            supervisor__restart_backoff=1.0,
        )
    )
    checkpoints = run_dir / "checkpoints"
    wait_until((checkpoints / "latest").is_file, 90, "the learner to be training")
    assert "learner finished" not in launch.output, f"the learner ended before the fault:\n{launch.output}"
    marker.unlink()  # the next batch the learner accepts raises as it is inserted
    # Each step waited on in turn, so that a failure says which one did not happen (the hook
    # recreates the marker when it fires).
    try:
        wait_until(marker.is_file, 30, "the learner's ingest fault to fire")
        launch.wait_for("learner-0 exited with code 1", 30)
    except AssertionError as exc:
        learner_log = run_dir / "logs" / "learner-0.log"
        tail = "\n".join(learner_log.read_text().splitlines()[-40:]) if learner_log.is_file() else "(none)"
        raise AssertionError(f"{exc}\nlearner-0.log, last lines:\n{tail}\nlaunch:\n{launch.output}") from None

    code = launch.finish(timeout=120)
    assert code == 0, launch.output
    assert_nothing_left(run_dir)
    stats = run_state.run_stats(run_dir)
    assert stats["learner"]["state"] == "finished" and stats["learner"]["restarts"] == 1
    resumed = stats["learner"]["resumed_from"]
    assert stats["learner"]["samples"] > resumed["samples"], "the same actors fed the new learner"
    assert all(row["restarts"] == 0 and row["state"] == "stopped" for row in stats["actors"]), stats["actors"]
    for i in range(2):
        assert "the learner failed; acting on" in (run_dir / "logs" / f"actor-{i}.log").read_text()
