"""`zmqrl launch --serial` as a user runs it: one process, the stats files of a launched run, the same
final eval from the same seed, Ctrl-C that stops after a final checkpoint, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import run_state
from tests.conftest import tiny_overrides

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "cartpole_dqn.yaml")
# A serial run of a few seconds that evaluates twice and logs progress often.
SMALL = {
    "learner__max_updates": 160,
    "learner__eval_interval": 80,
    "learner__min_replay_size": 100,
    "learner__progress_seconds": 0.1,
}


def serial_launch(run_root: Path, *extra: str, **overrides: object) -> list[str]:
    cmd = [sys.executable, "-m", "zmqrl", "launch", CONFIG, "--serial", *extra]
    for item in tiny_overrides(run_root, **{**SMALL, **overrides}):
        cmd += ["--set", item]
    return cmd


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)


def line_starting(text: str, prefix: str) -> str:
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, f"one {prefix!r} line expected in:\n{text}"
    return found[0]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, subprocess.CompletedProcess[str]]]:
    """Two serial launches of one config and one seed, into separate run roots."""
    runs = []
    for name in ("a", "b"):
        root = tmp_path_factory.mktemp(name)
        runs.append((root / "t", run(serial_launch(root))))
    return runs


def test_a_serial_launch_finishes_and_leaves_the_files_of_a_launched_run(
    two_runs: list[tuple[Path, subprocess.CompletedProcess[str]]],
) -> None:
    run_dir, result = two_runs[0]
    assert result.returncode == 0, result.stderr
    stats = json.loads((run_dir / "stats.json").read_text())
    learner = json.loads((run_dir / "learner-stats.json").read_text())
    assert stats["mode"] == "serial" and len(stats["actors"]) == 1
    assert learner["state"] == "finished" and learner["updates"] == 160
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert re.search(r"INFO serial zmqrl.learner: updates \d+/160 \| samples", result.stderr), (
        "progress lines"
    )
    summary = line_starting(result.stdout, "serial run finished (learner.max_updates reached) in ")
    assert "160 updates" in summary and f"{learner['samples']} samples" in summary
    assert line_starting(result.stdout, "run dir:") == f"run dir: {run_dir}"
    assert line_starting(result.stdout, "final eval:").startswith("final eval: ")


def test_two_serial_launches_with_one_seed_print_the_same_final_eval(
    two_runs: list[tuple[Path, subprocess.CompletedProcess[str]]],
) -> None:
    (dir_a, a), (dir_b, b) = two_runs
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert line_starting(a.stdout, "final eval:") == line_starting(b.stdout, "final eval:")
    history = [json.loads((d / "learner-stats.json").read_text())["eval_history"] for d in (dir_a, dir_b)]
    assert len(history[0]) == 2
    assert [(e["updates"], e["mean"], e["std"]) for e in history[0]] == [
        (e["updates"], e["mean"], e["std"]) for e in history[1]
    ]


def test_ctrl_c_stops_a_serial_run_after_its_final_checkpoint_and_launch_continues_it(
    tmp_path: Path,
) -> None:
    cmd = serial_launch(tmp_path, learner__max_updates=1_000_000)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        # Training: the learner's first scalars (learner.log_interval updates) are in metrics.jsonl.
        while not run_state.metric_steps(tmp_path / "t", "learner", "learner/weights_version"):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(stderr)
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    assert proc.returncode == 130, "".join(stderr)
    run_dir = tmp_path / "t"
    learner = json.loads((run_dir / "learner-stats.json").read_text())
    assert learner["state"] == "stopped" and learner["updates"] > 0
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert f"continue it with: zmqrl launch --serial --resume {run_dir}" in out

    # Launched again, the stopped run continues from that checkpoint instead of starting over.
    again = run(serial_launch(tmp_path, learner__max_updates=learner["updates"] + 20))
    assert again.returncode == 0, again.stderr
    assert f"{run_dir} holds a stopped run: continuing it" in again.stdout
    resumed = json.loads((run_dir / "learner-stats.json").read_text())
    assert resumed["state"] == "finished" and resumed["updates"] == learner["updates"] + 20


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("learner.max_updatez=5", "learner.max_updatez"),
        ("agent.lr=fast", "agent.lr"),
        ("env.id=NoSuchEnv-v0", "NoSuchEnv-v0"),
    ],
)
def test_a_bad_setting_exits_2_with_one_line(tmp_path: Path, setting: str, message: str) -> None:
    result = run([*serial_launch(tmp_path), "--set", setting])
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
