"""The one exception type for "the settings the user gave cannot work".

Why a module of its own: the CLI's exit code depends on telling the user's mistakes (exit 2, one
``error:`` line, nothing to debug) from zmqrl's bugs (exit 1, a traceback in the log). That only
works if every place that rejects a setting, from YAML parsing to building an agent for an env's
spaces deep inside a role's ``run()``, raises the same family, and nothing else is caught as if it
were the user's fault. Kept free of imports so that every layer (config, agents, envs, transport)
can raise it without import cycles or start-up cost.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Settings that cannot work; the message names the source (file, variable, --set) and the key.

    A ValueError for the callers that predate this module. Raise it only for problems the user can
    fix by changing a setting (a key, its value, the env chosen for an agent): an unexpected
    ValueError from inside zmqrl must stay a plain ValueError, so it is reported as the bug it is.
    """


class EnvError(ConfigError):
    """The configured environment cannot be made or is not supported by the configured agent.

    A ConfigError (hence still a ValueError): the user fixes it with another setting, so the CLI
    exits 2 with one line wherever in a role it is raised."""
