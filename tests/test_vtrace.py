"""V-trace against the paper's definition, computed step by step in numpy, and its limits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zmqrl.agents.vtrace import vtrace

torch.set_num_threads(1)


def reference(
    behaviour: np.ndarray,
    target: np.ndarray,
    rewards: np.ndarray,
    discounts: np.ndarray,
    values: np.ndarray,
    bootstrap: np.ndarray,
    rho_bar: float,
    c_bar: float,
    pg_rho_bar: float,
) -> tuple[np.ndarray, np.ndarray]:
    """IMPALA's eq. (1) as a sum, not a recursion, in float64, one row and one step at a time:
    vs_s = v_s + sum_{t>=s} (prod_{s<=i<t} discount_i c_i) delta_t."""
    rows, steps = values.shape
    vs = np.zeros((rows, steps))
    advantages = np.zeros((rows, steps))
    for r in range(rows):
        v = [*values[r].tolist(), float(bootstrap[r])]
        ratio = [float(np.exp(target[r, t] - behaviour[r, t])) for t in range(steps)]
        for s in range(steps):
            total, trace = 0.0, 1.0
            for t in range(s, steps):
                delta = min(rho_bar, ratio[t]) * (rewards[r, t] + discounts[r, t] * v[t + 1] - v[t])
                total += trace * delta
                trace *= discounts[r, t] * min(c_bar, ratio[t])
            vs[r, s] = v[s] + total
        for s in range(steps):
            next_vs = vs[r, s + 1] if s + 1 < steps else v[steps]
            target_value = rewards[r, s] + discounts[r, s] * next_vs
            advantages[r, s] = min(pg_rho_bar, ratio[s]) * (target_value - v[s])
    return vs, advantages


def random_rollouts(rng: np.random.Generator, gamma: float = 0.97) -> dict[str, np.ndarray]:
    """Rows of random length with terminations and truncations (both zero the discount), and
    log-ratios that put pi/mu on both sides of every bar."""
    rows, steps = int(rng.integers(1, 7)), int(rng.integers(1, 12))
    done = rng.random((rows, steps)) < 0.2
    return {
        "behaviour": rng.normal(-1.0, 0.5, (rows, steps)),
        "target": rng.normal(-1.0, 0.5, (rows, steps)) + rng.choice([-1.0, 0.0, 1.0], (rows, steps)),
        "rewards": rng.normal(size=(rows, steps)),
        "discounts": gamma * (~done),
        "values": rng.normal(size=(rows, steps)),
        "bootstrap": rng.normal(size=rows),
    }


def run(data: dict[str, np.ndarray], *bars: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tensors = [torch.tensor(data[k], dtype=torch.float64) for k in data]
    out = vtrace(*tensors, *bars)
    return out.vs.numpy(), out.pg_advantages.numpy(), out.rhos.numpy()


@pytest.mark.parametrize("bars", [(1.0, 1.0, 1.0), (0.8, 0.9, 1.3), (1.7, 0.5, 0.6)])
def test_vtrace_matches_the_papers_sum_on_random_rollouts(bars: tuple[float, float, float]) -> None:
    rng = np.random.default_rng(round(sum(bars) * 10))
    clipped_both_ways = [False, False]
    for _ in range(30):
        data = random_rollouts(rng)
        vs, advantages, rhos = run(data, *bars)
        want_vs, want_advantages = reference(*data.values(), *bars)
        np.testing.assert_allclose(vs, want_vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(advantages, want_advantages, rtol=1e-10, atol=1e-10)
        ratios = np.exp(data["target"] - data["behaviour"])
        np.testing.assert_allclose(rhos, np.minimum(bars[0], ratios), rtol=1e-12)
        clipped_both_ways[0] |= bool((ratios < min(bars)).any())
        clipped_both_ways[1] |= bool((ratios > max(bars)).any())
    assert all(clipped_both_ways)


def test_vtrace_runs_in_float32_as_the_agent_calls_it() -> None:
    data = random_rollouts(np.random.default_rng(5))
    tensors = [torch.tensor(data[k], dtype=torch.float32) for k in data]
    out = vtrace(*tensors, 0.9, 0.8, 1.1)
    want_vs, want_advantages = reference(*data.values(), 0.9, 0.8, 1.1)
    assert out.vs.dtype == torch.float32
    np.testing.assert_allclose(out.vs.numpy(), want_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), want_advantages, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_is_the_bootstrapped_discounted_return_cut_at_dones() -> None:
    """pi == mu with the bars at 1: vs_t = r_t + discount_t vs_{t+1} (n-step, lambda = 1), the
    row's last value bootstrapping; advantages are r_t + discount_t vs_{t+1} - v_t."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        data = random_rollouts(rng)
        data["target"] = data["behaviour"].copy()
        vs, advantages, rhos = run(data, 1.0, 1.0, 1.0)
        rows, steps = data["values"].shape
        returns = np.zeros((rows, steps))
        for r in range(rows):
            ret = data["bootstrap"][r]
            for t in reversed(range(steps)):
                ret = data["rewards"][r, t] + data["discounts"][r, t] * ret
                returns[r, t] = ret
        np.testing.assert_allclose(vs, returns, rtol=1e-10, atol=1e-10)
        next_returns = np.concatenate([returns[:, 1:], data["bootstrap"][:, None]], axis=1)
        one_step = data["rewards"] + data["discounts"] * next_returns - data["values"]
        np.testing.assert_allclose(advantages, one_step, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(rhos, 1.0)


@pytest.mark.parametrize("extreme", [-1e30, 1e30, -3e38, 3e38, 88.0, -104.0])
def test_an_extreme_log_probability_gives_finite_targets(extreme: float) -> None:
    data = random_rollouts(np.random.default_rng(3))
    data["behaviour"][0, 0] = extreme
    tensors = [torch.tensor(data[k], dtype=torch.float32) for k in data]
    out = vtrace(*tensors, 1.0, 1.0, 1.0)
    for tensor in out:
        assert torch.isfinite(tensor).all()


def test_mismatched_shapes_are_refused() -> None:
    data = random_rollouts(np.random.default_rng(4))
    tensors = [torch.tensor(data[k]) for k in data]
    with pytest.raises(ValueError, match="rewards"):
        vtrace(tensors[0], tensors[1], tensors[2][:, :-1], *tensors[3:])
    with pytest.raises(ValueError, match="bootstrap"):
        vtrace(*tensors[:5], tensors[5][:0])
