"""The exploration ladder past actor.num_actors: actors that compose (`--scale actor=N`) or a
StatefulSet adds beyond the configured count each explore at a rate of their own."""

from __future__ import annotations

import itertools

import pytest

from zmqrl.actor.exploration import apex_epsilon, extra_rung_position, ladder_epsilon
from zmqrl.actor.sampler import ladder
from zmqrl.config import Config


def test_extra_rungs_bisect_the_gaps_midpoints_first() -> None:
    assert [extra_rung_position(k, 2) for k in range(7)] == [0.5, 0.25, 0.75, 0.125, 0.375, 0.625, 0.875]
    # Three rungs (two gaps): both midpoints before any quarter point.
    assert [extra_rung_position(k, 3) for k in range(4)] == [0.25, 0.75, 0.125, 0.625]
    # One rung: first its other end, as a ladder of two would have it, then the bisection.
    assert [extra_rung_position(k, 1) for k in range(4)] == [1.0, 0.5, 0.25, 0.75]


def test_configured_rungs_are_unchanged() -> None:
    for n, i in itertools.product(range(1, 6), range(5)):
        if i < n:
            assert ladder_epsilon(i, n) == apex_epsilon(i, n)


@pytest.mark.parametrize(("num_actors", "envs"), [(1, 1), (2, 1), (3, 1), (2, 4), (4, 2)])
def test_every_actor_beyond_the_configured_count_explores_at_a_distinct_rate(
    num_actors: int, envs: int
) -> None:
    cfg = Config()
    cfg.actor.num_actors = num_actors
    cfg.actor.envs_per_actor = envs
    joined = num_actors + 9  # compose scaled far past the configured count
    rates = [float(e) for i in range(joined) for e in ladder(cfg, i)]
    assert len(set(rates)) == len(rates), f"two sub-envs share an epsilon: {rates}"
    low, high = cfg.actor.epsilon ** (1 + cfg.actor.epsilon_alpha), cfg.actor.epsilon
    assert all(low - 1e-12 <= r <= high + 1e-12 for r in rates), "every rate inside the ladder's span"
    # The configured actors keep the rates they had before anyone joined.
    rungs = num_actors * envs
    for i in range(num_actors):
        expected = [apex_epsilon(i * envs + j, rungs) for j in range(envs)]
        assert list(ladder(cfg, i)) == pytest.approx(expected)


def test_a_third_actor_of_two_is_no_copy_of_the_second() -> None:
    cfg = Config()  # actor.num_actors = 2, one env each: rungs 0.4 and 0.4 ** 8
    assert ladder(cfg, 2)[0] == pytest.approx(0.4**4.5), "halfway up the exponent, between the two"
    assert ladder(cfg, 2)[0] != ladder(cfg, 1)[0]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        extra_rung_position(-1, 2)
    with pytest.raises(ValueError):
        ladder_epsilon(3, 0)
