"""Agents: built through the registry, a learning side for the learner and an acting side for actors.

``make_learner`` / ``make_policy`` look up ``config.kind`` in :mod:`zmqrl.agents.registry`, check
the settings against the env's spaces (the run's ``SampleSpec``, action bounds included) and the
machine, then call the plugin's factory; ``make_priorities`` gives Ape-X actors the plugin's
initial priorities, if it has them. Importing this package imports no torch: a DQN actor with an
MLP acts in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from zmqrl.agents.configs import AgentConfig, AgentConfigBase, DQNConfig, SACConfig
from zmqrl.agents.legacy import LegacyAgent, legacy_keywords, narrowed
from zmqrl.agents.registry import (
    AgentPlugin,
    PriorityFn,
    agent_names,
    get_agent,
    register_agent,
    unregister_agent,
)
from zmqrl.errors import ConfigError

if TYPE_CHECKING:
    from zmqrl.core import LearningAgent, Policy
    from zmqrl.spec import SampleSpec

__all__ = [
    "AgentConfig",
    "AgentConfigBase",
    "AgentPlugin",
    "DQNConfig",
    "PriorityFn",
    "SACConfig",
    "agent_names",
    "get_agent",
    "is_on_policy",
    "make_learner",
    "make_policy",
    "make_priorities",
    "register_agent",
    "store_label",
    "unregister_agent",
    "uses_sequences",
]


def is_on_policy(config: AgentConfigBase) -> bool:
    """Whether ``config.kind`` learns from rollouts (a queue, no replay): see AgentPlugin.on_policy."""
    return bool(get_agent(config.kind).on_policy)


def uses_sequences(config: AgentConfigBase) -> bool:
    """Whether ``config.kind`` learns from replayed sequences (R2D2): see AgentPlugin.sequences."""
    return bool(get_agent(config.kind).sequences)


def store_label(config: AgentConfigBase) -> str:
    """What the learner keeps ``config.kind``'s samples in: "queue" (on-policy rollouts) or "replay"."""
    return "queue" if is_on_policy(config) else "replay"


def make_learner(
    config: AgentConfigBase, spec: SampleSpec, *, seed: int | None = None, device: str | None = None
) -> LearningAgent:
    """The learning side of the agent ``config.kind`` names, sized for the run's spaces.

    ``device`` None: the config's own. A continuous-action agent rescales its policy onto the
    spec's action bounds.

    Settings that cannot work with this env or machine raise :class:`~zmqrl.errors.ConfigError`
    before anything is built, so the CLI exits 2 with one line. Any ValueError from the factories
    themselves is left alone: past these checks it is a bug.
    """
    plugin = _checked_plugin(config, spec, device)
    factory = plugin.make_learner
    agent = factory(config, spec, seed=seed, device=device, **legacy_keywords(factory, spec))
    return cast("LearningAgent", narrowed(agent))


def make_policy(config: AgentConfigBase, spec: SampleSpec, *, seed: int | None = None) -> Policy:
    """The acting side (on the CPU) of the agent ``config.kind`` names: the plugin's own policy
    (torch-free where the agent allows), else its learner built on the CPU. Errors as for
    :func:`make_learner`."""
    plugin = _checked_plugin(config, spec, "cpu")
    if plugin.make_policy is None:
        learner = plugin.make_learner
        return narrowed(learner(config, spec, seed=seed, device="cpu", **legacy_keywords(learner, spec)))
    factory = plugin.make_policy
    return cast("Policy", narrowed(factory(config, spec, seed=seed, **legacy_keywords(factory, spec))))


def make_priorities(config: AgentConfigBase, policy: Policy) -> PriorityFn | None:
    """Ape-X actors' initial priorities under ``policy``'s weights (``policy``: what
    :func:`make_policy` built for ``config``), or None when the agent has none (the learner then
    gives new rows its largest priority). An agent of the previous contract that computes
    ``initial_priorities`` itself keeps doing so."""
    plugin = get_agent(config.kind)
    if plugin.make_priorities is not None:
        return plugin.make_priorities(policy)
    if isinstance(policy, LegacyAgent):  # the previous contract's own initial_priorities
        own: PriorityFn | None = getattr(policy.agent, "initial_priorities", None)
        return own
    return None


def _checked_plugin(config: AgentConfigBase, spec: SampleSpec, device: str | None) -> AgentPlugin:
    plugin = get_agent(config.kind)
    # The config loader only builds the kind's own class: a mismatch is a caller's bug.
    if type(config) is not plugin.config_class:
        raise ValueError(
            f"agent.kind {config.kind!r} needs a {plugin.config_class.__name__}, got {type(config).__name__}"
        )
    check: Any = getattr(config, "check", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if plugin.check is not None and (
        problem := plugin.check(config, spec, device, **legacy_keywords(plugin.check, spec))
    ):
        raise ConfigError(problem)
    return plugin
