"""The search space file of ``zmqrl tune`` and the scores computed from a run's evaluations: no
run, no Optuna; a bad space is refused before the first trial, naming the file and the key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conftest import REPO
from zmqrl.errors import ConfigError
from zmqrl.tune.objective import UNREACHED_FACTOR, EvalPoint, NoEvaluations, final_value, running_value
from zmqrl.tune.space import Objective, check_keys, load_space

SHIPPED = sorted((REPO / "configs" / "tune").glob("*.yaml"))
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_there_is_an_example_space_for_each_shipped_algorithm() -> None:
    kinds = {path.stem.rsplit("_", 1)[1] for path in SHIPPED}
    assert kinds == {"dqn", "sac", "appo"}


@pytest.mark.parametrize("space", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_space_parses_and_names_only_keys_its_config_has(space: Path) -> None:
    parsed = load_space(space)
    check_keys(parsed, REPO / "configs" / space.name, [])
    assert parsed.first_trials, "each example starts from the shipped config's values, its baseline"


def test_a_space_reads_ranges_log_scales_choices_and_the_objective(tmp_path: Path) -> None:
    space = load_space(
        write(
            tmp_path,
            "objective: {metric: time_to_target, target: 400}\nseeds: [0, 1]\n"
            "pruner: {kind: hyperband}\nset: {learner.max_updates: 500}\nparams:\n"
            "  agent.lr: {float: [0.0001, 0.01], log: true}\n  agent.n_step: {int: [1, 5]}\n"
            "  agent.hidden_sizes: {choices: [[32, 32], [64, 64]]}\n",
        )
    )
    assert space.objective == Objective("time_to_target", "minimize", 400.0)
    assert space.seeds == (0, 1) and space.pruner.kind == "hyperband"
    lr, n_step, sizes = space.params
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 0.0001, 0.01, True)
    assert (n_step.kind, n_step.extremes()) == ("int", [1, 5])
    assert not sizes.plain_choices  # lists are stored in Optuna as their JSON text
    assert space.overrides({"agent.lr": 0.001}) == ["learner.max_updates=500", "agent.lr=0.001"]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("params: {agent.lr: {float: [0.01, 0.001]}}", "params.agent.lr"),
        ("params: {agent.lr: {float: [0, 0.01], log: true}}", "params.agent.lr"),
        ("params: {agent.lr: {uniform: [0, 1]}}", "params.agent.lr"),
        ("params: {agent.n_step: {int: [1.5, 4]}}", "params.agent.n_step"),
        ("params: {learner.eval_interval: {int: [100, 500]}}", "params.learner.eval_interval"),
        ("params: {agent.lr: {choices: []}}", "params.agent.lr"),
        ("objective: {metric: best_eval}\nparams: {agent.lr: {choices: [0.1]}}", "objective.metric"),
        ("objective: {metric: auc, target: 3}\nparams: {agent.lr: {choices: [0.1]}}", "objective.target"),
        ("pruner: {kind: random}\nparams: {agent.lr: {choices: [0.1]}}", "pruner.kind"),
        ("seeds: 3\nparams: {agent.lr: {choices: [0.1]}}", "seeds"),
        ("first_trials: [{agent.gamma: 0.9}]\nparams: {agent.lr: {choices: [0.1]}}", "first_trials[0]"),
        ("trials: 3\nparams: {agent.lr: {choices: [0.1]}}", "'trials'"),
        ("objective: {metric: auc}", "params"),
        ("params:\n  agent.lr: {choices: [0.1]}\n  agent.lr: {choices: [0.2]}", "'agent.lr' is given twice"),
    ],
)
def test_a_malformed_space_names_the_file_and_the_key(tmp_path: Path, text: str, names: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_space(path)
    assert str(path) in str(caught.value) and names in str(caught.value)


def test_a_key_the_config_lacks_is_refused_with_the_closest_one(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "params: {learner.lr: {float: [0.001, 0.01]}}"))
    with pytest.raises(ConfigError, match=r"space.yaml .*learner.lr: the config has no such key.*agent.lr"):
        check_keys(space, CARTPOLE, [])


def test_a_bound_the_config_refuses_is_found_before_any_trial(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "params: {agent.gamma: {float: [0.9, 1.5]}}"))
    with pytest.raises(ConfigError, match=r"params.agent.gamma: 1.5 is refused"):
        check_keys(space, CARTPOLE, [])


CURVE = [EvalPoint(10.0, 1000, 50.0), EvalPoint(20.0, 2000, 300.0), EvalPoint(30.0, 3000, 200.0)]


def test_final_eval_is_the_last_evaluation_and_auc_their_mean() -> None:
    assert final_value(Objective("final_eval"), CURVE, None, 31.0) == 200.0
    assert final_value(Objective("auc"), CURVE, None, 31.0) == pytest.approx(550 / 3)
    assert running_value(Objective("auc"), CURVE[:2], None) == 175.0


def test_time_to_target_is_when_an_evaluation_first_reached_it() -> None:
    objective = Objective("time_to_target", "minimize")
    assert final_value(objective, CURVE, 250.0, 31.0) == 20.0
    # While running, the time so far: a lower bound of the final score, which the pruner compares.
    assert running_value(objective, CURVE[:1], 250.0) == 10.0
    assert running_value(objective, CURVE, 250.0) == 20.0


def test_a_run_that_never_reaches_the_target_scores_worse_than_its_whole_length() -> None:
    assert final_value(Objective("time_to_target", "minimize"), CURVE, 500.0, 31.0) == UNREACHED_FACTOR * 31.0


def test_a_run_without_evaluations_has_no_score() -> None:
    with pytest.raises(NoEvaluations):
        final_value(Objective("final_eval"), [], None, 5.0)
    assert math.isfinite(final_value(Objective("time_to_target", "minimize"), [], 100.0, 5.0))
