"""Whether the run in a directory has finished, and the roles' refusal to write into one that has
(or into one that cannot be made).

A finished run's directory is its result: checkpoints, TensorBoard events, metrics.jsonl, the
learner's and the supervisor's stats. A second ``docker compose up`` with the same run name used
to start every role over it: the supervisor refused, but the learner resumed at its last update,
ended at once and rewrote its stats, a checkpoint and the curves, while the actors and the evaluator
sat healthy waiting for a supervisor. So every role process checks first, before it writes
anything, and a finished run is one line and exit 2 (:class:`RunFinished`, a ConfigError).

Two starts are let through: a role that ``zmqrl launch`` started (the launch chose the directory
itself, and resumes a finished run there only when asked to: ``launch --resume``), and any role
whose environment sets ``CONTINUE_FINISHED_ENV=1`` (continuing a finished run on purpose, e.g.
after raising ``learner.max_updates``, with ``zmqrl supervise --resume``).

Here, below the roles and the supervisor alike, because both ask: ``zmqrl supervise`` refuses the
same directories (zmqrl/supervisor/rundirs.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from zmqrl.errors import ConfigError
from zmqrl.runtime.link import PARENT_PID_ENV

STATS_FILE = "learner-stats.json"  # the learner's final stats, with its "state"
SUMMARY_FILE = "stats.json"  # the supervisor's final summary, with its "outcome"
# Set to 1 in a role's environment to let it continue a run that finished (on purpose).
CONTINUE_FINISHED_ENV = "ZMQRL_CONTINUE_FINISHED"


class RunFinished(ConfigError):
    """The run directory holds a finished run, which this role must not write into (exit 2)."""


def previous_run_state(run_dir: Path) -> str | None:
    """How the last run in ``run_dir`` ended ("finished", "stopped", "failed"), if it left
    checkpoints to continue from; None otherwise."""
    stats = run_dir / STATS_FILE
    if not (run_dir / "checkpoints" / "latest").is_file() or not stats.is_file():
        return None
    try:
        return str(json.loads(stats.read_text()).get("state"))
    except (OSError, ValueError):
        return None


def finished_run(run_dir: Path) -> str | None:
    """A few words on the finished run in ``run_dir`` ("finished at ..."), or None when none finished
    there: the supervisor's summary says "finished", or the learner's own stats do (which a learner
    that merely left since, waiting in vain for a supervisor, may have rewritten as "stopped": so the
    summary is read first)."""
    summary = _read_json(run_dir / SUMMARY_FILE)
    if summary.get("outcome") == "finished":
        launched, wall = summary.get("launched"), summary.get("wall_seconds")
        if isinstance(launched, (int, float)) and isinstance(wall, (int, float)):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(launched + wall))
            return f"finished at {when}"
        return "finished"
    if previous_run_state(run_dir) == "finished":
        return "finished"
    return None


def refuse_finished_run(run_dir: Path, role: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`RunFinished` (one line: what happened, what to do) when ``run_dir`` holds a
    finished run that this ``role`` process may not write into; see the module docstring."""
    env = os.environ if environ is None else environ
    if env.get(PARENT_PID_ENV) or env.get(CONTINUE_FINISHED_ENV) == "1":
        return
    finished = finished_run(run_dir)
    if finished is None:
        return
    raise RunFinished(
        f"the run in {run_dir} {finished}: this {role} will not write into it. Give the new run a name "
        "of its own, the same for every role (ZMQRL_RUN__NAME=NAME, or --set run.name=NAME), or remove "
        f"{run_dir}; to continue that run on purpose (after raising learner.max_updates), start every "
        f"role with {CONTINUE_FINISHED_ENV}=1 and the supervisor with `zmqrl supervise --resume`"
    )


def run_dir_problem(run_dir: Path, setting: str = "run.dir") -> str | None:
    """Why the folder ``run_dir`` (a run's, or any a command writes into) cannot be made and written
    (a file in its way, a folder this user may not write), or None; it reads the nearest part that
    exists and creates nothing. ``setting``: what the user changes to fix it."""
    path = run_dir
    while not path.exists() and path.parent != path:
        path = path.parent
    if not path.is_dir():
        why = f"{path} is a file, not a folder"
    elif not os.access(path, os.W_OK | os.X_OK):
        why = f"this user may not write in {path}"
    else:
        return None
    return f"{setting}: cannot make {run_dir}: {why} (choose another {setting})"


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
