"""Agent plugins written against the previous, wider contract keep working for one release.

Before, an agent also numbered its weights (``export_weights() -> Weights``, ``import_weights``,
``weights_version``, ``continue_versions_after``, ``weights_spec``), held the actor's ``epsilon``,
kept ``last_td_errors`` beside ``update``'s metrics and computed ``initial_priorities``; its
factories took ``action_low`` / ``action_high`` (and ``epsilon``). The builders
(``zmqrl.agents.make_learner`` / ``make_policy``) wrap such an agent in :class:`LegacyAgent`,
which speaks the narrow contract, and pass a factory the keywords its signature still names;
each says so once with a DeprecationWarning. Roles never see the difference.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch, Weights

# Keywords that factories of the previous contract took, and that the spec or the explorer now give.
LEGACY_KEYWORDS = ("action_low", "action_high", "epsilon")

_warned: set[str] = set()


def deprecated(what: str) -> None:
    """One DeprecationWarning per process for ``what``."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(what, DeprecationWarning, stacklevel=3)


def legacy_keywords(factory: Callable[..., Any], spec: SampleSpec) -> dict[str, Any]:
    """The keywords of :data:`LEGACY_KEYWORDS` that ``factory``'s signature names, with values from
    ``spec`` (and epsilon 0: the actor's explorer now owns exploration)."""
    try:
        names = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    wanted = [name for name in LEGACY_KEYWORDS if name in names]
    if not wanted:
        return {}
    deprecated(
        f"agent factory {getattr(factory, '__qualname__', factory)!r} takes {', '.join(wanted)}: "
        "the action bounds are in the SampleSpec and epsilon is the actor's explorer's; these "
        "keywords are passed for one more release"
    )
    values: dict[str, Any] = {
        "action_low": None if spec.action_low is None else np.asarray(spec.action_low, np.float32),
        "action_high": None if spec.action_high is None else np.asarray(spec.action_high, np.float32),
        "epsilon": 0.0,
    }
    return {name: values[name] for name in wanted}


def narrowed(agent: Any) -> Any:
    """``agent`` itself when it has the narrow contract's ``load_weights``; one of the previous
    contract (``import_weights``) wrapped in :class:`LegacyAgent`."""
    if hasattr(agent, "load_weights") or not hasattr(agent, "import_weights"):
        return agent
    deprecated(
        f"{type(agent).__name__} implements the previous agent contract (import_weights, "
        "weights_version, ...): implement act, load_weights, update -> UpdateResult, "
        "export_weights -> arrays, state_dict and load_state_dict (see zmqrl.core)"
    )
    return LegacyAgent(agent)


class LegacyResult:
    """``update``'s plain metrics mapping, with the agent's ``last_td_errors`` read when asked."""

    def __init__(self, metrics: Mapping[str, float], agent: Any) -> None:
        self.metrics = metrics
        self.skipped = bool(getattr(metrics, "skipped", False))
        self._agent = agent

    @property
    def td_errors(self) -> np.ndarray:
        return np.asarray(self._agent.last_td_errors, np.float32)


class LegacyAgent:
    """The narrow contract over an agent of the previous one. Its own epsilon stays 0 (the actor's
    explorer adds random rows); versions are numbered here so that its ``import_weights`` always
    sees a newer one. Anything else (``device``, ``initial_priorities``, ...) is the agent's."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        if hasattr(agent, "epsilon"):
            agent.epsilon = 0.0

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        return np.asarray(self.agent.act(obs, explore))

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        version = int(getattr(self.agent, "weights_version", 0)) + 1
        if not self.agent.import_weights(Weights(version, dict(arrays))):
            raise ValueError("the agent refused the weights")

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> LegacyResult:
        return LegacyResult(self.agent.update(batch, importance), self.agent)

    def export_weights(self) -> dict[str, np.ndarray]:
        exported = self.agent.export_weights()
        return dict(exported.arrays if isinstance(exported, Weights) else exported)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self.agent.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.agent.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.agent, name)
