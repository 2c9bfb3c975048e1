"""A finished run's files never change (issue 37, item 9): a second `docker compose up` with the
same run name used to have the learner resume at its last update, end at once and rewrite its
stats, a checkpoint, metrics.jsonl and the TensorBoard files, while the actors and the evaluator
sat healthy for a minute. Every role command now refuses a finished run directory before it writes
anything: one line, exit 2. Roles started by `zmqrl launch` (which chose the directory itself) and
roles told to continue the run on purpose go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, tiny_overrides
from zmqrl.cli.app import app
from zmqrl.errors import ConfigError
from zmqrl.runtime.finished import CONTINUE_FINISHED_ENV, RunFinished, refuse_finished_run
from zmqrl.runtime.link import PARENT_PID_ENV


def finished_run(run_dir: Path, *, summary: bool = True) -> Path:
    """A run directory as a finished run leaves it."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_bytes(b"ckpt")
    (run_dir / "tb" / "learner").mkdir(parents=True)
    (run_dir / "tb" / "learner" / "events.out.tfevents.1").write_bytes(b"events")
    (run_dir / "metrics.jsonl").write_text('{"tag": "losses/loss", "value": 1.0}\n')
    (run_dir / "learner-stats.json").write_text(json.dumps({"state": "finished", "updates": 300}))
    (run_dir / "evaluator-stats.json").write_text(json.dumps({"evaluations": 3}))
    if summary:
        outcome = {"outcome": "finished", "launched": 1_700_000_000.0, "wall_seconds": 60.0}
        (run_dir / "stats.json").write_text(json.dumps(outcome))
    return run_dir


def files_of(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every path under ``run_dir``: its bytes and modification time (directories: b"", mtime)."""
    return {
        str(p.relative_to(run_dir)): (b"" if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
    }


def test_a_finished_run_is_refused_with_what_to_do(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "t")
    with pytest.raises(RunFinished) as refused:
        refuse_finished_run(run_dir, "learner", environ={})
    said = str(refused.value)
    assert isinstance(refused.value, ConfigError), "exit 2 at the command line, one line"
    assert said.startswith(f"the run in {run_dir} finished at 2023-11-1") and "this learner" in said
    assert "ZMQRL_RUN__NAME" in said and f"remove {run_dir}" in said
    # Told by the learner's own stats when no supervisor wrote a summary (a run by hand).
    bare = finished_run(tmp_path / "u", summary=False)
    with pytest.raises(RunFinished):
        refuse_finished_run(bare, "actor", environ={})


def test_a_stopped_or_new_run_and_the_runs_launch_starts_go_on(tmp_path: Path) -> None:
    refuse_finished_run(tmp_path / "new", "learner", environ={})
    stopped = finished_run(tmp_path / "s", summary=False)
    (stopped / "learner-stats.json").write_text(json.dumps({"state": "stopped"}))
    refuse_finished_run(stopped, "learner", environ={})  # a stopped run is continued
    done = finished_run(tmp_path / "t")
    refuse_finished_run(done, "learner", environ={PARENT_PID_ENV: "123"})  # launch --resume chose it
    refuse_finished_run(done, "learner", environ={CONTINUE_FINISHED_ENV: "1"})  # continued on purpose
    with pytest.raises(RunFinished):
        refuse_finished_run(done, "learner", environ={CONTINUE_FINISHED_ENV: ""})  # compose's empty default


@pytest.mark.parametrize(
    "command", [["learner", "--resume"], ["actor", "--id", "auto"], ["evaluator", "--resume"]]
)
def test_every_role_refuses_a_finished_run_before_writing_anything(
    run_root: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As compose starts them (supervised, the learner and evaluator with --resume); the actor's
    `--id auto` would write its id's lock file into the run directory."""
    run_dir = finished_run(run_root / "t")
    before = files_of(run_dir)
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    monkeypatch.delenv(CONTINUE_FINISHED_ENV, raising=False)
    args = [command[0], str(REPO / "configs" / "cartpole_dqn.yaml"), *command[1:]]
    for item in [*tiny_overrides(run_root), "supervisor.join_timeout=1"]:
        args += ["--set", item]
    result = CliRunner().invoke(app, args, env={"ZMQRL_SUPERVISED": "1"})
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the run in {run_dir} finished at " in errors[0], result.output
    assert "Traceback" not in result.output
    assert files_of(run_dir) == before, "a finished run's files changed"
