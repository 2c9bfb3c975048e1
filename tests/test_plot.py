"""`zmqrl plot`: return curves from metrics.jsonl, seeds aggregated as mean with a min–max band."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO
from zmqrl.cli.app import app
from zmqrl.cli.plotting import EVAL_TAG, TRAIN_TAG, aggregate, group_runs, load_run, smooth
from zmqrl.metrics import METRICS_FILE, metrics_row

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(
    run_dir: Path,
    *,
    seed: int = 0,
    lr: float = 0.001,
    target: float | None = 100.0,
    episodes: int = 60,
    scale: float = 1.0,
) -> Path:
    """A run directory as a run leaves it: config.yaml and a metrics.jsonl with returns rising with
    env steps (``scale`` tells runs apart), evaluations every 10 episodes."""
    run_dir.mkdir(parents=True)
    config = {
        "run": {"name": run_dir.name, "seed": seed, "dir": str(run_dir.parent)},
        "env": {"id": "CartPole-v1"},
        "agent": {"kind": "dqn", "lr": lr},
        "learner": {"target_return": target},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for i in range(episodes):
        step, seconds = 100 * (i + 1), 0.5 * (i + 1)
        lines.append(metrics_row("learner", TRAIN_TAG, scale * i, step, launched=0.0, wall=seconds))
        lines.append(metrics_row("learner", "losses/loss", 0.1, i, launched=0.0, wall=seconds))
        if i % 10 == 9:
            lines.append(metrics_row("evaluator", EVAL_TAG, scale * 2 * i, step, launched=0.0, wall=seconds))
    (run_dir / METRICS_FILE).write_text("".join(lines))
    return run_dir


def plot(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["plot", *args], env={"COLUMNS": "120", "NO_COLOR": "1"})
    return result.exit_code, result.output


def test_mean_min_and_max_over_runs_on_a_common_grid() -> None:
    x = np.array([0.0, 10.0])
    band = aggregate([(x, np.array([0.0, 10.0])), (x, np.array([10.0, 30.0]))], points=3)
    assert band.grid.tolist() == [0.0, 5.0, 10.0]
    assert band.mean.tolist() == [5.0, 12.5, 20.0]
    assert band.low.tolist() == [0.0, 5.0, 10.0] and band.high.tolist() == [10.0, 20.0, 30.0]
    assert band.count.tolist() == [2, 2, 2]


def test_a_shorter_run_counts_only_over_the_steps_it_covers() -> None:
    long = (np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    short = (np.array([0.0, 5.0]), np.array([4.0, 4.0]))
    band = aggregate([long, short], points=3)
    assert band.count.tolist() == [2, 2, 1]
    assert band.mean.tolist() == [2.0, 4.5, 10.0]  # at 10 only the long run: not extended flat
    assert band.low.tolist() == [0.0, 4.0, 10.0] and band.high.tolist() == [4.0, 5.0, 10.0]


def test_one_run_is_its_own_points_and_episodes_at_one_step_keep_the_latest_mean() -> None:
    band = aggregate([(np.array([3.0, 1.0, 3.0]), np.array([9.0, 1.0, 7.0]))])
    assert band.grid.tolist() == [1.0, 3.0] and band.mean.tolist() == [1.0, 7.0]


def test_training_returns_are_a_trailing_mean() -> None:
    assert smooth(np.array([2.0, 4.0, 6.0, 8.0]), 2).tolist() == [2.0, 3.0, 5.0, 7.0]
    assert smooth(np.array([1.0, 5.0]), 1).tolist() == [1.0, 5.0]


def test_seeds_of_one_setting_form_one_group_and_other_settings_are_labelled(tmp_path: Path) -> None:
    runs = [
        load_run(write_run(tmp_path / "a", seed=0)),
        load_run(write_run(tmp_path / "b", seed=1)),
        load_run(write_run(tmp_path / "c", seed=0, lr=0.01)),
    ]
    groups = group_runs(runs)
    assert [len(g.runs) for g in groups] == [2, 1]
    assert [g.name for g in groups] == ["agent.lr=0.001 (2 runs)", "agent.lr=0.01"]
    assert group_runs(runs[:2])[0].name == "CartPole-v1, dqn (2 runs)"  # one setting: what it is


def test_seeds_launched_on_different_ports_are_still_one_setting(tmp_path: Path) -> None:
    runs = []
    for seed, port in ((0, 40111), (1, 40222)):
        run = write_run(tmp_path / f"s{seed}", seed=seed)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["transport"] = {"samples": f"tcp://127.0.0.1:{port}", "control": f"ipc://{run}.control"}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        runs.append(load_run(run))
    assert [len(g.runs) for g in group_runs(runs)] == [2]


def test_a_setting_an_older_run_does_not_record_does_not_split_the_seeds(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", seed=0)
    new = write_run(tmp_path / "new", seed=1)
    config = yaml.safe_load((new / "config.yaml").read_text())
    config["learner"]["stop_at_target"] = False  # a key added by a later version
    (new / "config.yaml").write_text(yaml.safe_dump(config))
    groups = group_runs([load_run(old), load_run(new)])
    assert [len(g.runs) for g in groups] == [2]


def test_seconds_run_on_across_a_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    rows = [
        metrics_row("learner", TRAIN_TAG, 1.0, s, launched=0.0, wall=w) for s, w in ((1, 10.0), (2, 20.0))
    ]
    rows += [metrics_row("learner", TRAIN_TAG, 1.0, 3, launched=100.0, wall=105.0)]  # relaunched
    (run_dir / METRICS_FILE).write_text("".join(rows))
    train = load_run(run_dir).train
    assert train is not None and train.time.tolist() == [10.0, 20.0, 25.0]
    assert train.steps.tolist() == [1.0, 2.0, 3.0]


def test_train_and_eval_of_a_resumed_run_share_one_clock(tmp_path: Path) -> None:
    """The first launch ends with an evaluation 10 s after its last training episode (its final
    one): the relaunch continues from that latest moment for both curves. Each curve counted from
    its own latest row before, so a resumed run's training curve sat 10 s left of its evaluations."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    rows = [
        metrics_row("learner", TRAIN_TAG, 1.0, 1, launched=0.0, wall=10.0),
        metrics_row("learner", EVAL_TAG, 2.0, 1, launched=0.0, wall=20.0),
        metrics_row("supervisor", "actor/alive", 1.0, 0, launched=100.0, wall=101.0),  # relaunched
        metrics_row("learner", TRAIN_TAG, 1.0, 2, launched=100.0, wall=105.0),
        metrics_row("evaluator", EVAL_TAG, 2.0, 2, launched=100.0, wall=106.0),
    ]
    (run_dir / METRICS_FILE).write_text("".join(rows))
    run = load_run(run_dir)
    assert run.train is not None and run.train.time.tolist() == [10.0, 25.0]
    assert run.eval is not None and run.eval.time.tolist() == [20.0, 26.0]


