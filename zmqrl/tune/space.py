"""The search space file of ``zmqrl tune``: what is tuned, what is fixed, how a trial is scored.

A space is YAML (docs/tuning.md has the whole format)::

    objective: {metric: final_eval}          # or auc, or time_to_target (with target:)
    seeds: [0]                               # run.seed of each run a trial makes
    pruner: {kind: median, startup_trials: 2, warmup_evaluations: 1}
    set: {learner.max_updates: 4000}         # every trial, as --set
    params:
      agent.lr: {float: [0.0003, 0.01], log: true}
      agent.target_update_interval: {int: [10, 200], log: true}
      agent.hidden_sizes: {choices: [[64, 64], [128, 128]]}

Everything is checked before the first trial starts, against the config the trials will run: a
key the config does not have, or a bound the config's range checks refuse, is a
:class:`~zmqrl.errors.ConfigError` that names the space file and the key. Finding that out at
trial 12 of a night's search would waste the night.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from zmqrl.config import load_config
from zmqrl.config_parse import load_yaml, yaml_problem
from zmqrl.errors import ConfigError

METRICS = ("final_eval", "auc", "time_to_target")
# Each metric's natural direction: returns are maximised, the time to reach a target minimised.
DEFAULT_DIRECTION = {"final_eval": "maximize", "auc": "maximize", "time_to_target": "minimize"}
DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "hyperband", "none")
KINDS = ("float", "int", "choices")
TOP_KEYS = ("objective", "seeds", "pruner", "set", "params", "first_trials", "sampler_seed")
# Pruning compares trials at their k-th evaluation: every trial must evaluate at the same updates.
UNTUNABLE = {"learner.eval_interval": "pruning compares trials at their k-th evaluation"}


@dataclass(frozen=True)
class Param:
    """One tuned key: a float or int range (``log``: sampled on a log scale), or a list of choices."""

    key: str
    kind: str  # "float", "int" or "choices"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    @property
    def plain_choices(self) -> bool:
        """Whether Optuna can store the choices as they are (it takes only None, bool, int, float,
        str); otherwise (lists such as hidden_sizes) they are stored as their JSON text."""
        return all(c is None or isinstance(c, (bool, int, float, str)) for c in self.choices)

    def extremes(self) -> list[Any]:
        """The values checked against the config before any trial: both bounds, or every choice."""
        if self.kind == "choices":
            return list(self.choices)
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


@dataclass(frozen=True)
class Objective:
    """What a trial's score is: ``final_eval`` (the last evaluation's mean return), ``auc`` (the
    mean over all its evaluations: the area under the eval curve per evaluation) or
    ``time_to_target`` (seconds after launch until an evaluation reached ``target``)."""

    metric: str = "final_eval"
    direction: str = "maximize"
    target: float | None = None  # time_to_target only; None: the config's learner.target_return


@dataclass(frozen=True)
class Pruner:
    """``median``: stop a trial whose best so far is worse than the median of earlier trials at the
    same evaluation; ``hyperband``: Optuna's Hyperband over evaluations; ``none``: never."""

    kind: str = "median"
    startup_trials: int = 2  # trials that run to the end before any is pruned
    warmup_evaluations: int = 1  # evaluations of a trial before it may be pruned


@dataclass(frozen=True)
class Space:
    path: Path
    params: tuple[Param, ...]
    objective: Objective = field(default_factory=Objective)
    pruner: Pruner = field(default_factory=Pruner)
    seeds: tuple[int, ...] = (0,)
    fixed: dict[str, Any] = field(default_factory=dict)  # the file's ``set``: every trial gets it
    first_trials: tuple[dict[str, Any], ...] = ()  # parameter sets tried first (Optuna's enqueue)
    sampler_seed: int | None = None  # TPE's seed: the same study samples the same points

    def overrides(self, values: Mapping[str, Any]) -> list[str]:
        """``--set`` items for a trial: the fixed settings, then the trial's values (JSON is YAML, so
        each reads back exactly as written)."""
        merged = {**self.fixed, **values}
        return [f"{key}={json.dumps(value)}" for key, value in merged.items()]


