"""`zmqrl bench solve`: reading when each side first reached the target, the table and ratios built
from canned runs, the SB3 side's evaluation schedule, and the command's refusals. No speed is
asserted: the benchmark prints ratios, tests check behaviour."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from zmqrl_bench import solve
from zmqrl_bench.sb3_run import RunArgs, SolveWatch
from zmqrl_bench.solve import Reached, SolveRun, markdown_table, summarise

HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
needs_sb3 = pytest.mark.skipif(
    not HAS_SB3, reason="stable-baselines3 is not installed (pip install 'zmqrl[sb3]')"
)


def run(side: str, seed: int, seconds: float | None, steps: int | None, status: str = "solved") -> SolveRun:
    return SolveRun(side, seed, status if seconds is not None else "not reached", seconds, steps, 60.0)


def canned() -> list[SolveRun]:
    return [
        run("zmqrl", 0, 10.0, 12_000),
        run("sb3", 0, 40.0, 20_000),
        run("zmqrl", 1, 20.0, 30_000),
        run("sb3", 1, None, None),  # never reached 475
        run("zmqrl", 2, 30.0, 18_000),
        run("sb3", 2, 60.0, 24_000),
    ]


def test_summary_counts_a_run_that_never_solved_as_slowest_and_ratios_are_sb3_over_zmqrl() -> None:
    s = summarise(canned())
    assert (s["zmqrl"]["solved"], s["sb3"]["solved"]) == (3, 2)
    assert s["zmqrl"]["median_seconds"] == 20.0
    assert s["sb3"]["median_seconds"] == 60.0  # 40, 60, inf
    assert (s["sb3"]["min_seconds"], s["sb3"]["max_seconds"]) == (40.0, 60.0)
    assert s["ratio_seconds"] == pytest.approx(3.0)
    assert s["ratio_env_steps"] == pytest.approx(24_000 / 18_000)


def test_a_side_that_solved_on_too_few_seeds_has_no_median_and_no_ratio() -> None:
    runs = [run("zmqrl", 0, 5.0, 1), run("sb3", 0, None, None)]
    runs += [run("zmqrl", 1, 6.0, 1), run("sb3", 1, None, None)]
    s = summarise(runs)
    assert math.isinf(s["sb3"]["median_seconds"]) and s["ratio_seconds"] is None
    assert "not reached" in markdown_table(runs, s).splitlines()[-1]


def test_table_has_a_row_per_seed_with_its_ratios_and_a_median_row() -> None:
    text = markdown_table(canned(), summarise(canned()))
    lines = text.splitlines()
    assert len(lines) == 2 + 3 + 1
    assert lines[2].startswith("| 0 | 10.0 s | 12.0k | 40.0 s | 20.0k | 4.00x | 1.67x |")
    assert "| 1 | 20.0 s | 30.0k | not reached" in lines[3] and lines[3].endswith("| — | — |")
    assert lines[-1].startswith("| median (3/3 and 2/3 solved) | 20.0 s (10.0 s–30.0 s)")
    assert "3.00x" in lines[-1]


def test_sb3_training_time_alone_is_put_against_zmqrl_time_from_launch_in_two_more_columns() -> None:
    runs = [
        SolveRun("zmqrl", 0, "solved", 2.0, 9_000, 3.0, startup_seconds=1.5),
        SolveRun("sb3", 0, "solved", 9.0, 12_000, 9.5, train_seconds=4.0),
        SolveRun("zmqrl", 1, "solved", 4.0, 20_000, 5.0, startup_seconds=1.7),
        SolveRun("sb3", 1, "solved", 11.0, 14_000, 11.5, train_seconds=5.0),
        SolveRun("zmqrl", 2, "solved", 3.0, 15_000, 4.0, startup_seconds=1.6),
        SolveRun("sb3", 2, "not reached", None, None, 30.0),
    ]
    s = summarise(runs)
    assert s["sb3"]["median_train_seconds"] == 5.0  # 4, 5, inf: a run that never solved is slowest
    assert (s["sb3"]["min_train_seconds"], s["sb3"]["max_train_seconds"]) == (4.0, 5.0)
    assert s["zmqrl"]["median_startup_seconds"] == 1.6
    assert s["ratio_train_seconds"] == pytest.approx(5.0 / 3.0)  # SB3's training alone / zmqrl's time
    lines = markdown_table(runs, s).splitlines()
    assert lines[0].endswith("| SB3 training | SB3 training/zmqrl time |")
    assert lines[2].endswith("| 4.0 s | 2.00x |") and lines[4].endswith("| — | — |")
    assert lines[-1].endswith("| 5.0 s (4.0 s–5.0 s) | 1.67x |")
    assert "| — | — |" in markdown_table(canned(), summarise(canned())).splitlines()[-1]  # none measured


def test_sb3_training_time_leaves_out_start_up_and_every_evaluation() -> None:
    watch = SolveWatch(every=1000, target=475.0, started=50.0)
    watch.learning(55.0)  # imports and the model took 5 s: not training
    assert not watch.add(1000, 200.0, 5.0, now=62.0, eval_started=60.0)  # a 2 s evaluation
    assert watch.add(2000, 480.0, 3.0, now=70.0, eval_started=67.0)
    assert [r["train_seconds"] for r in watch.history] == [5.0, 10.0]  # 67 - 55 - the first eval's 2 s
    report = watch.report(steps=2000, finished=False)
    assert report["reached_train_seconds"] == 10.0 and report["eval_seconds"] == 5.0
    assert report["reached_time"] == 70.0  # the whole-run clock is unchanged
    assert solve.train_seconds_at(watch.history, 475.0) == 10.0
    assert solve.train_seconds_at(watch.history, 1e9) is None


def test_sb3_evaluates_as_often_and_as_long_as_the_config_does(tmp_path: Path) -> None:
    appo = CONFIGS / "cartpole_appo.yaml"
    from zmqrl.config import load_config

    cfg = load_config(appo)
    every, episodes = solve.sb3_evaluation_for(appo)
    assert (every, episodes) == (cfg.learner.eval_interval * cfg.agent.batch_size, cfg.learner.eval_episodes)
    dqn = load_config(CONFIGS / "cartpole_dqn.yaml")  # off-policy: env steps per update vary
    assert solve.sb3_evaluation_for(CONFIGS / "cartpole_dqn.yaml") == (
        solve.SB3_EVAL_EVERY,
        dqn.learner.eval_episodes,
    )


def test_zmqrl_start_up_is_read_from_the_learners_marks(tmp_path: Path) -> None:
    learner = {"launched": 100.0, "startup": {"first_update": 2.25}}
    (tmp_path / "stats.json").write_text(json.dumps({"learner": learner}))
    assert solve.first_update_at(tmp_path) == 102.25
    (tmp_path / "stats.json").write_text(json.dumps({"learner": {"launched": 100.0}}))
    assert solve.first_update_at(tmp_path) is None
    assert solve.first_update_at(tmp_path / "missing") is None


def test_status_of_a_run_follows_its_records_then_its_exit(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("Traceback: boom\n")
    never = Reached(None, None, 4, 200.0, 1000.0)
    now = time.time()
    solved = solve._result("sb3", 0, Reached(now + 5, 9000, 3, 500.0, 2000.0), now, 0, log)
    assert (solved.status, solved.env_steps, solved.seconds) == ("solved", 9000, pytest.approx(5.0))
    assert solve._result("sb3", 0, never, now, None, log).status == "timeout"
    crashed = solve._result("sb3", 0, never, now, 1, log)
    assert crashed.status == "crashed" and "boom" in crashed.error
    assert solve._result("sb3", 0, never, now, 0, log).status == "not reached"


def test_zmqrl_target_read_from_stats_json_else_from_metrics_jsonl(tmp_path: Path) -> None:
    history = [
        {"updates": 500, "samples": 3000, "time": 100.0, "mean": 150.0},
        {"updates": 1000, "samples": 7000, "time": 104.0, "mean": 480.0},
        {"updates": 1500, "samples": 11000, "time": 108.0, "mean": 500.0},
    ]
    done = tmp_path / "done"
    done.mkdir()
    (done / "stats.json").write_text(json.dumps({"launched": 90.0, "learner": {"eval_history": history}}))
    assert solve.reached_in_run_dir(done, 475.0) == Reached(104.0, 7000, 3, 500.0, 4000.0)
    evaluated = tmp_path / "evaluated"  # an evaluator's records count env steps
    evaluated.mkdir()
    by_evaluator = [{"env_steps": r["samples"] + 100, "time": r["time"], "mean": r["mean"]} for r in history]
    stats = {"launched": 90.0, "learner": {"eval_history": []}, "evaluator": {"eval_history": by_evaluator}}
    (evaluated / "stats.json").write_text(json.dumps(stats))
    assert solve.reached_in_run_dir(evaluated, 475.0) == Reached(104.0, 7100, 3, 500.0, 4000.0)
    killed = tmp_path / "killed"  # stopped before writing stats.json
    killed.mkdir()
    rows = [
        {"source": "learner", "tag": "charts/eval_return", "step": 3000, "value": 150.0, "wall": 100.0},
        {"source": "learner", "tag": "losses/td_loss", "step": 10, "value": 9999.0, "wall": 101.0},
        {"source": "learner", "tag": "charts/eval_return", "step": 7000, "value": 480.0, "wall": 104.0},
    ]
    (killed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert solve.reached_in_run_dir(killed, 475.0) == Reached(104.0, 7000, 2, 480.0, 4000.0)
    assert solve.reached_in_run_dir(tmp_path / "missing", 475.0).time is None


def test_sb3_schedule_evaluates_every_n_env_steps_and_keeps_the_first_record_at_target() -> None:
    watch = SolveWatch(every=1000, target=475.0, started=50.0)
    assert not watch.due(999) and watch.due(1000)
    assert not watch.add(1000, 200.0, 5.0, now=60.0)
    assert not watch.due(1999) and watch.due(2000)
    assert watch.add(2000, 480.0, 3.0, now=70.0)
    watch.add(3000, 500.0, 0.0, now=80.0)
    report = watch.report(steps=3000, finished=True)
    assert (report["reached_time"], report["reached_steps"], report["best"]) == (70.0, 2000, 500.0)
    assert watch.history[0]["seconds"] == 10.0
    with pytest.raises(ValueError):
        SolveWatch(every=0, target=1.0, started=0.0)


@needs_sb3
def test_sb3_run_stops_at_the_first_evaluation_at_target_and_reports_it(tmp_path: Path) -> None:
    from zmqrl_bench import sb3_run

    out = tmp_path / "sb3.json"
    args = RunArgs(seed=0, out=out, eval_every=100, episodes=2, target=1.0, timesteps=1_000)
    report = sb3_run.train(args)  # any episode returns >= 1: the first evaluation solves it
    assert report["reached_steps"] == 100 and report["steps"] == 100
    assert json.loads(out.read_text())["history"] == report["history"]
    never = sb3_run.train(RunArgs(seed=0, out=out, eval_every=100, episodes=1, target=1e9, timesteps=256))
    assert never["reached_time"] is None and [r["steps"] for r in never["history"]] == [100, 200]
    assert never["finished"] and never["steps"] == 256  # whole train_freq rollouts


@needs_sb3
def test_sb3_ppo_run_steps_8_envs_and_evaluates_every_n_env_steps_summed_over_them(tmp_path: Path) -> None:
    from zmqrl_bench import sb3_run

    out = tmp_path / "ppo.json"
    args = RunArgs(seed=0, out=out, eval_every=64, episodes=2, target=1.0, timesteps=1_000, algo="ppo")
    report = sb3_run.train(args)  # 8 vector steps of the 8 envs: 64 env steps, the first evaluation
    assert report["reached_steps"] == 64 and report["steps"] == 64
    # Training alone: after learn started, before the evaluation, so shorter than the whole run.
    assert report["learn_started"] >= report["started"]
    assert 0.0 < report["reached_train_seconds"] < report["reached_time"] - report["started"]
    never = RunArgs(seed=0, out=out, eval_every=128, episodes=1, target=1e9, timesteps=512, algo="ppo")
    report = sb3_run.train(never)  # two rollouts of 32 steps x 8 envs, each trained on 20 epochs
    assert report["reached_time"] is None and report["finished"] and report["steps"] == 512
    assert [r["steps"] for r in report["history"]] == [128, 256, 384, 512]


@needs_sb3
def test_ppo_is_built_with_the_zoo_cartpole_settings_and_its_linear_schedules() -> None:
    from stable_baselines3 import PPO

    from zmqrl_bench.sb3_zoo import ZOO_CARTPOLE, make_model

    model = make_model("ppo", seed=0)
    assert isinstance(model, PPO) and model.n_envs == 8 and model.gamma == 0.98
    assert (model.n_steps, model.batch_size, model.n_epochs) == (32, 256, 20)
    assert (model.gae_lambda, model.ent_coef) == (0.8, 0.0)
    # lin_0.001 and lin_0.2: the start value at the start of learn, half at its middle, 0 at its end
    assert model.lr_schedule(1.0) == pytest.approx(1e-3) and model.lr_schedule(0.5) == pytest.approx(5e-4)
    assert callable(model.clip_range) and model.clip_range(0.5) == pytest.approx(0.1)
    assert model.clip_range(0.0) == 0.0
    meta = ZOO_CARTPOLE["ppo"].meta()
    assert (meta["n_envs"], meta["n_timesteps"], meta["learning_rate"]) == (8, 100_000, "lin_0.001")
    assert ZOO_CARTPOLE["dqn"].meta()["n_timesteps"] == 50_000


def test_sb3_algorithm_follows_the_config_agent_kind_unless_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert solve.sb3_algo_for(CONFIGS / "cartpole_appo.yaml") == "ppo"
    assert solve.sb3_algo_for(CONFIGS / "cartpole_dqn.yaml") == "dqn"
    raced: list[str] = []

    evaluations: list[tuple[object, object]] = []

    def fake_compare(*args: object, algo: str, episodes: int, **kwargs: object) -> list[SolveRun]:
        raced.append(algo)
        evaluations.append((args[3], episodes))  # (config, seeds, timeout, eval_every, work)
        return canned()

    monkeypatch.setattr(solve, "sb3_version", lambda: "2.9.9")
    monkeypatch.setattr(solve, "compare", fake_compare)
    out = tmp_path / "solve.json"
    appo = ["solve", "--seeds", "1", "--config", str(CONFIGS / "cartpole_appo.yaml"), "--json", str(out)]
    result = CliRunner().invoke(bench_app(), appo)
    assert result.exit_code == 0, result.output
    assert raced == ["ppo"] and "SB3 2.9.9 PPO" in result.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["sb3_algo"] == "ppo" and meta["sb3_hyperparameters"]["n_steps"] == 32
    assert evaluations[-1] == solve.sb3_evaluation_for(CONFIGS / "cartpole_appo.yaml")
    assert (meta["sb3_eval_every"], meta["sb3_eval_episodes"]) == evaluations[-1]
    result = CliRunner().invoke(bench_app(), [*appo, "--sb3-eval-every", "500", "--sb3-eval-episodes", "3"])
    assert result.exit_code == 0 and evaluations[-1] == (500, 3)
    assert meta["sb3_hyperparameters"]["n_envs"] == 8
    result = CliRunner().invoke(bench_app(), [*appo, "--sb3-algo", "dqn"])
    assert result.exit_code == 0 and raced[-1] == "dqn"
    assert json.loads(out.read_text())["meta"]["sb3_hyperparameters"]["train_freq"] == 256
    result = CliRunner().invoke(bench_app(), [*appo, "--sb3-algo", "a2c"])
    assert result.exit_code == 2 and "dqn, ppo" in result.output and raced[-1] == "dqn"


def test_a_timed_out_run_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time;"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    started, code = solve.run_process([sys.executable, "-c", script], tmp_path / "log", timeout=1.5)
    assert code is None and time.time() - started < 20
    child = int(pid_file.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def bench_app() -> typer.Typer:
    app = typer.Typer()
    solve.register(app)

    @app.callback()
    def group() -> None:  # a group, as `zmqrl bench` is, so `solve` is a subcommand
        pass

    return app


def test_without_sb3_the_command_says_how_to_install_it_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solve, "sb3_version", lambda: None)
    result = CliRunner().invoke(bench_app(), ["solve", "--seeds", "1"])
    assert result.exit_code == 1
    assert "pip install 'zmqrl[sb3]'" in result.output and len(result.output.strip().splitlines()) == 1


def test_help_explains_the_comparison_with_an_example() -> None:
    result = CliRunner().invoke(bench_app(), ["solve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("475", "SB3/zmqrl", "--seeds", "--timeout", "--json", "--sb3-algo", "appo", "PPO"):
        assert text in result.output
    for text in ("Example: zmqrl bench solve", "cartpole_appo.yaml"):
        assert text in result.output
