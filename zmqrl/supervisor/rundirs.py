"""Run directories: how the run found in one ended, and where a new run goes so it never mixes into it.

A run directory collects one run's TensorBoard events, checkpoints and stats. Starting a second
run in it would interleave two runs' curves and let one overwrite the other's checkpoints, so a
new run whose directory already holds results goes to the first free ``NAME-2``, ``NAME-3``, ...
instead. ``zmqrl launch`` (both modes) and ``zmqrl.train`` decide this with :func:`choose_run_dir`.

``zmqrl supervise`` cannot move a run elsewhere (the roles it watches were started by something
else, writing to the directory their config names), so it refuses a directory whose run finished
(:func:`finished_run`) unless asked to continue it: a second ``docker compose up`` would otherwise
end at once (the learner resumes at its last update) and overwrite the run's ``stats.json`` with
that no-op's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

STATS_FILE = "learner-stats.json"  # the learner's final stats, with its "state"
SUMMARY_FILE = "stats.json"  # the supervisor's final summary, with its "outcome"


@dataclass(frozen=True)
class RunDirChoice:
    """Where a run goes and whether it continues what is there."""

    run_dir: Path  # the directory the run writes to
    resume: bool  # continue from the checkpoints in run_dir
    previous: str | None  # how the run found in the asked-for directory ended, if it can be continued
    moved: bool  # run_dir is a fresh NAME-N because the asked-for one holds results
    continued: bool  # resume was chosen here because the asked-for directory holds a stopped run


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


def holds_results(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run's output (TensorBoard events or checkpoints), which a
    new run must not be mixed into."""
    return any((run_dir / sub).is_dir() and any((run_dir / sub).iterdir()) for sub in ("tb", "checkpoints"))


def next_free_run_dir(run_dir: Path) -> Path:
    """``NAME-2``, ``NAME-3``, ...: the first sibling of ``run_dir`` that holds no results."""
    n = 2
    while holds_results(run_dir.with_name(f"{run_dir.name}-{n}")):
        n += 1
    return run_dir.with_name(f"{run_dir.name}-{n}")


def choose_run_dir(run_dir: Path, *, resume: bool, continue_stopped: bool) -> RunDirChoice:
    """Decide where a run asked to write to ``run_dir`` goes.

    ``resume``: the caller asked to continue that run; it stays there (the learner starts fresh,
    with a warning, if no checkpoint is readable). Otherwise a stopped run there is continued when
    ``continue_stopped`` (what ``zmqrl launch`` does: a Ctrl-C'd run picks up where it left off),
    and a directory holding any other run's results sends this run to the next free ``NAME-N``.
    """
    previous = previous_run_state(run_dir)
    if resume or (previous == "stopped" and continue_stopped):
        return RunDirChoice(run_dir, resume=True, previous=previous, moved=False, continued=not resume)
    if holds_results(run_dir):
        fresh = next_free_run_dir(run_dir)
        return RunDirChoice(fresh, resume=False, previous=previous, moved=True, continued=False)
    return RunDirChoice(run_dir, resume=False, previous=previous, moved=False, continued=False)


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


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
