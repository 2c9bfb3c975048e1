"""Run directories: how the run found in one ended, and where a new run goes so it never mixes into it.

A run directory collects one run's TensorBoard events, checkpoints and stats. Starting a second
run in it would interleave two runs' curves and let one overwrite the other's checkpoints, so a
new run whose directory already holds results goes to the first free ``NAME-2``, ``NAME-3``, ...
instead. ``zmqrl launch`` (both modes) and ``zmqrl.train`` decide this with :func:`choose_run_dir`.

``zmqrl supervise`` cannot move a run elsewhere (the roles it watches were started by something
else, writing to the directory their config names), so it refuses a directory whose run finished
(``finished_run``, from zmqrl/runtime/finished.py, which the roles ask too) unless asked to continue
it: a second ``docker compose up`` would otherwise end at once (the learner resumes at its last
update) and overwrite the run's ``stats.json`` with that no-op's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# How a run ended is read below the roles, which refuse a finished run too.
from zmqrl.runtime.finished import STATS_FILE as STATS_FILE
from zmqrl.runtime.finished import SUMMARY_FILE as SUMMARY_FILE
from zmqrl.runtime.finished import finished_run as finished_run
from zmqrl.runtime.finished import previous_run_state as previous_run_state


@dataclass(frozen=True)
class RunDirChoice:
    """Where a run goes and whether it continues what is there."""

    run_dir: Path  # the directory the run writes to
    resume: bool  # continue from the checkpoints in run_dir
    previous: str | None  # how the run found in the asked-for directory ended, if it can be continued
    moved: bool  # run_dir is a fresh NAME-N because the asked-for one holds results
    continued: bool  # resume was chosen here because the asked-for directory holds a stopped run


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
