"""Trackers in a real run, as a user starts one: `zmqrl launch --serial` naming MLflow writes the
learner's scalars into the run's file store, and a tracker whose extra is missing is one line and
exit 2 from the command line, with no traceback."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_overrides
from zmqrl.metrics import METRICS_FILE, read_metrics

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "cartpole_dqn.yaml")
SMALL = {
    "learner__max_updates": 120,
    "learner__eval_interval": 60,
    "learner__min_replay_size": 100,
    "learner__log_interval": 20,
}
# Runs the command line in a Python that sees the named modules as not installed.
WITHOUT = "import runpy, sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','))); "
WITHOUT += "sys.argv = ['zmqrl', *sys.argv[2:]]; runpy.run_module('zmqrl', run_name='__main__')"


def zmqrl(
    run_root: Path, *sets: str, without: str | None = None, command: tuple[str, ...] = ("launch", "--serial")
) -> subprocess.CompletedProcess[str]:
    args = [command[0], CONFIG, *command[1:]]
    for item in [*tiny_overrides(run_root, **SMALL), *sets]:
        args += ["--set", item]
    cmd = (
        [sys.executable, "-c", WITHOUT, without, *args] if without else [sys.executable, "-m", "zmqrl", *args]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZMQRL_", "MLFLOW_", "WANDB_"))}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_serial_run_logs_the_learners_scalars_into_the_mlflow_file_store(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    done = zmqrl(run_root, "logging.backends=[tensorboard, mlflow]")
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = run_root / "t"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the store the run wrote
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("zmqrl").experiment_id])
    assert run.info.run_name == "t-learner" and run.info.status == "FINISHED"
    assert run.data.tags["zmqrl.source"] == "learner" and run.data.params["learner.max_updates"] == "120"
    jsonl: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(run_dir / METRICS_FILE):
        if row["value"] is not None and math.isfinite(row["value"]):
            jsonl.setdefault(row["tag"], []).append((row["step"], row["value"]))
    assert "losses/loss" in jsonl and "charts/eval_return" in jsonl
    for tag, points in jsonl.items():
        history: list[Any] = client.get_metric_history(run.info.run_id, tag)
        assert sorted((m.step, m.value) for m in history) == sorted(points), tag
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("command", [("launch", "--serial"), ("launch",), ("supervise",)])
def test_a_tracker_whose_extra_is_missing_is_one_line_naming_the_pip_command(
    run_root: Path, command: tuple[str, ...]
) -> None:
    """Checked before any process starts or any socket is bound, by every command that runs a
    supervisor, so the supervisor's own logger never meets it inside the run."""
    sets = ("logging.backends=[wandb]", "logging.wandb_mode=offline")
    done = zmqrl(run_root, *sets, without="wandb", command=command)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: logging.backends names wandb, but the wandb package is not installed: "
        "pip install 'zmqrl[wandb]'"
    ]
