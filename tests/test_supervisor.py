"""The supervisor's restart policy, as a pure function of restart times."""

from __future__ import annotations

import pytest

from zmqrl.roles.supervisor import RestartPolicy


def test_restart_delay_doubles_with_each_recent_restart_up_to_the_maximum() -> None:
    policy = RestartPolicy(max_restarts=10, window=300.0, backoff=1.0, backoff_max=5.0)
    restarts: list[float] = []
    delays = []
    for now in range(6):
        delay = policy.delay(restarts, float(now))
        assert delay is not None
        delays.append(delay)
        restarts.append(float(now))
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_slot_that_used_its_restarts_within_the_window_stays_down() -> None:
    policy = RestartPolicy(max_restarts=3, window=60.0, backoff=0.5, backoff_max=30.0)
    assert policy.delay([10.0, 20.0, 30.0], now=40.0) is None


def test_restarts_older_than_the_window_are_forgiven() -> None:
    policy = RestartPolicy(max_restarts=3, window=60.0, backoff=0.5, backoff_max=30.0)
    assert policy.delay([10.0, 20.0, 30.0], now=85.0) == pytest.approx(1.0)  # only 30.0 is recent


def test_zero_restarts_allowed_means_never_restart() -> None:
    assert RestartPolicy(0, 60.0, 1.0, 1.0).delay([], now=0.0) is None
