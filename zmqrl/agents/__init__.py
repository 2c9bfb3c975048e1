"""Agents: built through the registry, a learning side for the learner and an acting side for actors.

``make_learner`` / ``make_policy`` look up ``config.kind`` in :mod:`zmqrl.agents.registry`, check
the settings against the env's spaces and the machine, then call the plugin's factory. Importing
this package imports no torch: a DQN actor with an MLP acts in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zmqrl.agents.configs import AgentConfig, AgentConfigBase, DQNConfig, SACConfig
from zmqrl.agents.registry import AgentPlugin, agent_names, get_agent, register_agent, unregister_agent
from zmqrl.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from zmqrl.core import LearningAgent, Policy
    from zmqrl.spec import SampleSpec

__all__ = [
    "AgentConfig",
    "AgentConfigBase",
    "AgentPlugin",
    "DQNConfig",
    "SACConfig",
    "agent_names",
    "get_agent",
    "make_learner",
    "make_policy",
    "register_agent",
    "unregister_agent",
]


def make_learner(
    config: Any,
    spec: SampleSpec,
    *,
    seed: int | None = None,
    device: str | None = None,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
) -> LearningAgent:
    """The learning side of the agent ``config.kind`` names, sized for the run's spaces.

    ``device`` None: the config's own. ``action_low`` / ``action_high`` (the env's Box bounds; None
    means [-1, 1]) are what a continuous-action agent rescales its policy onto.

    Settings that cannot work with this env or machine raise :class:`~zmqrl.errors.ConfigError`
    before anything is built, so the CLI exits 2 with one line. Any ValueError from the factories
    themselves is left alone: past these checks it is a bug.
    """
    plugin = _checked_plugin(config, spec, device, action_low, action_high)
    return plugin.make_learner(
        config, spec, seed=seed, device=device, action_low=action_low, action_high=action_high
    )


def make_policy(
    config: Any,
    spec: SampleSpec,
    *,
    seed: int | None = None,
    epsilon: float | np.ndarray = 0.0,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
) -> Policy:
    """The acting side (on the CPU) of the agent ``config.kind`` names: the plugin's own policy
    (torch-free where the agent allows), else its learner built on the CPU. Errors as for
    :func:`make_learner`."""
    plugin = _checked_plugin(config, spec, "cpu", action_low, action_high)
    if plugin.make_policy is None:
        learner = plugin.make_learner(
            config, spec, seed=seed, device="cpu", action_low=action_low, action_high=action_high
        )
        learner.epsilon = epsilon
        return learner
    return plugin.make_policy(
        config, spec, seed=seed, epsilon=epsilon, action_low=action_low, action_high=action_high
    )


def _checked_plugin(
    config: Any,
    spec: SampleSpec,
    device: str | None,
    action_low: np.ndarray | None,
    action_high: np.ndarray | None,
) -> AgentPlugin:
    plugin = get_agent(config.kind)
    # The config loader only builds the kind's own class: a mismatch is a caller's bug.
    if type(config) is not plugin.config_class:
        raise ValueError(
            f"agent.kind {config.kind!r} needs a {plugin.config_class.__name__}, got {type(config).__name__}"
        )
    check = getattr(config, "check", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if plugin.check is not None and (problem := plugin.check(config, spec, device, action_low, action_high)):
        raise ConfigError(problem)
    return plugin
