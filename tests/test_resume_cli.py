"""Resuming as a user does, in real processes: the resume line, the replay that comes back by
default, a run whose settings changed (refused unless forced), a disk that cannot take the
checkpoint, and a learner killed between a replay snapshot and its checkpoint (issue 23, items
10 and 11)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import run_state
from tests.conftest import tiny_overrides, wait_until
from tests.test_launch import Launch, assert_nothing_left, learner_pid
from zmqrl.runtime.finished import CONTINUE_FINISHED_ENV

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "cartpole_dqn.yaml")
# A serial run of a few seconds whose replay holds more than min_replay_size when it ends.
SMALL = {
    "learner__max_updates": 120,
    "learner__eval_interval": 0,
    "learner__min_replay_size": 300,
}


def zmqrl(
    *args: str, limit_file_bytes: int | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")} | (extra_env or {})

    def limit() -> None:  # in the child: writes past this size fail with EFBIG, as on a full disk
        if limit_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    return subprocess.run(
        [sys.executable, "-m", "zmqrl", *args],
        cwd=REPO,
        env={**env, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )


def sets(run_root: Path, **extra: object) -> list[str]:
    return [arg for item in tiny_overrides(run_root, **{**SMALL, **extra}) for arg in ("--set", item)]


def resume_line(log: str, checkpoint: Path) -> str:
    """The one line that tells the user which checkpoint the run resumed from."""
    found = [line for line in log.splitlines() if f"resumed from {checkpoint}" in line]
    assert len(found) == 1, f"one resume line expected in:\n{log}"
    return found[0]


def error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory left by a serial run of the shipped CartPole config at its defaults."""
    root = tmp_path_factory.mktemp("runs")
    first = zmqrl("launch", CONFIG, "--serial", *sets(root))
    assert first.returncode == 0, first.stderr
    return root / "t"


@pytest.fixture
def run_dir(finished_run: Path, tmp_path: Path) -> Path:
    """A copy of ``finished_run`` for one test to resume (and change)."""
    copy = tmp_path / "runs" / "t"
    shutil.copytree(finished_run, copy)
    return copy


def test_a_resumed_run_gets_its_replay_back_by_default_and_says_so_in_its_resume_line(run_dir: Path) -> None:
    resumed = zmqrl("launch", "--serial", "--resume", str(run_dir), "--set", "learner.max_updates=140")
    assert resumed.returncode == 0, resumed.stderr
    line = resume_line(resumed.stderr, run_dir / "checkpoints" / "latest")
    found = run_state.learner_stats(run_dir)["resumed_from"]
    assert found["path"] == str(run_dir / "checkpoints" / "latest") and found["updates"] == 120
    assert found["replay_file"] == "replay-0000000120.npz" and found["replay_rows"] >= 300, found
    assert "waiting for" not in resumed.stderr.split(line)[1], "trains at once from the restored replay"


def test_resuming_with_a_changed_gamma_or_n_step_is_refused_in_one_line_naming_them(run_dir: Path) -> None:
    refused = zmqrl("launch", "--serial", "--resume", str(run_dir), "--set", "agent.gamma=0.9")
    assert refused.returncode == 2, refused.stderr
    line = error_line(refused.stderr)
    assert "agent.gamma 0.9 here, 0.99 at the checkpoint" in line and "--force" in line
    assert "agent.n_step" not in line, "only the keys that differ"

    # A learner started by hand on the finished run, continuing it on purpose (else it refuses the
    # finished run before anything else: tests/test_finished_run.py).
    learner = zmqrl(
        "learner", CONFIG, "--resume", *sets(run_dir.parent, agent__n_step=5),
        extra_env={CONTINUE_FINISHED_ENV: "1"},
    )  # fmt: skip
    assert learner.returncode == 2, learner.stderr
    assert "agent.n_step 5 here, 3 at the checkpoint" in error_line(learner.stderr)


def test_a_forced_resume_goes_on_with_the_new_settings_and_the_force_ends_with_that_launch(
    run_dir: Path,
) -> None:
    forced = zmqrl(
        "launch", "--serial", "--resume", str(run_dir), "--force",
        "--set", "agent.gamma=0.9", "--set", "learner.max_updates=200",
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert "agent.gamma 0.9 here, 0.99 at the checkpoint" in forced.stderr
    assert "resuming anyway" in forced.stderr

    # run_dir/config.yaml now says force_resume: true; a later resume with another change is still refused.
    again = zmqrl("launch", "--serial", "--resume", str(run_dir), "--set", "agent.gamma=0.5")
    assert again.returncode == 2 and "agent.gamma 0.5 here, 0.9 at the checkpoint" in error_line(again.stderr)


def test_a_disk_that_cannot_take_a_checkpoint_ends_the_run_with_exit_2_and_one_line(run_root: Path) -> None:
    """A real write error from the kernel (a file size limit: EFBIG), not a restart loop."""
    run_dir = run_root / "t"
    failed = zmqrl("launch", CONFIG, "--serial", *sets(run_root), limit_file_bytes=24 * 1024)
    assert failed.returncode == 2, failed.stderr
    line = error_line(failed.stderr)
    assert f"in {run_dir / 'checkpoints'}: File too large [EFBIG]" in line, line
    assert "checkpoint.replay_max_mb" in line and f"zmqrl launch --resume {run_dir}" in line
    assert "Traceback" not in failed.stderr
    left = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert not [name for name in left if name.startswith(".")], "no temp files"


@pytest.mark.heavy
def test_a_learner_killed_between_a_snapshot_and_its_checkpoint_resumes_the_previous_pair(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst moment, in a real launch: the writer has put replay-200.npz on disk and stops
    before ckpt-200 (a test hook); the learner is SIGKILLed there. Its replacement resumes ckpt-100
    with ckpt-100's own replay, and the run completes."""
    run_dir = run_root / "t"
    monkeypatch.setenv("ZMQRL_TEST_HOOKS", f"torn_pair_once={run_root / 'torn-pair-fired'}")
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=600,
            learner__checkpoint_interval=100,
            learner__eval_interval=0,
            supervisor__restart_backoff=0.2,
        )
    )
    wait_until((run_root / "torn-pair-fired").exists, 90, "the checkpoint writer to stop (the hook's marker)")
    checkpoints = run_dir / "checkpoints"
    wait_until((checkpoints / "replay-0000000200.npz").is_file, 10, "the snapshot of the torn pair")
    assert not (checkpoints / "ckpt-0000000200").exists()
    os.kill(learner_pid(run_dir), signal.SIGKILL)

    assert launch.finish(timeout=180) == 0, launch.output
    assert_nothing_left(run_dir)
    stats = run_state.run_stats(run_dir)["learner"]
    found = stats["resumed_from"]
    assert found["updates"] == 100, found
    assert found["replay_file"] == "replay-0000000100.npz" and found["replay_rows"] > 0, found
    assert stats["state"] == "finished" and stats["updates"] == 600
    left = sorted(p.name for p in checkpoints.iterdir())
    assert not [name for name in left if name.startswith(".")], left
    pairs = {name[len("ckpt-") :] for name in left if name.startswith("ckpt-")}
    assert {name[len("replay-") : -len(".npz")] for name in left if name.startswith("replay-")} == pairs
