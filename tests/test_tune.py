"""``zmqrl tune`` for real: short CartPole trials launched as `zmqrl launch` would, a hopeless one
pruned and stopped cleanly, and a study that survives its tuner's death without losing a trial
or counting one twice.

Which trials are hopeless is made certain, not left to chance: the space tunes
``env.max_episode_steps`` between 500 and 5, and CartPole's episodes last at least 8 steps, so a
trial capped at 5 evaluates worse than any uncapped one from its first evaluation on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO, processes_mentioning, tiny_overrides, wait_until
from zmqrl.cli.app import app
from zmqrl.config import load_config

optuna = pytest.importorskip("optuna", reason="zmqrl tune needs the tune extra: pip install 'zmqrl[tune]'")
from optuna.trial import TrialState  # noqa: E402

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
PRUNING_SPACE = """\
objective: {metric: final_eval}
sampler_seed: 0
pruner: {kind: median, startup_trials: 1, warmup_evaluations: 0}
params:
  env.max_episode_steps: {choices: [500, 5]}
  agent.lr: {float: [0.001, 0.01], log: true}
first_trials:
  - {env.max_episode_steps: 500}
  - {env.max_episode_steps: 5}
"""
# One trial that runs as long as a test needs it to (the command line's --set says how long), then
# whatever the sampler draws.
RESUME_SPACE = PRUNING_SPACE.split("first_trials:")[0] + "first_trials:\n  - {env.max_episode_steps: 500}\n"


def tune_command(tune_dir: Path, space: Path, trials: int, *extra: str, **overrides: object) -> list[str]:
    """`python -m zmqrl tune` on the tiny CartPole run of the other tests (two evaluations)."""
    cmd = [sys.executable, "-m", "zmqrl", "tune", str(CONFIG), "--space", str(space)]
    cmd += ["--trials", str(trials), "--dir", str(tune_dir), *extra]
    for item in tiny_overrides(tune_dir, **overrides):
        cmd += ["--set", item]
    return cmd


def run_tune(cmd: list[str], timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def load_study(tune_dir: Path, name: str = "space") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tune_dir / 'study.db'}")


@pytest.fixture
def space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(PRUNING_SPACE)
    return path


@pytest.fixture
def resume_space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(RESUME_SPACE)
    return path


def test_without_optuna_the_command_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, space: Path
) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` now fails, as when missing
    result = CliRunner().invoke(app, ["tune", str(CONFIG), "--space", str(space)])
    assert result.exit_code == 1
    assert "pip install 'zmqrl[tune]'" in result.output


def test_a_tune_dir_that_cannot_be_made_is_one_line(tmp_path: Path, space: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    args = ["tune", str(CONFIG), "--space", str(space), "--dir", str(blocker / "t")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"--dir: cannot make {blocker / 't'}: {blocker} is a file, not a folder" in result.output


def test_a_postgresql_url_gets_the_extras_driver_and_its_password_is_never_shown(tmp_path: Path) -> None:
    from zmqrl.tune.study import shown_url, storage_url

    url = storage_url(tmp_path, "postgresql://tuner:s3cret@db-host:5432/zmqrl")
    assert url == "postgresql+psycopg://tuner:s3cret@db-host:5432/zmqrl"
    assert "s3cret" not in shown_url(url) and "db-host:5432/zmqrl" in shown_url(url)
    assert storage_url(tmp_path, "postgresql+psycopg2://db/zmqrl") == "postgresql+psycopg2://db/zmqrl"
    assert storage_url(tmp_path, None) == f"sqlite:///{tmp_path.resolve() / 'study.db'}"


def test_list_choices_round_trip_through_the_study_and_first_trials_come_first(tmp_path: Path) -> None:
    from zmqrl.tune.space import load_space
    from zmqrl.tune.study import _encoded, _pruner, decoded, suggest

    path = tmp_path / "space.yaml"
    path.write_text(
        "pruner: {kind: hyperband, warmup_evaluations: 2}\n"
        "params: {agent.hidden_sizes: {choices: [[32, 32], [64, 64, 64]]}}\n"
        "first_trials: [{agent.hidden_sizes: [64, 64, 64]}]\n"
    )
    space = load_space(path)
    study = optuna.create_study(pruner=_pruner(space))
    assert isinstance(study.pruner, optuna.pruners.HyperbandPruner)
    study.enqueue_trial(_encoded(space, space.first_trials[0]))
    trial = study.ask()
    assert suggest(trial, space.params[0]) == [64, 64, 64]  # the enqueued point, as a config value
    assert decoded(space, trial.params) == {"agent.hidden_sizes": [64, 64, 64]}


@pytest.mark.parametrize("name", ["cartpole_dqn", "cartpole_appo", "pendulum_sac"])
def test_every_trial_a_shipped_space_samples_is_a_config_its_run_takes(name: str) -> None:
    """Ints come back as ints on their step, floats inside their range, choices as written; and
    each trial's --set items load over the config they tune (30 trials of Optuna's own sampler)."""
    from zmqrl.tune.space import load_space
    from zmqrl.tune.study import decoded, suggest

    space = load_space(REPO / "configs" / "tune" / f"{name}.yaml")
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=10))
    kinds = {param.kind for param in space.params}
    for _ in range(30):
        trial = study.ask()
        values = {param.key: suggest(trial, param) for param in space.params}
        for param in space.params:
            value = values[param.key]
            if param.kind == "choices":
                assert value in param.choices, (param.key, value)
                continue
            assert param.low <= value <= param.high, (param.key, value)
            if param.kind == "int":
                assert type(value) is int and (value - param.low) % int(param.step or 1) == 0
        assert decoded(space, trial.params) == values
        cfg = load_config(REPO / "configs" / f"{name}.yaml", space.overrides(values))
        for key, value in values.items():
            section, field = key.split(".")
            assert getattr(getattr(cfg, section), field) == value, key
        study.tell(trial, 0.0)
    assert "int" in kinds or name == "pendulum_sac"


@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_and_its_run_stopped_cleanly(run_root: Path, space: Path) -> None:
    tune_dir = run_root / "tune"
    # Runs long enough that a pruned one is stopped well before its own end.
    result = run_tune(tune_command(tune_dir, space, 2, learner__max_updates=600, learner__eval_interval=100))
    assert result.returncode == 0, result.stdout + result.stderr

    states = [t.state for t in load_study(tune_dir).get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED]
    assert "trial 1 pruned at evaluation 1" in result.stdout  # progress is shown as it happens
    # A pruned trial's run was stopped as a user's SIGTERM stops it: summary written, nothing left.
    stats = yaml.safe_load((tune_dir / "trials" / "trial-0001" / "stats.json").read_text())
    assert stats["learner"]["state"] == "stopped"
    assert processes_mentioning(str(tune_dir)) == []

    table = (tune_dir / "results.md").read_text()
    assert "1 complete, 1 pruned" in table and "| 0 |" in table and table in result.stdout
    best = load_config(tune_dir / "best.yaml")  # ready for zmqrl launch
    assert best.env.max_episode_steps == 500 and best.run.name == "space-best"


@pytest.mark.slow
def test_a_tuner_killed_mid_trial_resumes_without_losing_or_recounting_a_trial(
    run_root: Path, resume_space: Path
) -> None:
    space = resume_space
    tune_dir = run_root / "tune"
    # A first trial long enough to be killed in; the resumed tuner's runs are the usual short ones
    # (the study checks the space and config files, not the command line's --set).
    first = subprocess.Popen(
        tune_command(tune_dir, space, 2, "--serial", learner__max_updates=100_000),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tune_dir / "trials" / "trial-0000" / "metrics.jsonl"
    wait_until(
        lambda: metrics.exists() and "eval_return" in metrics.read_text(), 60, "trial 0's first evaluation"
    )
    first.kill()
    first.wait()
    # Its run goes with it (the kernel's SIGTERM on its parent's death), stopping as on any SIGTERM.
    wait_until(lambda: not processes_mentioning(str(tune_dir)), 60, "trial 0's run to stop")
    assert load_study(tune_dir).trials[0].state == TrialState.RUNNING

    resumed = run_tune(tune_command(tune_dir, space, 2, "--serial"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    trials = load_study(tune_dir).get_trials()
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["abandoned"] is True
    assert len(trials) == 3 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials[1:])
    # The point the dead tuner was trying is tried again, first.
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == trials[0].params
    assert f"trial 0: its tuner (pid {first.pid}) is gone" in resumed.stdout


@pytest.mark.slow
def test_ctrl_c_saves_the_trial_as_interrupted_and_enqueues_it_again(
    run_root: Path, resume_space: Path
) -> None:
    space = resume_space
    tune_dir = run_root / "tune"
    tuner = subprocess.Popen(
        tune_command(tune_dir, space, 2, "--serial", learner__max_updates=100_000),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tune_dir / "trials" / "trial-0000" / "metrics.jsonl"
    wait_until(
        lambda: metrics.exists() and "eval_return" in metrics.read_text(), 60, "trial 0's first evaluation"
    )
    tuner.send_signal(signal.SIGINT)
    output, _ = tuner.communicate(timeout=90)
    assert tuner.returncode == 128 + signal.SIGINT, output
    assert processes_mentioning(str(tune_dir)) == []

    interrupted, waiting = load_study(tune_dir).get_trials()
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["interrupted"] is True
    assert waiting.state == TrialState.WAITING and waiting.user_attrs["retry_of"] == 0
    assert "the same command resumes study space" in output
