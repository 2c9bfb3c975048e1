"""Agents: each module holds one algorithm (config, networks, update) behind the core Agent contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zmqrl.agents.configs import DQNConfig
    from zmqrl.agents.dqn import DQNAgent
    from zmqrl.transport.wire import SampleSpec


def make_agent(
    config: DQNConfig,
    spec: SampleSpec,
    *,
    epsilon: float = 0.0,
    device: str | None = None,
    seed: int | None = None,
) -> DQNAgent:
    """The agent a config asks for, sized for the run's observation and action spaces."""
    from zmqrl.agents.dqn import DQNAgent

    if config.kind != "dqn":
        raise ValueError(f"agent.kind '{config.kind}' is not known (available: dqn)")
    if spec.num_actions is None:
        raise ValueError("agent.kind 'dqn' needs a Discrete action space; this env's actions are continuous")
    return DQNAgent(config, spec.obs_shape, spec.num_actions, epsilon=epsilon, device=device, seed=seed)
