"""One learner training step with uniform vs prioritized replay, side by side in one run.

A training step is what the learner's main loop does per update: sample a batch, update the agent,
and (PER) write the batch's new priorities back. Replay holds 50,000 CartPole-shaped rows; the
agent is the CartPole config's DQN (128x128, batch 64) on one CPU thread. Prints the best of five
rounds of 500 steps for each variant and the PER/uniform ratio.

    python benchmarks/train_step_bench.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.replay import PrioritizedReplay, UniformReplay
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

ROWS = 50_000
BATCH = 64
ROUNDS, STEPS, WARMUP = 5, 500, 200
R = TypeVar("R", UniformReplay, PrioritizedReplay)


def filled(buffer: R, rng: np.random.Generator) -> R:
    obs = rng.normal(size=(ROWS, 4)).astype(np.float32)
    buffer.add(
        TransitionBatch(
            obs,
            rng.integers(0, 2, ROWS),
            np.ones(ROWS, np.float32),
            np.roll(obs, -1, axis=0),
            np.full(ROWS, 0.97, np.float32),
        )
    )
    return buffer


def best_seconds(step: Callable[[DQNAgent], None]) -> float:
    spec = SampleSpec((4,), "float32", (), "int64", num_actions=2)
    agent = DQNAgent(DQNConfig(hidden_sizes=[128, 128], batch_size=BATCH, device="cpu"), spec, seed=0)
    for _ in range(WARMUP):
        step(agent)
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(STEPS):
            step(agent)
        best = min(best, (time.perf_counter() - start) / STEPS)
    return best


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    uniform = filled(UniformReplay(ROWS, (4,), np.float32, (), np.int64, seed=0), rng)
    per = filled(PrioritizedReplay(ROWS, (4,), np.float32, (), np.int64, seed=0, alpha=0.6), rng)

    def uniform_step(agent: DQNAgent) -> None:
        batch = uniform.sample(BATCH).batch
        assert isinstance(batch, TransitionBatch)
        agent.update(batch)

    def per_step(agent: DQNAgent) -> None:
        batch, ids, weights = per.sample_prioritized(BATCH, beta=0.5)
        per.update_priorities(ids, agent.update(batch, weights).td_errors)

    u = best_seconds(uniform_step)
    p = best_seconds(per_step)
    print(f"{'training step (batch 64)':32s} {'µs':>8s}")
    print(f"{'uniform: sample + update':32s} {u * 1e6:8.0f}")
    print(f"{'PER: sample + update + priorities':32s} {p * 1e6:8.0f}")
    print(f"PER/uniform: {p / u:.2f}")


if __name__ == "__main__":
    main()
