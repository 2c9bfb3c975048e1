"""What an agent plugin is: :class:`AgentPlugin` (one algorithm's config class and factories), the
factories' signatures, and the checks a plugin must pass to be used by the roles.

Apart from the registry (``zmqrl.agents.registry``, which finds a plugin by its ``agent.kind``)
because the built-in plugins are plugins too: ``zmqrl.agents.builtin`` defines them with this
module and the registry registers them, so the imports run one way (builtin and registry import
this; the registry imports builtin when first asked). Importing it imports neither torch nor the
algorithms. ``zmqrl.agents.registry`` re-exports :class:`AgentPlugin` and :data:`PriorityFn`, the
public names plugins import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from zmqrl.agents.configs import BASE_FIELDS
from zmqrl.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from zmqrl.core import LearningAgent, Policy
    from zmqrl.spec import SampleSpec
    from zmqrl.types import TransitionBatch

# Fingerprinted fields of a plugin that names none (those its config has): the fields that
# usually change the acting network's parameters, and the actors' n-step processor.
DEFAULT_FINGERPRINT_FIELDS = ("kind", "hidden_sizes", "n_step", "gamma")


# A plugin's own config class (its factories take that class, not the base).
ConfigT = TypeVar("ConfigT", contravariant=True)

# Ape-X: ``|TD error|`` per row ``(B,)`` of fresh transitions under the actor's weights (None:
# none for this batch; the learner gives the rows its largest priority).
PriorityFn = Callable[["TransitionBatch"], "np.ndarray | None"]


class LearnerFactory(Protocol[ConfigT]):
    """Builds the learning side, sized for the run's spaces, on ``device`` (None: the config's)."""

    def __call__(
        self, config: ConfigT, spec: SampleSpec, *, seed: int | None, device: str | None
    ) -> LearningAgent: ...


class PolicyFactory(Protocol[ConfigT]):
    """Builds the acting side, always on the CPU."""

    def __call__(self, config: ConfigT, spec: SampleSpec, *, seed: int | None) -> Policy: ...


class SettingsCheck(Protocol[ConfigT]):
    """What in the user's settings cannot work with these spaces or on ``device`` (None: the
    config's own), as one line naming the key; None when the agent can be built."""

    def __call__(self, config: ConfigT, spec: SampleSpec, device: str | None) -> str | None: ...


class PrioritiesFactory(Protocol):
    """The Ape-X initial priorities of fresh transitions under ``policy``'s weights: a function of
    the policy this plugin's ``make_policy`` built (an actor keeps it beside the policy)."""

    def __call__(self, policy: Policy) -> PriorityFn: ...


@dataclass(frozen=True)
class AgentPlugin:
    """One algorithm, as the roles build it.

    ``make_policy`` None: actors and the evaluator act with ``make_learner(..., device="cpu")``.
    ``check`` says what in the settings cannot work with this env or machine (a discrete agent on
    continuous actions, ``cuda`` without a GPU), as one line for the user; it runs before either
    factory. ``make_priorities`` None: Ape-X actors send no initial priorities (the learner gives
    new rows its largest). ``fingerprint_fields``: the config fields an actor must share with its
    learner (those that shape the published weights or the meaning of a transition; see
    ``zmqrl.transport.fingerprint``). ``on_policy``: see the field.
    """

    name: str  # the agent.kind that selects it; its config class's default `kind`
    config_class: type  # a dataclass with the BASE_FIELDS (subclass AgentConfigBase), all defaulted
    make_learner: LearnerFactory[Any]
    make_policy: PolicyFactory[Any] | None = None
    check: SettingsCheck[Any] | None = None
    fingerprint_fields: tuple[str, ...] = DEFAULT_FINGERPRINT_FIELDS
    description: str = ""  # one line for listings (`zmqrl config`, error messages)
    make_priorities: PrioritiesFactory | None = None  # last: earlier releases' positional order holds
    # Learns on-policy from fixed-length rollouts (actors send RolloutBatch with their policy's
    # log-probabilities; the learner keeps a bounded queue, not replay); its make_policy then builds
    # a zmqrl.core.SamplingPolicy. False: n-step transitions into replay.
    on_policy: bool = False
    # Learns from replayed fixed-length windows with their recurrent core's start state (R2D2:
    # actors send SequenceBatch, replay holds windows); its make_policy then builds a
    # zmqrl.core.RecurrentPolicy, and its config has burn_in, sequence_length and core_size.
    sequences: bool = False

    def __post_init__(self) -> None:
        if problem := plugin_problem(self):
            raise ConfigError(f"agent plugin {self.name!r}: {problem}")


def plugin_problem(plugin: AgentPlugin) -> str | None:
    """What makes ``plugin`` unusable by the roles, or None (checked when a plugin is made)."""
    if not isinstance(plugin.name, str) or not plugin.name.isidentifier():
        return "its name must be an identifier (letters, digits, underscores), e.g. 'linear_q'"
    cls = plugin.config_class
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return f"config_class must be a dataclass, got {cls!r}"
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = [name for name in BASE_FIELDS if name not in fields]
    if missing:
        return (
            f"config class {cls.__name__} lacks the fields the roles read: {', '.join(missing)} "
            f"(subclass zmqrl.agents.configs.AgentConfigBase)"
        )
    no_default = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if no_default:
        return f"every field of {cls.__name__} needs a default; {', '.join(no_default)} has none"
    default_kind = fields["kind"].default
    if default_kind != plugin.name:
        return (
            f"{cls.__name__}.kind defaults to {default_kind!r}: declare `kind: str = {plugin.name!r}` "
            f"so that a config built in code selects this plugin"
        )
    for role in ("make_learner", "make_policy", "check", "make_priorities"):
        value = getattr(plugin, role)
        if value is not None and not callable(value):
            return f"{role} must be callable, got {value!r}"
    if plugin.make_learner is None:
        return "make_learner is required"
    return None
