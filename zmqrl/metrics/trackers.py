"""Experiment trackers (Weights & Biases, MLflow) as sinks of the run's logger, chosen by settings.

The ``logging`` section of a run's config names the backends; this module reads it through the
small ``TrackerOptions`` protocol (the metrics package sits below the config and never imports it),
checks it, and builds one sink per named tracker. Each tracker's package is an optional extra,
imported only inside its sink, so a run that names neither pays nothing.

How the processes of one run appear (each role process opens its own tracker run):

- W&B: one W&B run per role process, ``name=<run>-<source>``, ``group=<run>``, ``job_type=<source>``,
  files under ``<run dir>/wandb``; the W&B UI groups a launch's learner, evaluator and supervisor.
- MLflow: one MLflow run per role process under the experiment ``project``, named
  ``<run>-<source>`` and tagged ``zmqrl.run=<run>``, ``zmqrl.source=<source>``.

A restarted role opens a new tracker run of the same name; its steps carry on from its checkpoint,
so curves line up in the group. The run's whole config goes along (W&B config, MLflow params).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from zmqrl.errors import ConfigError
from zmqrl.metrics.sinks import Sink, TrackerOptions

# The backends `logging.backends` may name; tensorboard is built in (no extra).
BACKENDS = ("tensorboard", "wandb", "mlflow")
WANDB_MODES = ("online", "offline")
# Backend -> the module its sink imports; the extra that installs it has the backend's name.
TRACKER_MODULES = {"wandb": "wandb", "mlflow": "mlflow"}


class TrackedConfig(Protocol):
    """A run's config as the trackers see it (zmqrl.config.Config fits): the logging section, and
    the whole config as a dict, logged as the tracker run's config / params."""

    @property
    def logging(self) -> TrackerOptions: ...

    def to_dict(self) -> dict[str, Any]: ...


class TrackerMissing(ConfigError):
    """A backend is named whose package is not installed: the user installs the extra (exit 2)."""


def logging_problem(cfg: TrackedConfig) -> str | None:
    """What in the ``logging`` section cannot work, naming the key, or None. Pure: whether a
    tracker's package is installed is checked where the role starts (``missing_tracker``), so a
    config naming wandb still loads where only a policy is deployed."""
    options = cfg.logging
    for name in options.backends:
        if name not in BACKENDS:
            return f"logging.backends: unknown backend {name!r}; choose from {', '.join(BACKENDS)}"
    if options.wandb_mode not in WANDB_MODES:
        return f"logging.wandb_mode must be one of {', '.join(WANDB_MODES)}, not {options.wandb_mode!r}"
    if not options.project:
        return "logging.project must not be empty (it names the W&B project and the MLflow experiment)"
    return None


def missing_tracker(backends: Sequence[str]) -> str | None:
    """The one line to show when a named tracker's package is not installed, or None."""
    for name in backends:
        module = TRACKER_MODULES.get(name)
        if module is not None and not _importable(module):
            return (
                f"logging.backends names {name}, but the {module} package is not installed: "
                f"pip install 'zmqrl[{name}]'"
            )
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module set to None
        return False


def tracker_run_name(run_dir: Path, cfg: TrackedConfig) -> str:
    """The run's name (run.name), which groups its roles' tracker runs; the directory's otherwise."""
    run = cfg.to_dict().get("run")
    name = run.get("name") if isinstance(run, dict) else None
    return str(name) if name else run_dir.name


def open_tracker(name: str, run_dir: Path, source: str, cfg: TrackedConfig) -> Sink:
    """The sink of the tracker ``name`` (one of TRACKER_MODULES), its tracker run started."""
    options = cfg.logging
    run_name = tracker_run_name(run_dir, cfg)
    if name == "wandb":
        from zmqrl.metrics.wandb_sink import WandbSink

        return WandbSink(run_dir, source, run_name, options, plain(cfg.to_dict()))
    if name == "mlflow":
        from zmqrl.metrics.mlflow_sink import MlflowSink

        return MlflowSink(run_dir, source, run_name, options, flatten(cfg.to_dict()))
    raise ValueError(f"no tracker named {name!r}")


def plain(value: Any) -> Any:
    """``value`` with every leaf a JSON scalar (paths and other objects as strings)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested sections as ``section.key`` -> the value as text (lists and None as YAML would
    show them), for trackers whose params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        elif value is None:
            flat[dotted] = "null"
        elif isinstance(value, bool):
            flat[dotted] = "true" if value else "false"
        else:
            flat[dotted] = str(plain(value))
    return flat
