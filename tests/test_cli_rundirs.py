"""Where `zmqrl launch` (either mode) puts a run: never into a previous run's results, continuing a
stopped one (zmqrl/supervisor/rundirs.py's choose_run_dir, which zmqrl.train shares)."""

from __future__ import annotations

import json
from pathlib import Path

from zmqrl.supervisor.rundirs import choose_run_dir, holds_results, next_free_run_dir, previous_run_state


def leave_run(run_dir: Path, state: str | None) -> Path:
    """A run directory as a run leaves it: TensorBoard events, a checkpoint, the learner's stats."""
    (run_dir / "tb").mkdir(parents=True)
    (run_dir / "tb" / "events.out").write_bytes(b"x")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest").write_bytes(b"x")
    if state is not None:
        (run_dir / "learner-stats.json").write_text(json.dumps({"state": state}))
    return run_dir


def test_an_empty_or_missing_directory_is_used_as_it_is(tmp_path: Path) -> None:
    choice = choose_run_dir(tmp_path / "t", resume=False, continue_stopped=True)
    assert (choice.run_dir, choice.resume, choice.moved, choice.continued) == (
        tmp_path / "t",
        False,
        False,
        False,
    )
    (tmp_path / "t" / "tb").mkdir(parents=True)  # an empty tb/ holds no results
    assert not holds_results(tmp_path / "t")
    assert choose_run_dir(tmp_path / "t", resume=False, continue_stopped=True).run_dir == tmp_path / "t"


def test_a_finished_or_failed_run_sends_the_new_one_to_the_next_free_numbered_directory(
    tmp_path: Path,
) -> None:
    leave_run(tmp_path / "t", "finished")
    choice = choose_run_dir(tmp_path / "t", resume=False, continue_stopped=True)
    assert (choice.run_dir, choice.resume, choice.moved, choice.previous) == (
        tmp_path / "t-2",
        False,
        True,
        "finished",
    )
    leave_run(tmp_path / "t-2", "failed")
    assert next_free_run_dir(tmp_path / "t") == tmp_path / "t-3"
    # Results with no stats (a learner killed outright) are still never mixed into.
    leave_run(tmp_path / "u", None)
    assert previous_run_state(tmp_path / "u") is None
    assert choose_run_dir(tmp_path / "u", resume=False, continue_stopped=True).run_dir == tmp_path / "u-2"


def test_a_stopped_run_is_continued_only_when_asked_to_continue_stopped_runs(tmp_path: Path) -> None:
    leave_run(tmp_path / "t", "stopped")
    launch = choose_run_dir(tmp_path / "t", resume=False, continue_stopped=True)
    assert (launch.run_dir, launch.resume, launch.continued) == (tmp_path / "t", True, True)
    other = choose_run_dir(tmp_path / "t", resume=False, continue_stopped=False)
    assert (other.run_dir, other.resume) == (tmp_path / "t-2", False)


def test_resume_stays_in_the_directory_whatever_it_holds(tmp_path: Path) -> None:
    leave_run(tmp_path / "t", "finished")
    choice = choose_run_dir(tmp_path / "t", resume=True, continue_stopped=False)
    assert (choice.run_dir, choice.resume, choice.moved, choice.continued) == (
        tmp_path / "t",
        True,
        False,
        False,
    )


def test_a_finished_run_is_told_by_its_summary_first_then_by_the_learners_stats(tmp_path: Path) -> None:
    """`zmqrl supervise` refuses such a directory (tests/test_supervise_restarts.py): the summary
    counts first, since a learner that later waited in vain for a supervisor rewrites its stats."""
    from zmqrl.supervisor.rundirs import finished_run

    assert finished_run(tmp_path / "none") is None
    run_dir = leave_run(tmp_path / "t", "stopped")
    assert finished_run(run_dir) is None
    (run_dir / "stats.json").write_text(json.dumps({"outcome": "stopped on request (SIGTERM, exit code 0)"}))
    assert finished_run(run_dir) is None, "a stopped run is continued, not refused"
    (run_dir / "stats.json").write_text(
        json.dumps({"outcome": "finished", "launched": 1_700_000_000.0, "wall_seconds": 10.0})
    )
    said = finished_run(run_dir)
    assert said is not None and said.startswith("finished at 2023-11-1")
    assert finished_run(leave_run(tmp_path / "u", "finished")) == "finished"
