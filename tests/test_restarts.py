"""The restart policy as pure functions (issue 23, item 3): how a death is classified from its exit
code and what the supervisor did, and what the policy decides after it."""

from __future__ import annotations

import pytest

from zmqrl.config import SupervisorConfig
from zmqrl.supervisor.restarts import (
    CRASHED,
    ENDED,
    HUNG,
    KILLED,
    NEEDS_OPERATOR,
    CrashRecord,
    Death,
    RestartPolicy,
    classify,
    ended_by_signal,
)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (0, ENDED),
        (1, CRASHED),
        (2, NEEDS_OPERATOR),
        (3, HUNG),
        (7, CRASHED),
        (-9, KILLED),  # SIGKILL: an operator, a chaos test, the OOM killer
        (-15, KILLED),
        (143, KILLED),  # a role that stopped itself on SIGTERM
        (130, KILLED),
        (137, KILLED),
        (-11, CRASHED),  # SIGSEGV: it brought that on itself
        (-6, CRASHED),  # SIGABRT
        (134, CRASHED),
    ],
)
def test_an_exit_code_alone_says_which_kind_of_death_it_was(code: int, kind: str) -> None:
    assert classify(code, killed_for=None, stopped=False, useful=True, healthy=False).kind == kind


def test_a_kill_by_the_supervisor_is_a_hang_unless_the_process_was_stopped_from_outside() -> None:
    silent = classify(-9, killed_for="no heartbeat for 3.1 s", stopped=False, useful=True, healthy=False)
    assert silent.kind == HUNG and "killed by the supervisor (no heartbeat" in silent.why
    stopped = classify(-9, killed_for="no heartbeat for 3.1 s", stopped=True, useful=True, healthy=False)
    assert stopped.kind == KILLED and stopped.why.startswith("stopped from outside")


def test_signal_exit_codes() -> None:
    assert ended_by_signal(-9) == 9 and ended_by_signal(143) == 15
    assert ended_by_signal(1) is None and ended_by_signal(128) is None and ended_by_signal(255) is None


def death(kind: str, *, useful: bool = True, healthy: bool = False) -> Death:
    return Death(kind, 1, "why", useful, healthy)


def defaults() -> RestartPolicy:
    return RestartPolicy.from_config(SupervisorConfig())


def test_needs_the_operator_is_given_up_at_once() -> None:
    decision = defaults().decide(CrashRecord(), death(NEEDS_OPERATOR), 1.0)
    assert decision.delay is None and not decision.counted


def test_kills_from_outside_of_a_working_process_never_grow_the_backoff_nor_count() -> None:
    """The chaos behaviour at defaults: 100 kills in 5 minutes, each replaced at the base delay."""
    policy, record = defaults(), CrashRecord()
    for i in range(100):
        decision = policy.decide(record, death(KILLED), i * 3.0)
        assert decision.delay == SupervisorConfig().restart_backoff and not decision.counted
    assert record.counted == []


@pytest.mark.parametrize("kind", [CRASHED, HUNG, KILLED])
def test_any_death_before_useful_work_counts_so_a_kill_at_every_start_is_capped(kind: str) -> None:
    policy, record = defaults(), CrashRecord()
    delays = []
    for i in range(20):
        decision = policy.decide(record, death(kind, useful=False), i * 10.0)
        delays.append(decision.delay)
        if decision.delay is None:
            break
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, None]


def test_crashes_after_useful_work_count_whatever_each_run_lasted() -> None:
    policy, record = defaults(), CrashRecord()
    decisions = [policy.decide(record, death(CRASHED), t) for t in (0.0, 240.0, 480.0, 720.0, 960.0, 1200.0)]
    assert [d.delay for d in decisions] == [0.5, 1.0, 2.0, 4.0, 8.0, None]


def test_the_backoff_stops_doubling_at_its_maximum() -> None:
    policy, record = (
        RestartPolicy(max_restarts=50, window=3600.0, backoff=1.0, backoff_max=5.0),
        CrashRecord(),
    )
    delays = [policy.decide(record, death(CRASHED), float(t)).delay for t in range(6)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_healthy_run_forgives_the_record() -> None:
    policy, record = defaults(), CrashRecord()
    for t in range(4):
        policy.decide(record, death(CRASHED), float(t))
    decision = policy.decide(record, death(CRASHED, healthy=True), 10.0)
    assert decision.delay == 0.5 and not decision.counted and record.counted == []


def test_failures_older_than_the_window_do_not_count_towards_the_cap() -> None:
    policy, record = RestartPolicy(max_restarts=3, window=60.0, backoff=0.5, backoff_max=30.0), CrashRecord()
    for t in (10.0, 20.0, 30.0):
        assert policy.decide(record, death(CRASHED), t).delay is not None
    assert policy.decide(record, death(CRASHED), 85.0).delay is not None  # 30 and 85 are recent
    assert policy.decide(record, death(CRASHED), 86.0).delay is not None
    assert policy.decide(record, death(CRASHED), 87.0).delay is None


def test_zero_restarts_allowed_means_a_crash_is_never_restarted() -> None:
    assert RestartPolicy(0, 60.0, 1.0, 1.0).decide(CrashRecord(), death(CRASHED), 5.0).delay is None
