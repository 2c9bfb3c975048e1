"""Turning YAML, environment variables and ``--set`` into config dataclasses: keys, types, sources.

The section dataclasses live in :mod:`zmqrl.config`; this module knows nothing of them except
what their type hints say, and takes the root class as an argument. What it enforces: unknown keys
are errors naming the key (with a close match) and who gave it (the file, the variable, the
``--set``); values are coerced to the field's type or refused; the ``agent`` section is built as
the config class of the plugin its ``kind`` selects (:mod:`zmqrl.agents.registry`); and, for data
stored elsewhere (a checkpoint's config), no value that names code to import unless the caller
supplied it: ``gate``, a :class:`~zmqrl.code_trust.CodeGate`, checks every key as it is read.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from zmqrl.agents.configs import AgentConfigBase
from zmqrl.agents.registry import DEFAULT_KIND, config_class_for
from zmqrl.code_trust import CodeGate
from zmqrl.errors import ConfigError

# A decimal number, exponent allowed: what YAML 1.2 would read as a float where PyYAML gives a string.
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
# Config from the environment: ZMQRL_LEARNER__MAX_UPDATES=5000 sets learner.max_updates, and
# ZMQRL_ENV__ATARI__FRAME_STACK=2 sets env.atari.frame_stack. Only names with a double underscore
# after the prefix are config, so ZMQRL_SUPERVISED, ZMQRL_ACTOR_ID and the like are left alone.
ENV_PREFIX = "ZMQRL_"
ENV_SEPARATOR = "__"


class _OneKeyOnceLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping. PyYAML keeps the last
    silently, so a second ``learner:`` section used to drop every key of the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *base``: keys written beside it override the merged ones, as meant
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: PyYAML's own error says so
            if earlier is not key_node:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"{key!r} is given twice in one mapping (first at line {earlier.start_mark.line + 1}): "
                    "YAML would keep only the last; give each key once",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """A YAML document read safely (no tags that construct objects), each key once per mapping."""
    return yaml.load(text, Loader=_OneKeyOnceLoader)  # a SafeLoader: no tag constructs objects


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file (empty for an empty file)."""
    source = str(path)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{source}: config file not found")
    try:
        loaded = load_yaml(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML{yaml_problem(exc)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return loaded


def environment_overrides(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(variable, dotted key, value text)`` for each config variable in ``environ``, in the order
    they are applied.

    A config variable is ``ZMQRL_`` followed by key names joined by double underscores, upper-case
    by convention (``ZMQRL_LEARNER__MAX_UPDATES`` -> ``learner.max_updates``); ``ZMQRL_`` names
    without a double underscore belong to the processes themselves and are skipped. ``agent.kind``
    goes first because it decides which other ``agent.*`` keys exist; the rest go by name, so the
    result never depends on the order of the environment.
    """
    found: list[tuple[str, str, str]] = []
    for name, text in environ.items():
        if not is_config_variable(name):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_SEPARATOR)
        if not all(parts):
            raise ConfigError(
                f"environment {name}: expected ZMQRL_SECTION__KEY, upper-case, with one double "
                f"underscore between names (e.g. ZMQRL_LEARNER__MAX_UPDATES=5000)"
            )
        found.append((name, ".".join(parts), text))
    found.sort(key=lambda item: (item[1] != "agent.kind", item[0]))
    return found


def is_config_variable(name: str) -> bool:
    """Whether an environment variable sets config: ``ZMQRL_`` and a double underscore after it."""
    return name.startswith(ENV_PREFIX) and ENV_SEPARATOR in name[len(ENV_PREFIX) :]


def without_config_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus its config variables, for the processes `zmqrl launch` starts: the resolved
    config file they read already holds those values, and applied again over it they would undo
    the launch's own --set (``--name``, ``--resume``)."""
    return {name: value for name, value in environ.items() if not is_config_variable(name)}


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message folded into one line: where, then what."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {problem}"


def parse_value(text: str) -> Any:
    """A --set or variable value read as YAML (``7``, ``true``, ``[64, 64]``); empty means null."""
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        return text


def assign(
    root: type,
    raw: dict[str, Any],
    key: str,
    value: Any,
    label: str,
    source: str,
    gate: CodeGate | None = None,
) -> None:
    """Set the dotted ``key`` (``learner.max_updates``, ``env.atari.frame_stack``) in ``raw``, the
    not-yet-built data of the ``root`` config class.

    Key and value are checked here, so that a mistake is blamed on ``label`` (the --set or the
    variable) and not on the file. Nested mappings are copied before they are changed, so the
    caller's data (e.g. a checkpoint's stored config) is never modified. ``value`` is the caller's,
    so the ``gate`` lets ``key`` name code from now on; an agent kind still read from ``raw`` is not.
    """
    if gate is not None:
        gate.supply(key)
    path = key.split(".")
    sections = typing.get_type_hints(root)
    if path[0] not in sections:
        build(root, {path[0]: None}, label, prefix="")  # raises: unknown key, with a suggestion
    cls: type = sections[path[0]]
    if _is_agent_section(cls):  # which keys exist depends on the kind, set or already there
        current = raw.get(path[0]) if isinstance(raw.get(path[0]), dict) else {}
        kind = value if path[1:] == ["kind"] else (current or {}).get("kind", DEFAULT_KIND)
        cls = _agent_class(kind, label, gate, f"{path[0]}.kind")
    prefix = f"{path[0]}."
    for part in path[1:-1]:
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            build(cls, {part: None}, label, prefix)  # raises: unknown key
        inner = typing.get_type_hints(cls)[part]
        if not (isinstance(inner, type) and dataclasses.is_dataclass(inner)):
            raise ConfigError(f"{label}: '{prefix}{part}' has no keys of its own; set it as a whole")
        cls, prefix = inner, f"{prefix}{part}."
    build(cls, {path[-1]: value}, label, prefix)
    target = raw
    for depth, part in enumerate(path[:-1]):
        child = target.get(part)
        if child is None:  # `learner:` with nothing under it means "all defaults", as without --set
            child = {}
        elif not isinstance(child, dict):
            what = f"section '{part}'" if depth == 0 else f"'{'.'.join(path[: depth + 1])}'"
            raise ConfigError(f"{source}: {what} must be a mapping")
        else:
            child = dict(child)
        target[part] = child
        target = child
    target[path[-1]] = value


def build(cls: type, data: Any, source: str, prefix: str, gate: CodeGate | None = None) -> Any:
    """An instance of the dataclass ``cls`` from a mapping: every key known, every value coerced;
    with a ``gate``, no value that names code unless the caller supplied it (checked before the
    value is used, so a refused one is never imported)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix.rstrip('.') or 'top level'}' must be a mapping")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1)
            also = f" (did you mean '{prefix}{hint[0]}'?)" if hint else f" (known: {', '.join(names)})"
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'{also}")
        if gate is not None:
            gate.check(f"{prefix}{key}", value)
        kwargs[key] = _coerce(hints[key], value, source, f"{prefix}{key}", gate)
    return cls(**kwargs)


def _is_agent_section(tp: Any) -> bool:
    """The ``agent`` section is typed as the base class; its real class depends on ``kind``."""
    return tp is AgentConfigBase


def _agent_class(kind: Any, source: str, gate: CodeGate | None, key: str) -> type:
    """The config class of the agent ``kind`` names, once the ``gate`` has let ``kind`` through
    (an import-path kind is imported here)."""
    if gate is not None:
        gate.check(key, kind)
    try:
        return config_class_for(kind)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _coerce(tp: Any, value: Any, source: str, key: str, gate: CodeGate | None = None) -> Any:
    if _is_agent_section(tp):
        data = value if value is not None else {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: '{key}' must be a mapping")
        cls = _agent_class(data.get("kind", DEFAULT_KIND), source, gate, f"{key}.kind")
        return build(cls, data, source, f"{key}.", gate)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value if value is not None else {}, source, f"{key}.", gate)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, source, key, gate)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)  # "1e-4": PyYAML (YAML 1.1) reads exponents without a dot as text
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif origin is list:
        if isinstance(value, (list, tuple)):
            return [_coerce(args[0], v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            return dict(value)
    else:
        return value
    expected = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"{source}: '{key}' must be {expected}, got {value!r}")
