"""When a run ends (StopPolicy, asked by the learner process and serial mode alike), and the test
faults a role is given instead of reading the environment on its main path (Faults)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from zmqrl.config import LearnerConfig
from zmqrl.learner.stopping import (
    ENDED_MAX_SECONDS,
    ENDED_MAX_STEPS,
    ENDED_MAX_UPDATES,
    ENDED_TARGET_HELD,
    StopPolicy,
)
from zmqrl.runtime.testhooks import (
    CRASH_AFTER_UPDATES,
    DEADLOCK_ONCE,
    HOOKS_ENV,
    INGEST_FAULT_ONCE,
    Faults,
)


def policy(**learner: object) -> StopPolicy:
    stop = StopPolicy(dataclasses.replace(LearnerConfig(), **learner))  # type: ignore[arg-type]
    stop.start(100.0)
    return stop


def test_a_run_goes_on_until_max_updates_or_max_seconds() -> None:
    stop = policy(max_updates=50, max_seconds=10.0)
    assert stop.check(49, 110.0) is None
    assert stop.check(50, 105.0) == ENDED_MAX_UPDATES
    late = policy(max_updates=50, max_seconds=10.0)
    assert late.check(10, 110.5) == ENDED_MAX_SECONDS
    assert late.check(50, 111.0) == ENDED_MAX_SECONDS, "the first reason found is kept"
    assert policy(max_updates=50, max_seconds=None).check(10, 1e9) is None


def test_max_updates_wins_over_max_seconds_at_the_same_check() -> None:
    assert policy(max_updates=50, max_seconds=1.0).check(50, 200.0) == ENDED_MAX_UPDATES


def test_the_target_ends_the_run_only_with_stop_at_target() -> None:
    keen = policy(stop_at_target=True, target_return=100.0)
    assert not keen.evaluated(holding=False) and keen.ended is None
    assert keen.evaluated(holding=True) and keen.check(0, 100.0) == ENDED_TARGET_HELD
    patient = policy(stop_at_target=False, target_return=100.0)
    assert not patient.evaluated(holding=True) and patient.check(0, 100.0) is None
    # The supervisor's word for a separate evaluator's target, likewise; every actor done always.
    assert not patient.end_requested(ENDED_TARGET_HELD) and patient.ended is None
    assert not patient.end_requested("something else") and patient.ended is None
    assert patient.end_requested(ENDED_MAX_STEPS) and patient.ended == ENDED_MAX_STEPS
    assert policy(stop_at_target=True, target_return=1.0).end_requested(ENDED_TARGET_HELD)


def test_a_later_reason_does_not_replace_the_first() -> None:
    stop = policy(max_updates=50, stop_at_target=True, target_return=1.0)
    assert stop.check(50, 100.0) == ENDED_MAX_UPDATES
    assert not stop.evaluated(holding=True), "the final evaluation of a finished run"
    stop.end(ENDED_MAX_STEPS)
    assert stop.ended == ENDED_MAX_UPDATES


def test_faults_are_read_from_the_environment_at_the_process_main_only(tmp_path: Path) -> None:
    assert Faults.from_env({}) is None, "outside tests a role is given no faults"
    marker = tmp_path / "fired"
    faults = Faults.from_env({HOOKS_ENV: f"{CRASH_AFTER_UPDATES}=5, {INGEST_FAULT_ONCE}={marker}"})
    assert faults is not None
    # CRASH_AFTER_UPDATES counts this process's own updates, whatever it resumed from.
    update = faults.update(lambda batch: batch * 2)
    assert [update(i) for i in range(4)] == [0, 2, 4, 6]
    with pytest.raises(RuntimeError, match="fails at update 5"):
        update(4)
    # A once-hook fires in the first process to find its marker absent (here: at the second add,
    # so a learner has taken data before its replay fails), and never again.
    added: list[int] = []
    add = faults.replay_add(added.append)
    add(1)
    with pytest.raises(RuntimeError, match="replay add failed"):
        add(2)
    add(3)
    assert added == [1, 3] and marker.exists()
    again = Faults({INGEST_FAULT_ONCE: str(marker)}).replay_add(added.append)
    again(4)
    again(5)
    assert added == [1, 3, 4, 5], "another process finds the marker: no fault"


def test_a_role_given_no_faults_runs_its_own_parts_unwrapped() -> None:
    quiet = Faults({})

    def update(batch: int) -> int:
        return batch

    assert quiet.update(update) is update and quiet.replay_add(update) is update
    sampler = SimpleNamespace(steps=10_000, collect=lambda budget: budget)
    assert quiet.sampler(sampler).collect(3) == 3, "ACTOR_HANG_ONCE is off: the sampler is as it was"
    assert not Faults({DEADLOCK_ONCE: ""}).fire_once(DEADLOCK_ONCE), "a once-hook needs a marker"
