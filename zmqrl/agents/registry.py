"""The agent registry: every algorithm, built-in or a plugin, is found by the name in ``agent.kind``.

An agent is an :class:`AgentPlugin`: its config dataclass plus factories for the learning side
(the learner's :class:`~zmqrl.core.LearningAgent`), optionally a lighter acting side (the
actors' :class:`~zmqrl.core.Policy`) and, for Ape-X, the actors' initial priorities. Every
factory takes the run's :class:`~zmqrl.spec.SampleSpec` (spaces and action bounds). Plugins come
from three places, looked up in this order:

1. ``register_agent(plugin)`` in code (the built-in ``dqn`` and ``sac`` register this way);
2. the entry-point group ``zmqrl.agents`` of installed packages (each entry point's object is an
   ``AgentPlugin``), read once and loaded only when its name is asked for, so one broken
   third-party package cannot stop a DQN run;
3. an import path as the kind, ``agent.kind: "mypkg.agents:PLUGIN"``: processes that
   ``zmqrl launch`` starts read the same config, so they find an agent that is not installed.
   Such a kind is imported only when the operator gave it (their config file, ``--set``): the
   config parser refuses it in a config stored in a checkpoint (:mod:`zmqrl.code_trust`), while
   1 and 2 name code already installed and are found from anywhere.

This module imports neither torch nor the algorithms: the supervisor and ``zmqrl config``
validate configs with it in a fraction of a second.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import threading
from typing import TYPE_CHECKING, Any

# What a plugin is lives in zmqrl.agents.plugin (so the built-in plugins need not import this
# module); AgentPlugin and PriorityFn are re-exported here, where plugins have always imported them.
from zmqrl.agents.plugin import DEFAULT_FINGERPRINT_FIELDS as DEFAULT_FINGERPRINT_FIELDS
from zmqrl.agents.plugin import AgentPlugin as AgentPlugin
from zmqrl.agents.plugin import LearnerFactory as LearnerFactory
from zmqrl.agents.plugin import PolicyFactory as PolicyFactory
from zmqrl.agents.plugin import PrioritiesFactory as PrioritiesFactory
from zmqrl.agents.plugin import PriorityFn as PriorityFn
from zmqrl.agents.plugin import SettingsCheck as SettingsCheck
from zmqrl.agents.plugin import plugin_problem as plugin_problem
from zmqrl.code_trust import MODULE_SEPARATOR
from zmqrl.errors import ConfigError

if TYPE_CHECKING:
    from zmqrl.agents.configs import AgentConfigBase

# The entry-point group installed packages declare their agents in (pyproject.toml:
# [project.entry-points."zmqrl.agents"] linear_q = "mypkg.agents:PLUGIN").
ENTRY_POINT_GROUP = "zmqrl.agents"
# Separates module and attribute in an import-path kind ("mypkg.agents:PLUGIN"); the same colon
# by which the config parser tells a kind to import from a registered name (zmqrl.code_trust).
IMPORT_PATH_SEPARATOR = MODULE_SEPARATOR
# The agent a config without `agent.kind` gets.
DEFAULT_KIND = "dqn"


_lock = threading.Lock()
_registered: dict[str, AgentPlugin] = {}  # by register_agent
_by_path: dict[str, AgentPlugin] = {}  # import-path kinds already imported
_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None  # None: not read yet
_builtins_loaded = False


def register_agent(plugin: AgentPlugin, *, replace: bool = False) -> AgentPlugin:
    """Make ``plugin`` available as ``agent.kind: <plugin.name>`` in this process; returns it.

    A name already taken by another plugin is refused unless ``replace``: two packages claiming
    the same name would otherwise make which one runs depend on import order.
    """
    if not isinstance(plugin, AgentPlugin):
        raise TypeError(f"register_agent expects an AgentPlugin, got {type(plugin).__name__}")
    _load_builtins()
    with _lock:
        current = _registered.get(plugin.name)
        if current is not None and current is not plugin and not replace:
            raise ValueError(f"an agent named {plugin.name!r} is already registered (pass replace=True)")
        _registered[plugin.name] = plugin
    return plugin


def unregister_agent(name: str) -> None:
    """Forget an agent registered in code (tests; a notebook re-defining its agent)."""
    with _lock:
        _registered.pop(name, None)


def get_agent(kind: str) -> AgentPlugin:
    """The plugin ``agent.kind`` names: registered, installed (entry point) or an import path.

    Raises :class:`ConfigError` naming ``agent.kind`` for an unknown name (with the available
    ones and close matches) and for an import path that does not import or names no plugin.
    """
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"'agent.kind' must be a non-empty string, got {kind!r}")
    if IMPORT_PATH_SEPARATOR in kind:
        return _from_import_path(kind)
    _load_builtins()
    with _lock:
        plugin = _registered.get(kind)
    if plugin is not None:
        return plugin
    entry = _discovered().get(kind)
    if entry is None:
        names = agent_names()
        close = difflib.get_close_matches(kind, names, n=2)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"agent.kind {kind!r} is not known (available: {', '.join(names)}, or an import path "
            f"'module:ATTRIBUTE'){hint}"
        )
    return _load_entry_point(kind, entry)


def agent_names() -> list[str]:
    """Names of the registered and installed agents, sorted (import-path kinds are not listed)."""
    _load_builtins()
    with _lock:
        names = set(_registered)
    return sorted(names | set(_discovered()))


def reload_entry_points() -> None:
    """Read the ``zmqrl.agents`` entry points again (after installing a package into a running
    process, or in tests); plugins already loaded from them are kept."""
    global _entry_points
    with _lock:
        _entry_points = None


def _discovered() -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by name, read from the installed distributions once."""
    global _entry_points
    with _lock:
        if _entry_points is None:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            _entry_points = {ep.name: ep for ep in found}
        return dict(_entry_points)


