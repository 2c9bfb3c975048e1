"""Greedy evaluation: several episodes played in lockstep so the policy runs once per step, batched."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from zmqrl.core import Agent


class EvalResult(NamedTuple):
    mean: float
    std: float
    returns: list[float]
    lengths: list[int]


def evaluate(agent: Agent, envs: list[gym.Env[Any, Any]], seed: int) -> EvalResult:
    """One greedy episode in each env (env i reset with ``seed + i``); returns their statistics."""
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns = [0.0] * len(envs)
    lengths = [0] * len(envs)
    live = list(range(len(envs)))
    while live:
        actions = agent.act(np.stack([obs[i] for i in live]), explore=False)
        still: list[int] = []
        for i, action in zip(live, actions, strict=True):
            obs[i], reward, terminated, truncated, _ = envs[i].step(action)
            returns[i] += float(reward)
            lengths[i] += 1
            if not (terminated or truncated):
                still.append(i)
        live = still
    return EvalResult(float(np.mean(returns)), float(np.std(returns)), returns, lengths)


def evaluate_checkpoint(
    path: Path, episodes: int, seed: int = 0, overrides: list[str] | None = None
) -> EvalResult:
    """Greedy episodes of a saved policy, on envs built from the config stored in the checkpoint
    (``overrides`` may change e.g. ``env.kwargs``)."""
    from zmqrl.agents import make_agent
    from zmqrl.checkpoint import load_checkpoint
    from zmqrl.config import config_from_dict
    from zmqrl.envs import make_env, sample_spec

    payload = load_checkpoint(path)
    cfg = config_from_dict(payload["config"], f"{path} (stored config)", overrides)
    envs = [make_env(cfg.env) for _ in range(episodes)]
    try:
        agent = make_agent(cfg.agent, sample_spec(envs[0]), device="cpu")
        agent.load_state_dict(payload["agent"])
        return evaluate(agent, envs, seed=seed)
    finally:
        for env in envs:
            env.close()
