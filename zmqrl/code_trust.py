"""Which config values name code to import, and the gate that keeps stored data from choosing any.

Why: a checkpoint carries the config it was trained with, and ``zmqrl eval`` and
``zmqrl.load_policy`` rebuild that config to make the env and the agent. Two of its values can name
code that rebuilding would import and then call: ``env.id`` (a factory ``module:function``, called
with ``env.kwargs``, or gymnasium's own ``module:Env-v0``, which imports ``module`` first) and
``agent.kind`` (a plugin ``module:ATTRIBUTE``). A checkpoint may come from anywhere (the threat
model in docs/deployment.md), so its data must not choose what runs: a config rebuilt from stored
data is parsed behind a :class:`CodeGate`, which refuses such a value before anything is imported,
unless the caller supplied it (``--set``, their own config file) or said they trust the stored
config (``--trust-config``, ``trust_config=True``).

Names that select code already installed stay allowed from any source: gymnasium's registered ids,
the built-in agents, plugins installed under the ``zmqrl.agents`` entry points. Only a colon makes
a module to import: gymnasium, the env factory lookup (:mod:`zmqrl.envs.ids`) and the agent
registry (:mod:`zmqrl.agents.registry`) all split on it, so the test here is exactly theirs.

``env.kwargs`` is gated too, every string in it at any depth: it goes to the env's constructor,
and a registered wrapper env turns a string there into an import (shimmy's
``GymV21Environment-v0`` with ``env_id: "module:Env"`` imports ``module``), so a registered
``env.id`` with stored kwargs is as much a choice of code as a ``module:...`` id. Which argument of
which wrapper does that cannot be known here, so any string with a colon is refused, naming its
key (``env.kwargs.env_id``); one that names no code (a URL) is let through the same ways.

No imports beyond the error type: the config parser, which the supervisor and ``zmqrl config``
run in a fraction of a second, checks every key through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zmqrl.errors import ConfigError

# Separates the module to import from what is taken out of it, in every form that imports one:
# an env factory "pkg.envs:make_env", gymnasium's "pkg.envs:Corridor-v0", an agent "pkg.agents:PLUGIN".
MODULE_SEPARATOR = ":"
# The config keys whose value can name a module to import.
CODE_KEYS = ("env.id", "agent.kind")
# The config keys whose value is handed to code as arguments, where any string, however deep,
# can name a module to import (see the module's docstring).
CODE_ARGUMENT_KEYS = ("env.kwargs",)
# How a caller says "I trust the config stored in this file", on the command line and in Python.
TRUST_FLAG = "--trust-config"
TRUST_ARGUMENT = "trust_config=True"


class UntrustedCode(ConfigError):
    """A stored config names code to import that nobody who runs zmqrl chose.

    A ConfigError: the CLI exits 2 with this one line, which names the file, the key, the value
    and the two ways to go on."""

    def __init__(self, source: str, key: str, value: str, settable: str | None = None) -> None:
        """``settable``: the key the caller gives instead, when ``key`` lies inside it (a string in
        ``env.kwargs``, which is set as a whole)."""
        self.source, self.key, self.value = source, key, value
        module = value.partition(MODULE_SEPARATOR)[0]
        names = f"names code to import (module {module!r})"
        if settable is not None:
            names = (
                f"may name code to import (module {module!r}): {settable} goes to the env, and a "
                "registered wrapper env imports what such a string names"
            )
        given = settable or key
        super().__init__(
            f"{source}: {key} {value!r} {names}, and a stored config may not choose code to run, so "
            f"nothing was imported. If you trust this file, pass {TRUST_FLAG} (Python: {TRUST_ARGUMENT}); "
            f"or give {given} yourself: --set {given}=... or --config YOUR_CONFIG.yaml (Python: config=...)"
        )


def code_in(key: str, value: object) -> tuple[str, str] | None:
    """The first (dotted key, string) in ``value`` for ``key`` that can name a module to import:
    the value itself for CODE_KEYS, any string inside for CODE_ARGUMENT_KEYS (its key then
    ``env.kwargs.name``, ``env.kwargs.name[0]``); None when there is none."""
    if key in CODE_KEYS:
        return (key, value) if isinstance(value, str) and MODULE_SEPARATOR in value else None
    if key in CODE_ARGUMENT_KEYS:
        return _string_naming_code(key, value)
    return None


def _string_naming_code(key: str, value: object) -> tuple[str, str] | None:
    if isinstance(value, str):
        return (key, value) if MODULE_SEPARATOR in value else None
    if isinstance(value, dict):
        inner = ((f"{key}.{name}", item) for name, item in value.items())
    elif isinstance(value, (list, tuple)):
        inner = ((f"{key}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for inner_key, item in inner:
        found = _string_naming_code(inner_key, item)
        if found is not None:
            return found
    return None


@dataclass
class CodeGate:
    """Refuses the code-naming values of a config parsed from stored data (``source``), except
    for the keys the caller supplied over it. ``None`` in place of a gate: the data is trusted."""

    source: str  # the stored data, named in the refusal (e.g. "runs/x/checkpoints/best (stored config)")
    supplied: set[str] = field(default_factory=set)  # dotted keys set by the caller: theirs to choose

    def supply(self, key: str) -> None:
        """``key`` now holds the caller's value (a --set, an environment variable, their file)."""
        self.supplied.add(key)

    def check(self, key: str, value: object) -> None:
        """Raise :class:`UntrustedCode` if ``value`` names code and the stored data chose it."""
        found = None if key in self.supplied else code_in(key, value)
        if found is not None:
            inner_key, text = found
            raise UntrustedCode(self.source, inner_key, text, settable=key if inner_key != key else None)