def load_space(path: Path) -> Space:
    """Parse and check the form of a space file (not yet against a config: :func:`check_keys`)."""
    try:
        raw = load_yaml(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the space file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML{yaml_problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with params: (and objective:, set:, ...)")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (expected: {', '.join(TOP_KEYS)})")
    params = _params(path, raw.get("params"))
    space = Space(
        path=path,
        params=params,
        objective=_objective(path, raw.get("objective") or {}),
        pruner=_pruner(path, raw.get("pruner") or {}),
        seeds=_seeds(path, raw.get("seeds", [0])),
        fixed=_mapping(path, "set", raw.get("set") or {}),
        first_trials=_first_trials(path, raw.get("first_trials") or [], params),
        sampler_seed=_optional_int(path, "sampler_seed", raw.get("sampler_seed")),
    )
    return space


def check_keys(space: Space, config: Path, overrides: list[str]) -> None:
    """Every tuned or fixed key exists in ``config`` (after ``overrides``), and each bound or choice
    passes the config's own checks, so a trial never fails on a value the space allows."""
    source = f"{space.path} (against {config})"
    base = load_config(config, [*overrides, *space.overrides({})])
    known = _leaves(base.to_dict())
    for key in [*space.fixed, *(p.key for p in space.params)]:
        if key not in known:
            close = [k for k in known if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{source}: {key}: the config has no such key{hint}")
    for param in space.params:
        for value in param.extremes():
            try:
                load_config(config, [*overrides, *space.overrides({param.key: value})])
            except ConfigError as exc:
                raise ConfigError(f"{source}: params.{param.key}: {value!r} is refused: {exc}") from exc


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        found.add(dotted)
        if isinstance(value, Mapping) and value:
            found |= _leaves(value, dotted + ".")
    return found


def _params(path: Path, raw: object) -> tuple[Param, ...]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: params: expected a mapping of dotted config keys to distributions")
    return tuple(_param(path, str(key), spec) for key, spec in raw.items())


def _param(path: Path, key: str, spec: object) -> Param:
    where = f"{path}: params.{key}"
    if key in UNTUNABLE:
        raise ConfigError(f"{where}: cannot be tuned ({UNTUNABLE[key]}); put it under set:")
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: expected {{float: [low, high]}}, {{int: [low, high]}} or {{choices: [...]}}"
        )
    kinds = [k for k in KINDS if k in spec]
    extra = sorted(set(spec) - {*KINDS, "log", "step"})
    if len(kinds) != 1 or extra:
        raise ConfigError(
            f"{where}: give exactly one of float:, int:, choices: (and log:, step:), got {sorted(spec)}"
        )
    kind = kinds[0]
    if kind == "choices":
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices: expected a non-empty list")
        return Param(key, kind, choices=tuple(choices))
    bounds = spec[kind]
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_is_number(b) for b in bounds)):
        raise ConfigError(f"{where}: {kind}: expected [low, high], got {bounds!r}")
    low, high = float(bounds[0]), float(bounds[1])
    if kind == "int" and not (low.is_integer() and high.is_integer()):
        raise ConfigError(f"{where}: int: bounds must be whole numbers, got {bounds!r}")
    if not low < high:
        raise ConfigError(f"{where}: {kind}: low must be below high, got {bounds!r}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log: expected true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{where}: log: needs low > 0, got {low}")
    step = spec.get("step")
    if step is not None and (not _is_number(step) or step <= 0 or log):
        raise ConfigError(f"{where}: step: expected a positive number (and no log:), got {step!r}")
    return Param(key, kind, low, high, log, float(step) if step is not None else None)


def _objective(path: Path, raw: object) -> Objective:
    raw = _mapping(path, "objective", raw)
    extra = sorted(set(raw) - {"metric", "direction", "target"})
    if extra:
        raise ConfigError(f"{path}: objective: unknown key {extra[0]!r} (expected metric, direction, target)")
    metric = raw.get("metric", "final_eval")
    if metric not in METRICS:
        raise ConfigError(f"{path}: objective.metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    direction = raw.get("direction", DEFAULT_DIRECTION[metric])
    if direction not in DIRECTIONS:
        raise ConfigError(f"{path}: objective.direction: expected maximize or minimize, got {direction!r}")
    target = raw.get("target")
    if target is not None and (not _is_number(target) or not math.isfinite(target)):
        raise ConfigError(f"{path}: objective.target: expected a number, got {target!r}")
    if target is not None and metric != "time_to_target":
        raise ConfigError(f"{path}: objective.target: only time_to_target has a target")
    return Objective(metric, direction, float(target) if target is not None else None)


def _pruner(path: Path, raw: object) -> Pruner:
    raw = _mapping(path, "pruner", raw)
    extra = sorted(set(raw) - {"kind", "startup_trials", "warmup_evaluations"})
    if extra:
        raise ConfigError(f"{path}: pruner: unknown key {extra[0]!r}")
    kind = raw.get("kind", "median")
    if kind not in PRUNERS:
        raise ConfigError(f"{path}: pruner.kind: expected one of {', '.join(PRUNERS)}, got {kind!r}")
    startup = _optional_int(path, "pruner.startup_trials", raw.get("startup_trials", 2))
    warmup = _optional_int(path, "pruner.warmup_evaluations", raw.get("warmup_evaluations", 1))
    return Pruner(kind, startup or 0, warmup or 0)


def _seeds(path: Path, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw or not all(type(s) is int for s in raw):
        raise ConfigError(f"{path}: seeds: expected a non-empty list of integers, got {raw!r}")
    return tuple(raw)


def _first_trials(path: Path, raw: object, params: tuple[Param, ...]) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: first_trials: expected a list of mappings of tuned keys")
    names = {p.key for p in params}
    for i, entry in enumerate(raw):
        entry = _mapping(path, f"first_trials[{i}]", entry)
        stray = sorted(set(entry) - names)
        if stray:
            raise ConfigError(f"{path}: first_trials[{i}].{stray[0]}: not a key under params:")
    return tuple(raw)


def _mapping(path: Path, what: str, raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {what}: expected a mapping, got {raw!r}")
    return {str(k): v for k, v in raw.items()}


def _optional_int(path: Path, what: str, raw: object) -> int | None:
    if raw is not None and (type(raw) is not int or raw < 0):
        raise ConfigError(f"{path}: {what}: expected a whole number >= 0, got {raw!r}")
    return raw


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
