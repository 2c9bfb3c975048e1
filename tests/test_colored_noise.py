"""Colored exploration noise (zmqrl.agents.colored_noise): its statistics, its draws, its config.

Each statistic is measured on what the noise hands out step by step, over many independent
sequences, against what the spectrum ``1/f**beta`` implies; the tolerances are several standard
errors of each estimate, given next to it. Seeds are fixed, so every number here is reproduced
exactly run to run.
"""

from __future__ import annotations

import numpy as np
import pytest

from zmqrl.agents.colored_noise import ColoredNoise, lag_autocorrelation
from zmqrl.agents.configs import SACConfig
from zmqrl.agents.numpy_policies import NumpySACPolicy
from zmqrl.agents.sac import SACAgent
from zmqrl.config import ConfigError, config_from_dict
from zmqrl.spec import SampleSpec

HORIZON = 256
ROWS = 64  # sub-envs: one independent sequence each


def noise_steps(
    beta: float, steps: int, rows: int = ROWS, horizon: int = HORIZON, seed: int = 0
) -> np.ndarray:
    """``(steps, rows)`` noise for one action dimension, as SAC draws it: one call per env step."""
    noise = ColoredNoise(beta, horizon)
    rng = np.random.default_rng(seed)
    return np.stack([noise(rng, (rows, 1))[:, 0] for _ in range(steps)])


def lag1_autocorrelation(x: np.ndarray) -> float:
    """Pooled over rows, around the known mean 0 (each step is N(0, 1) by construction)."""
    return float(np.sum(x[1:] * x[:-1]) / np.sum(x * x))


@pytest.mark.parametrize("beta", [0.0, 1.0, 2.0])
def test_each_step_is_standard_normal_marginally(beta: float) -> None:
    x = noise_steps(beta, steps=4 * HORIZON)  # 256 sequences of 256 steps
    # Red noise puts ~1/4 of its power in each sequence's constant term, so its mean and mean
    # square wander most: over 20 seeds their sd here is 0.03 (pink 0.02, white 0.005), and the
    # tolerances are ~4 of those.
    assert abs(x.mean()) < 0.12
    assert abs(np.mean(x**2) - 1.0) < 0.1
    # Not only the moments: the share beyond 1.96 sd is a normal's 5%.
    assert abs(np.mean(np.abs(x) > 1.96) - 0.05) < 0.02


def test_lag1_autocorrelation_is_zero_for_white_positive_for_pink_and_near_one_for_red() -> None:
    white, pink, red = (lag1_autocorrelation(noise_steps(beta, steps=HORIZON)) for beta in (0.0, 1.0, 2.0))
    # White: 16k products of independent N(0, 1) pairs, standard error 1/sqrt(16k) ~ 0.008.
    assert abs(white) < 0.04
    # Pink and red against the theory, the spectrum's cosine transform (0.72 and 0.986 at this
    # horizon). Over 20 seeds the estimates spread by sd 0.008 (pink) and 0.0012 (red); red's sits
    # ~0.004 low (a sequence's wrap-around is not in it), so 0.04 and 0.01 leave room for ~4 sd.
    assert 0.5 < lag_autocorrelation(1.0, HORIZON, 1) < 0.9 and lag_autocorrelation(2.0, HORIZON, 1) > 0.98
    assert abs(pink - lag_autocorrelation(1.0, HORIZON, 1)) < 0.04
    assert abs(red - lag_autocorrelation(2.0, HORIZON, 1)) < 0.01


@pytest.mark.parametrize("beta", [0.0, 1.0, 2.0])
def test_averaged_periodogram_falls_as_f_to_the_minus_beta(beta: float) -> None:
    x = noise_steps(beta, steps=HORIZON)  # exactly one sequence per row, so the FFT sees one each
    periodogram = np.mean(np.abs(np.fft.rfft(x, axis=0)) ** 2, axis=1)
    freqs = np.fft.rfftfreq(HORIZON)
    # The mid band (4/n to 64/n, 61 frequencies): above the cutoff and away from the Nyquist end.
    band = slice(4, 65)
    slope = np.polyfit(np.log(freqs[band]), np.log(periodogram[band]), 1)[0]
    # Each bin averages 64 exponential variables, so its log has sd ~1/8; over 20 seeds the fitted
    # slope spreads by sd 0.02 around -beta (no bias: the amplitudes are exactly f**(-beta/2)),
    # and 0.1 is 5 of those.
    assert abs(slope + beta) < 0.1


def test_white_is_the_old_draw_bit_for_bit() -> None:
    noise, rng, old = ColoredNoise(0.0, HORIZON), np.random.default_rng(7), np.random.default_rng(7)
    for shape in [(4, 3), (4, 3), (1, 3), (4, 3)]:
        np.testing.assert_array_equal(noise(rng, shape), old.standard_normal(shape, dtype=np.float32))


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_rows_are_independent(beta: float) -> None:
    x = noise_steps(beta, steps=4 * HORIZON)
    corr = np.corrcoef(x.T)  # rows x rows
    off_diagonal = corr[~np.eye(ROWS, dtype=bool)]
    # Two independent rows' correlation has sd ~1/sqrt(effective samples): ~0.08 for pink over
    # 1024 steps, far more for red (its steps are a few slow components), and the largest of the
    # 2016 pairs here is 0.28 and 0.61. What must hold: they centre on 0, and no pair is a copy.
    assert abs(off_diagonal.mean()) < 0.02
    assert np.max(np.abs(off_diagonal)) < 0.95


def test_a_new_sequence_per_horizon_and_on_a_new_batch_size() -> None:
    """After ``horizon`` steps, or when the batch of sub-envs changes, the next step is the first
    of new sequences drawn from the generator's state at that moment: as a fresh source's."""
    noise, rng = ColoredNoise(1.0, 8), np.random.default_rng(3)

    def first_of_fresh(shape: tuple[int, ...]) -> np.ndarray:
        fresh_rng = np.random.default_rng()
        fresh_rng.bit_generator.state = rng.bit_generator.state
        return ColoredNoise(1.0, 8)(fresh_rng, shape)

    for _ in range(8):
        noise(rng, (4, 2))
    expected = first_of_fresh((4, 2))
    np.testing.assert_array_equal(noise(rng, (4, 2)), expected)  # the first sequences used up
    noise(rng, (4, 2))
    expected = first_of_fresh((3, 2))
    np.testing.assert_array_equal(noise(rng, (3, 2)), expected)  # B 4 -> 3 after 2 steps, not 8


SPEC = SampleSpec((3,), "float32", (2,), "float32", action_low=(-1.0, 0.0), action_high=(1.0, 2.0))


def test_agent_and_numpy_policy_act_alike_with_pink_noise() -> None:
    config = SACConfig(hidden_sizes=[16, 16], device="cpu", noise_beta=1.0, noise_horizon=16)
    agent = SACAgent(config, SPEC, seed=5)
    policy = NumpySACPolicy(config, SPEC, seed=5)
    policy.load_weights(agent.export_weights())
    obs = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    actions = [agent.act(obs, explore=True) for _ in range(40)]  # past two sequences of 16
    for action in actions:
        np.testing.assert_array_equal(policy.act(obs, explore=True), action)


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("agent.noise_beta=3", "agent.noise_beta"),
        ("agent.noise_beta=-1", "agent.noise_beta"),
        ("agent.noise_horizon=1", "agent.noise_horizon"),
    ],
)
def test_out_of_range_noise_settings_are_refused_naming_the_key(setting: str, key: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=key):
        config_from_dict({"agent": {"kind": "sac"}, "env": {"id": "Pendulum-v1"}}, "test", [setting])
