"""What a run reports, as scripts read it: strict JSON, a target that was held, one time base."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides
from tests.test_launch import Launch, assert_nothing_left
from zmqrl.evaluator.greedy import EvalResult, EvalTracker
from zmqrl.strictjson import loads_strict


def result(mean: float) -> EvalResult:
    return EvalResult(mean, 0.0, [mean], [1])


def test_the_target_counts_as_held_only_after_k_evaluations_in_a_row() -> None:
    tracker = EvalTracker(target=100.0, hold=3)
    for updates, mean in enumerate([120.0, 20.0, 110.0, 105.0, 30.0, 101.0, 150.0, 100.0, 10.0]):
        tracker.add(result(mean), updates=updates)
    assert tracker.reached is not None and tracker.reached["updates"] == 0  # one lucky evaluation
    assert tracker.held is not None and tracker.held["updates"] == 7  # 101, 150, 100: three in a row


def test_held_survives_a_restart_of_the_tracker_midway_through_a_streak() -> None:
    first = EvalTracker(target=1.0, hold=2)
    first.add(result(5.0), updates=1)
    second = EvalTracker(target=1.0, hold=2)
    second.load_state(first.state())
    second.add(result(3.0), updates=2)
    assert second.held is not None and second.held["updates"] == 2


@pytest.mark.slow
def test_a_run_with_the_evaluator_writes_strict_json_on_one_time_base(run_root: Path) -> None:
    run_dir = run_root / "t"
    overrides = tiny_overrides(
        run_root,
        # The run ends when the evaluator has held the target, however slowly it starts (a fixed
        # update budget let a busy machine end the run before its second evaluation).
        learner__max_updates=1_000_000,
        learner__stop_at_target="true",
        learner__target_return=5.0,  # every CartPole episode scores at least this: reached and held
        learner__target_hold=2,
        evaluator__enabled="true",
        evaluator__episodes=2,
        evaluator__interval_seconds=0.5,
    )
    before = time.time()
    launch = Launch(overrides)
    assert launch.finish(timeout=180) == 0, launch.output
    assert_nothing_left(run_dir)

    for name in ("stats.json", "learner-stats.json", "evaluator-stats.json"):
        loads_strict((run_dir / name).read_text())  # raises on a bare NaN / Infinity
    stats = json.loads((run_dir / "stats.json").read_text())
    evaluator = stats["evaluator"]
    assert evaluator["evaluations"] >= 2
    history = evaluator["eval_history"]
    elapsed = time.time() - before
    # Seconds since the launch began: at least the learner's start-up, at most the whole run.
    assert all(0.0 < r["seconds"] <= elapsed for r in history), history
    assert all(r["env_steps"] >= 0 for r in history)
    assert "target return 5 first reached" in launch.output
    assert "target return held for 2 evaluations in a row from" in launch.output
    assert evaluator["target_held_time"] is not None
    # The learner's line comes before any actor's, and the learner's log points at the evaluator.
    finished = launch.output.index("learner finished")
    assert "actor-0 finished" not in launch.output[:finished]
    assert "| evaluator" in (run_dir / "logs" / "learner-0.log").read_text()