def _load_entry_point(name: str, entry: importlib.metadata.EntryPoint) -> AgentPlugin:
    where = f"agent.kind {name!r} (entry point {entry.value!r} in group {ENTRY_POINT_GROUP})"
    try:
        plugin = entry.load()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except Exception as exc:  # any import-time failure of a third-party package is the user's to fix
        raise ConfigError(f"{where} does not load: {type(exc).__name__}: {exc}") from None
    plugin = _require_plugin(plugin, where)
    if plugin.name != name:
        raise ConfigError(f"{where} is a plugin named {plugin.name!r}; the names must match")
    with _lock:
        return _registered.setdefault(name, plugin)


def _from_import_path(kind: str) -> AgentPlugin:
    with _lock:
        cached = _by_path.get(kind)
    if cached is not None:
        return cached
    module_name, _, attribute = kind.partition(IMPORT_PATH_SEPARATOR)
    where = f"agent.kind {kind!r}"
    if not module_name or not attribute:
        raise ConfigError(f"{where}: an import path must look like 'package.module:ATTRIBUTE'")
    try:
        target: Any = importlib.import_module(module_name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except Exception as exc:  # ImportError, or whatever the module raises while it runs
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); is it on "
            f"the Python path of every process (the directory zmqrl is started from, or PYTHONPATH)?"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    plugin = _require_plugin(target, where)
    with _lock:
        return _by_path.setdefault(kind, plugin)


def _require_plugin(obj: object, where: str) -> AgentPlugin:
    if not isinstance(obj, AgentPlugin):
        raise ConfigError(f"{where} is a {type(obj).__name__}, not a zmqrl.agents.registry.AgentPlugin")
    return obj


def _load_builtins() -> None:
    """Register dqn and sac on first use (their module imports no torch until an agent is built)."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    from zmqrl.agents.builtin import BUILTIN_PLUGINS

    with _lock:
        if not _builtins_loaded:
            for plugin in BUILTIN_PLUGINS:
                _registered.setdefault(plugin.name, plugin)
            _builtins_loaded = True


def config_class_for(kind: Any) -> type[AgentConfigBase]:
    """The config dataclass of the agent ``kind`` names (for the config loader)."""
    cls: type[AgentConfigBase] = get_agent(kind).config_class
    return cls
