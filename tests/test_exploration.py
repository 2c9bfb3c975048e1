"""Tests for zmqrl.actor.exploration: the Ape-X epsilon ladder and LinearSchedule."""

from __future__ import annotations

import itertools

import pytest

from zmqrl.actor.exploration import LinearSchedule, apex_epsilon


def test_single_actor_gets_base() -> None:
    assert apex_epsilon(0, 1) == pytest.approx(0.4)
    assert apex_epsilon(0, 1, base=0.25, alpha=3.0) == pytest.approx(0.25)


def test_endpoints() -> None:
    n = 16
    assert apex_epsilon(0, n) == pytest.approx(0.4)
    assert apex_epsilon(n - 1, n) == pytest.approx(0.4**8)  # base ** (1 + alpha)
    assert apex_epsilon(n - 1, n, base=0.5, alpha=2.0) == pytest.approx(0.125)


def test_known_value_n8_i3() -> None:
    # 0.4 ** (1 + 7 * 3 / 7) = 0.4 ** 4
    assert apex_epsilon(3, 8) == pytest.approx(0.0256)


def test_monotonically_decreasing() -> None:
    eps = [apex_epsilon(i, 32) for i in range(32)]
    assert all(a > b for a, b in itertools.pairwise(eps))
    assert all(0.0 < e <= 0.4 for e in eps)


def test_alpha_zero_is_flat() -> None:
    assert [apex_epsilon(i, 4, alpha=0.0) for i in range(4)] == pytest.approx([0.4] * 4)


@pytest.mark.parametrize(
    ("index", "num_actors", "base", "alpha"),
    [
        (-1, 4, 0.4, 7.0),
        (4, 4, 0.4, 7.0),
        (0, 0, 0.4, 7.0),
        (0, 4, -0.1, 7.0),
        (0, 4, 1.1, 7.0),
        (0, 4, 0.4, -1.0),
    ],
)
def test_invalid_args_raise(index: int, num_actors: int, base: float, alpha: float) -> None:
    with pytest.raises(ValueError):
        apex_epsilon(index, num_actors, base=base, alpha=alpha)


def test_linear_schedule_endpoints_and_midpoint() -> None:
    sched = LinearSchedule(1.0, 0.1, 1000)
    assert sched(0) == pytest.approx(1.0)
    assert sched(500) == pytest.approx(0.55)
    assert sched(1000) == pytest.approx(0.1)


def test_linear_schedule_clamps() -> None:
    sched = LinearSchedule(1.0, 0.1, 1000)
    assert sched(-5) == pytest.approx(1.0)
    assert sched(10**9) == pytest.approx(0.1)


def test_linear_schedule_increasing_and_zero_duration() -> None:
    assert LinearSchedule(0.0, 2.0, 4)(1) == pytest.approx(0.5)
    assert LinearSchedule(1.0, 0.0, 0)(0) == 0.0


def test_linear_schedule_negative_duration_raises() -> None:
    with pytest.raises(ValueError):
        LinearSchedule(1.0, 0.0, -1)
