"""Run configuration: one dataclass per YAML section, parsed only at the CLI edge.

Every field has a working default and a one-line comment, so ``Config()`` is a runnable CartPole
DQN setup and the YAML files only say what differs. Unknown or mistyped keys are errors that name
the file and the key (a typo silently falling back to a default is how runs waste a night).

Values come from three layers, later ones winning: the YAML file, then environment variables
``ZMQRL_<SECTION>__<KEY>`` (so a container needs no custom file), then ``--set section.key=value``.
Variables and ``--set`` go through one path (:func:`zmqrl.config_parse.assign`), so both are
checked alike and an error names the variable or the ``--set`` that caused it. This module holds the
entry points (and re-exports the sections, :mod:`zmqrl.config_sections`); :mod:`zmqrl.config_checks`
the range checks and :mod:`zmqrl.config_parse` the parsing machinery.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from zmqrl.agents.configs import AgentConfigBase
from zmqrl.code_trust import CodeGate
from zmqrl.config_checks import check_config
from zmqrl.config_parse import (  # re-exported: callers import them from zmqrl.config
    ENV_PREFIX,
    ENV_SEPARATOR,
    assign,
    build,
    environment_overrides,
    is_config_variable,
    parse_value,
    read_yaml,
    without_config_variables,
)
from zmqrl.config_sections import (  # re-exported: callers import the sections from zmqrl.config
    ActorConfig,
    AtariConfig,
    CheckpointConfig,
    Config,
    EnvConfig,
    EvaluatorConfig,
    LearnerConfig,
    LoggingConfig,
    ReplayConfig,
    RunConfig,
    SupervisorConfig,
    TransportConfig,
)
from zmqrl.errors import ConfigError  # re-exported: `from zmqrl.config import ConfigError` still works

__all__ = [
    "ENV_PREFIX",
    "ENV_SEPARATOR",
    "ActorConfig",
    "AgentConfigBase",
    "AtariConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvaluatorConfig",
    "LearnerConfig",
    "LoggingConfig",
    "ReplayConfig",
    "RunConfig",
    "SupervisorConfig",
    "TransportConfig",
    "config_from_dict",
    "environment_overrides",
    "is_config_variable",
    "load_config",
    "save_config",
    "without_config_variables",
]


def load_config(
    path: str | Path | None,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Read a YAML file (or the defaults when ``path`` is None), then apply the config variables of
    ``environ`` (default: ``os.environ``; see :func:`environment_overrides`), then the
    ``section.key=value`` overrides: file < environment < --set."""
    source = str(path) if path is not None else "<defaults>"
    raw = read_yaml(path) if path is not None else {}
    environ = os.environ if environ is None else environ
    return config_from_dict(raw, source, overrides, environ=environ, trusted=True)


def config_from_dict(
    data: dict[str, Any],
    source: str,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    trusted: bool = False,
) -> Config:
    """A config from an already-parsed mapping (e.g. the copy stored in a checkpoint).

    Unlike :func:`load_config`, the environment applies only when ``environ`` is given: a stored
    config is a record of what ran, and reading it back must not silently change it.

    Untrusted unless ``trusted`` (the operator's own file, a config built in code, the run
    directory): ``data`` may then not name code to import (``env.id`` or ``agent.kind`` as
    ``module:...``, see :mod:`zmqrl.code_trust`) unless ``overrides`` or ``environ`` set that key.
    """
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    gate = None if trusted else CodeGate(source)
    assigned: list[tuple[str, str]] = []  # (dotted key, who set it), to blame range errors on
    for name, key, text in environment_overrides(environ or {}):
        label = f"environment {name}"
        assign(Config, raw, key, parse_value(text), label, source, gate)
        assigned.append((key, label))
    # agent.kind first, as for the variables: it decides which agent.* keys exist.
    for item in sorted(overrides or [], key=lambda item: item.partition("=")[0].strip() != "agent.kind"):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or "." not in key:
            raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. learner.max_updates=5000)")
        label = f"--set {item!r}"
        assign(Config, raw, key, parse_value(text), label, source, gate)
        assigned.append((key, label))
    cfg: Config = build(Config, raw, source, "", gate)
    check_config(cfg, source, assigned)
    return cfg


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved config, so a run directory always says exactly what ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    tmp.replace(path)
