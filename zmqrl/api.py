"""The Python API: load a config, train in processes or serially, and load a trained policy.

    import zmqrl
    cfg = zmqrl.load_config("configs/cartpole_dqn.yaml", overrides={"learner.max_updates": 2000})
    result = zmqrl.train(cfg, mode="serial")       # or mode="processes": what `zmqrl launch` runs
    policy = zmqrl.load_policy(result.run_dir)     # act(obs) with the final weights
    best = zmqrl.load_policy(result.deploy_path)   # or the one to ship: best (else latest)

Everything here is a thin layer over what the CLI runs, so a script and ``zmqrl launch`` give the
same run. Nothing here imports torch until a run or a policy needs it.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO

from zmqrl.config import Config, config_from_dict
from zmqrl.config import load_config as _load_config
from zmqrl.errors import ConfigError

Overrides = Mapping[str, Any] | Sequence[str] | None
MODES = ("processes", "serial")
# Supervisor exit codes of a run that was not a failure: done, or stopped by Ctrl-C / SIGTERM.
CLEAN_EXITS = (0, 130, 143)


class TrainingFailed(RuntimeError):
    """A run ended in failure (a process crash loop, a learner that failed, a refused start); the
    partial result, with the run directory and whatever stats exist, is in ``result``."""

    def __init__(self, message: str, result: TrainResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class TrainResult:
    """What a run produced: its final stats, as ``stats.json`` in the run directory also holds."""

    run_dir: Path
    mode: str  # "processes" or "serial"
    state: str  # the learner's final state: "finished" (reached its end), "stopped" or "failed"
    learner: dict[str, Any]  # the learner's final counters (updates, samples, eval_return, ...)
    actors: list[dict[str, Any]]  # one row per actor (steps, episodes, samples, weights_version, ...)
    eval_history: list[dict[str, Any]] = field(default_factory=list)  # every evaluation, in order
    exit_code: int = 0  # the supervisor's exit code (processes mode)
    # The checkpoint to deploy and why, as the summary's last line says: {"path", "eval_return",
    # "eval_std", "final_eval_return", "why"} (zmqrl/checkpoints/choice.py); empty if the run wrote none.
    deploy: dict[str, Any] = field(default_factory=dict)
    failure: str = ""  # why a failed run failed, in a line (processes mode: the supervisor's verdict)

    @property
    def ended(self) -> str:
        """Why the run ended: "max_updates", "max_seconds", "target held" (learner.stop_at_target),
        "actor max_steps" (serial), or for a run that did not reach its end, its state."""
        return str(self.learner.get("ended", self.state))

    @property
    def deploy_path(self) -> Path | None:
        """``checkpoints/best`` when the run has one (the best evaluated weights), else
        ``checkpoints/latest``; None when it wrote no checkpoint."""
        path = self.deploy.get("path")
        return Path(path) if path else None

    @property
    def final_eval(self) -> float:
        """Mean return of the last evaluation (NaN when there was none)."""
        return float(self.eval_history[-1]["mean"]) if self.eval_history else math.nan

    @property
    def updates(self) -> int:
        return int(self.learner.get("updates", 0))


def load_config(path: str | Path | None = None, overrides: Overrides = None) -> Config:
    """Read a YAML config (None: the defaults), then the ``ZMQRL_SECTION__KEY`` environment
    variables, then ``overrides``: ``{"learner.max_updates": 5000}`` or ``["learner.max_updates=5000"]``.
    Raises :class:`~zmqrl.errors.ConfigError` naming the key and the file on any bad value."""
    return _load_config(path, _as_set_items(overrides))


def validate(config: Config, overrides: Overrides = None) -> Config:
    """A config built or edited in code, checked as a file would be (the same coercions and
    errors) with ``overrides`` applied; returns the checked copy."""
    items = _as_set_items(overrides)
    return config_from_dict(config.to_dict(), "<config built in code>", items, trusted=True)


def train(
    config: Config | str | Path,
    mode: Literal["processes", "serial"] = "processes",
    *,
    overrides: Overrides = None,
    resume: bool = False,
    out: TextIO | None = None,
) -> TrainResult:
    """Train, and return the final stats.

    ``mode="processes"`` runs exactly what ``zmqrl launch`` runs: a supervisor (in this process)
    starting the learner and ``actor.num_actors`` actors as OS processes; progress lines go to
    ``out`` (default stdout). ``mode="serial"`` runs the same components in this one thread,
    deterministically (see zmqrl/serial.py). A run directory that holds a previous run's results
    is never mixed into: the run goes to ``NAME-2`` (etc.) unless ``resume`` continues it.

    Raises :class:`TrainingFailed` when the run fails, ``ConfigError`` on bad settings. In
    processes mode, what ``zmqrl launch`` checks before it starts anything is raised here too: an env
    that cannot be made, messages the learner would drop for their size, an absent CUDA device, a
    missing tracker (``ConfigError``), and a learner port another process holds
    (``zmqrl.transport.sockets.BindError``); see zmqrl/supervisor/preflight.py.
    """
    if mode not in MODES:
        raise ConfigError(f"train(mode={mode!r}): expected one of {', '.join(MODES)}")
    cfg = validate(config, overrides) if isinstance(config, Config) else load_config(config, overrides)
    from zmqrl.runtime.finished import run_dir_problem
    from zmqrl.supervisor.rundirs import choose_run_dir

    if problem := run_dir_problem(cfg.run_dir):  # either mode: before anything is written
        raise ConfigError(problem)
    if mode == "processes":
        _preflight(cfg)

    # As `zmqrl launch` decides, except that a stopped run is continued only when asked to.
    place = choose_run_dir(cfg.run_dir, resume=resume, continue_stopped=False)
    if place.moved:
        cfg = replace(cfg, run=replace(cfg.run, name=place.run_dir.name))
    run = _train_serial if mode == "serial" else _train_processes
    result = run(cfg, place.resume, out)
    failed = result.state not in ("finished", "stopped") or result.exit_code not in CLEAN_EXITS
    if failed:
        why = f"{result.failure}; " if result.failure else ""
        logs = result.run_dir / "logs"
        raise TrainingFailed(
            f"training failed ({result.state}, exit code {result.exit_code}): {why}see {logs}", result
        )
    return result


def _preflight(cfg: Config) -> None:
    from zmqrl.supervisor.preflight import preflight_problem
    from zmqrl.transport.sockets import BindError

    if problem := preflight_problem(cfg):
        raise ConfigError(problem.message) if problem.setting else BindError(problem.message)


def _train_serial(cfg: Config, resume: bool, out: TextIO | None) -> TrainResult:
    from zmqrl import strictjson
    from zmqrl.serial import run_serial

    stats = run_serial(cfg, resume=resume)
    (cfg.run_dir / "stats.json").write_text(strictjson.dumps(stats, indent=2))
    learner = stats["learner"]
    return TrainResult(
        run_dir=cfg.run_dir,
        mode="serial",
        state=str(learner.get("state", "failed")),
        learner=learner,
        actors=stats["actors"],
        eval_history=list(learner.get("eval_history", [])),
        deploy=dict(stats.get("deploy") or {}),
    )


def _train_processes(cfg: Config, resume: bool, out: TextIO | None) -> TrainResult:
    from zmqrl.supervisor.launch import Supervisor

    supervisor = Supervisor(cfg, launched=time.time(), resume=resume, out=out or sys.stdout)
    code = supervisor.run()
    summary = supervisor.summary or _read_json(supervisor.run_dir / "stats.json")
    learner = dict(summary.get("learner", {}))
    return TrainResult(
        run_dir=supervisor.run_dir,
        mode="processes",
        state=str(learner.get("state", "failed")),
        learner=learner,
        actors=list(summary.get("actors", [])),
        eval_history=list(learner.get("eval_history", [])),
        exit_code=code,
        deploy=dict(summary.get("deploy") or {}),
        failure=supervisor.failure or "",
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _as_set_items(overrides: Overrides) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        # JSON is YAML: each value is read back exactly as a --set value would be.
        return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError(
            "overrides: expected a mapping or a list of 'section.key=value' strings, got a string"
        )
    return list(overrides)
