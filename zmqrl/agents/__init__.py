"""Agents: each module holds one algorithm (config, networks, update) behind the core Agent contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zmqrl.agents.configs import AgentConfig, DQNConfig, SACConfig

if TYPE_CHECKING:
    import numpy as np

    from zmqrl.agents.dqn import DQNAgent
    from zmqrl.agents.sac import SACAgent
    from zmqrl.transport.wire import SampleSpec


def make_agent(
    config: AgentConfig,
    spec: SampleSpec,
    *,
    epsilon: float | np.ndarray = 0.0,
    device: str | None = None,
    seed: int | None = None,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
) -> DQNAgent | SACAgent:
    """The agent a config asks for, sized for the run's observation and action spaces.

    ``action_low`` / ``action_high`` (the env's ``action_space.low`` / ``.high``) are the bounds a
    continuous-action agent rescales its policy onto; None means [-1, 1]. Discrete agents ignore them.
    """
    if config.kind == "dqn" and isinstance(config, DQNConfig):
        from zmqrl.agents.dqn import DQNAgent

        if spec.num_actions is None:
            raise ValueError(
                f"agent.kind 'dqn' needs a Discrete action space; this env's actions are continuous "
                f"(Box of shape {spec.action_shape}): use agent.kind 'sac'"
            )
        return DQNAgent(config, spec.obs_shape, spec.num_actions, epsilon=epsilon, device=device, seed=seed)
    if config.kind == "sac" and isinstance(config, SACConfig):
        from zmqrl.agents.sac import SACAgent

        if spec.num_actions is not None:
            raise ValueError(
                f"agent.kind 'sac' needs a continuous (Box) action space; this env's actions are "
                f"Discrete({spec.num_actions}): use agent.kind 'dqn'"
            )
        if len(spec.action_shape) != 1:
            raise ValueError(
                f"agent.kind 'sac' needs a 1-D Box action space; this env's actions have shape "
                f"{spec.action_shape}"
            )
        return SACAgent(
            config,
            spec.obs_shape,
            spec.action_shape[0],
            action_low=action_low,
            action_high=action_high,
            epsilon=epsilon,
            device=device,
            seed=seed,
        )
    if config.kind in ("dqn", "sac"):
        raise ValueError(
            f"agent.kind '{config.kind}' does not match its config section {type(config).__name__}"
        )
    raise ValueError(f"agent.kind '{config.kind}' is not known (available: dqn, sac)")