def test_plotting_two_runs_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    a = write_run(tmp_path / "a", seed=0)
    b = write_run(tmp_path / "b", seed=1, scale=1.5)
    out = tmp_path / "out" / "curves.png"
    code, output = plot(str(a), str(b), "-o", str(out), "--title", "two seeds")
    assert code == 0, output
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000
    assert "2 runs in 1 group(s)" in output


@pytest.mark.parametrize("axis", ["steps", "time"])
def test_one_axis_only(tmp_path: Path, axis: str) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "c.png"
    code, output = plot(str(write_run(tmp_path / "a")), "-o", str(out), "--x", axis)
    assert code == 0, output
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_an_output_whose_folder_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """It was a traceback from matplotlib's save, after the figure was drawn."""
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "afile"
    blocker.write_text("")
    code, output = plot(str(write_run(tmp_path / "a")), "-o", str(blocker / "c.png"))
    assert code == 2 and f"--output: cannot make {blocker}: {blocker} is a file" in output, output


def test_a_run_dir_without_metrics_is_named_in_the_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    empty = tmp_path / "old-run"
    empty.mkdir()
    code, output = plot(str(write_run(tmp_path / "a")), str(empty), "-o", str(tmp_path / "c.png"))
    assert code == 2
    assert f"error: {empty}: no {METRICS_FILE}" in output
    assert not (tmp_path / "c.png").exists()


def test_without_matplotlib_one_line_says_how_to_install_it(tmp_path: Path) -> None:
    probe = (
        "import sys\nsys.modules['matplotlib'] = None  # as if not installed\n"
        f"sys.argv = ['zmqrl', 'plot', {str(write_run(tmp_path / 'a'))!r}, '-o', 'x.png']\n"
        "from zmqrl.cli.app import main\nmain()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: zmqrl plot needs matplotlib: pip install 'zmqrl[plot]'"
    assert not (tmp_path / "x.png").exists()


def test_help_ends_with_an_example() -> None:
    code, output = plot("--help")
    assert code == 0
    assert output.strip().splitlines()[-1].strip().startswith("Example: zmqrl plot ")


def test_the_repository_declares_the_plot_extra() -> None:
    assert 'plot = ["matplotlib>=3.7"]' in (REPO / "pyproject.toml").read_text()
