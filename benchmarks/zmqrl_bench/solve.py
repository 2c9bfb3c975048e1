"""``zmqrl bench solve``: time to solve CartPole with zmqrl against Stable-Baselines3 (DQN or PPO).

A solve is the first greedy evaluation whose mean return reaches 475, over the same number of
episodes on both sides (the config's ``learner.eval_episodes`` unless ``--sb3-eval-episodes``
says otherwise). Each side runs as its own process, started from here, so start-up (interpreter,
imports, zmqrl's supervisor, learner and actors) counts on both sides, and wall time runs from
this process's start of it. The sides alternate seed by seed (zmqrl 0, SB3 0, zmqrl 1, ...) so
that whatever else loads the machine loads both alike; the table gives each seed, the medians and
the ratios SB3/zmqrl (above 1: zmqrl solves sooner).

Two more columns put zmqrl's time against SB3's *training time alone* (sb3_run's
``train_seconds``: ``model.learn``'s wall time to the evaluation that first reaches the target,
without SB3's start-up or its evaluations), start-up and evaluations still counted on zmqrl's
side: the stricter comparison. For an on-policy config SB3 evaluates at zmqrl's cadence in env
steps (``learner.eval_interval`` x ``agent.batch_size``: each update takes that many new steps),
so both sides' env steps at the target are read at the same resolution.

zmqrl runs ``zmqrl launch CONFIG`` with ``learner.stop_at_target`` at the first evaluation at 475
(nothing before it changes). SB3 runs benchmarks/zmqrl_bench/sb3_run.py with the RL-Zoo CartPole
hyper-parameters (benchmarks/zmqrl_bench/sb3_zoo.py) on one torch thread, evaluating inline every
``--sb3-eval-every`` env steps: DQN against zmqrl's off-policy configs, PPO (8 envs in one vector
env) against an on-policy one (``agent.kind: appo``, APPO or IMPALA), or whichever ``--sb3-algo``
names.
``register(app)`` adds the command to the ``zmqrl bench`` group.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from zmqrl_bench.runs import Reached, reached_in_history, reached_in_run_dir, run_process
from zmqrl_bench.sb3_zoo import SB3_ALGOS, ZOO_CARTPOLE
from zmqrl_bench.solve_table import SIDES, SolveRun, markdown_table, secs_text, steps_text, summarise

TARGET_RETURN = 475.0  # CartPole-v1's "solved" (gymnasium's reward_threshold)
DEFAULT_CONFIG = Path("configs/cartpole_dqn.yaml")
DEFAULT_TIMEOUT_S = 600.0
# SB3's evaluation cadence: zmqrl's config evaluates every 500 updates, which is about 1k env steps
# on the 2-core reference machine at full learner speed and 4k when it is loaded.
SB3_EVAL_EVERY = 2_000
# SB3's greedy episodes per evaluation when no config says (a config's learner.eval_episodes does).
SB3_EVAL_EPISODES = 10
SB3_PIP = "pip install 'zmqrl[sb3]'"
# Characters of a crashed run's log kept in its result.
ERROR_TAIL = 2_000
# The SB3 algorithm raced against a zmqrl agent kind when --sb3-algo does not name one: the
# on-policy family against PPO, everything else (DQN) against DQN.
SB3_ALGO_FOR_KIND = {"appo": "ppo"}
DEFAULT_SB3_ALGO = "dqn"


def _result(
    side: str,
    seed: int,
    reached: Reached,
    started: float,
    code: int | None,
    log: Path,
    train_seconds: float | None = None,
    startup_seconds: float | None = None,
) -> SolveRun:
    wall = time.time() - started
    if reached.time is not None:
        status = "solved"
    elif code is None:
        status = "timeout"
    elif code != 0:
        status = "crashed"
    else:
        status = "not reached"
    error = log.read_text(errors="replace")[-ERROR_TAIL:] if status == "crashed" else ""
    return SolveRun(
        side=side,
        seed=seed,
        status=status,
        seconds=None if reached.time is None else reached.time - started,
        env_steps=reached.steps,
        wall_seconds=wall,
        evaluations=reached.evaluations,
        best=reached.best,
        eval_every_steps=reached.every,
        error=error,
        train_seconds=train_seconds if reached.time is not None else None,
        startup_seconds=startup_seconds,
    )


def first_update_at(run_dir: Path) -> float | None:
    """When the learner of the run in ``run_dir`` made its first update (Unix seconds), from its
    start-up marks in stats.json (``startup.first_update`` after ``launched``); None if unknown."""
    try:
        learner = json.loads((run_dir / "stats.json").read_text()).get("learner") or {}
        return float(learner["launched"]) + float(learner["startup"]["first_update"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def run_zmqrl(config: Path, seed: int, work: Path, timeout: float, target: float = TARGET_RETURN) -> SolveRun:
    name = f"zmqrl-s{seed}"
    cmd = [
        *(sys.executable, "-m", "zmqrl", "launch", str(config), "--name", name),
        *("--set", f"run.dir={work}", "--set", f"run.seed={seed}"),
        *("--set", f"learner.target_return={target}", "--set", "learner.stop_at_target=true"),
        *("--set", "learner.target_hold=1"),
    ]
    log = work / f"{name}.log"
    started, code = run_process(cmd, log, timeout)
    first = first_update_at(work / name)
    startup = None if first is None else first - started
    return _result("zmqrl", seed, reached_in_run_dir(work / name, target), started, code, log, None, startup)


def run_sb3(
    seed: int,
    work: Path,
    timeout: float,
    target: float = TARGET_RETURN,
    eval_every: int = SB3_EVAL_EVERY,
    algo: str = DEFAULT_SB3_ALGO,
    episodes: int = SB3_EVAL_EPISODES,
) -> SolveRun:
    out = work / f"sb3-s{seed}.json"
    cmd = [
        *(sys.executable, "-m", "zmqrl_bench.sb3_run", "--seed", str(seed), "--out", str(out)),
        *("--target", str(target), "--eval-every", str(eval_every), "--algo", algo),
        *("--episodes", str(episodes)),
    ]
    log = work / f"sb3-s{seed}.log"
    started, code = run_process(cmd, log, timeout)
    try:
        history = json.loads(out.read_text()).get("history") or []
    except (OSError, ValueError):
        history = []
    reached = reached_in_history(history, target, "steps")
    return _result("sb3", seed, reached, started, code, log, _train_seconds(reached))


def train_seconds_at(history: Sequence[dict[str, Any]], target: float) -> float | None:
    """SB3's training time alone (``train_seconds``) at its first evaluation at ``target``."""
    return _train_seconds(reached_in_history(history, target, "steps"))


def _train_seconds(reached: Reached) -> float | None:
    value = (reached.record or {}).get("train_seconds")
    return float(value) if isinstance(value, (int, float)) else None


# ---- the command -------------------------------------------------------------------------------


def sb3_version() -> str | None:
    """The installed Stable-Baselines3's version, None when it is not installed (found without
    importing it: importing SB3 here would cost this process seconds and nothing else)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stable-baselines3")
    except PackageNotFoundError:
        return None


def sb3_algo_for(config: Path) -> str:
    """The SB3 algorithm to race zmqrl's ``config`` against: PPO for an on-policy agent
    (``agent.kind: appo``), DQN otherwise. Raises ConfigError for a config zmqrl cannot load."""
    from zmqrl.config import load_config

    return SB3_ALGO_FOR_KIND.get(load_config(config).agent.kind, DEFAULT_SB3_ALGO)


def sb3_evaluation_for(config: Path) -> tuple[int, int]:
    """SB3's evaluation (env steps between evaluations, episodes each) to match zmqrl's ``config``:
    its ``learner.eval_episodes``, and for an on-policy agent its cadence in env steps
    (``learner.eval_interval`` x ``agent.batch_size``, exact: each update takes a batch of new
    steps); an off-policy config's cadence in env steps depends on its speed, so SB3 keeps
    SB3_EVAL_EVERY. Raises ConfigError for a config zmqrl cannot load."""
    from zmqrl.config import load_config

    cfg = load_config(config)
    every = SB3_EVAL_EVERY
    if cfg.agent.kind in SB3_ALGO_FOR_KIND and cfg.learner.eval_interval > 0:
        every = cfg.learner.eval_interval * cfg.agent.batch_size
    return every, cfg.learner.eval_episodes


def compare(
    config: Path,
    seeds: int,
    timeout: float,
    eval_every: int,
    work: Path,
    echo: Any = print,
    algo: str = DEFAULT_SB3_ALGO,
    episodes: int = SB3_EVAL_EPISODES,
) -> list[SolveRun]:
    """The runs, alternating sides seed by seed; each result is echoed as it comes."""
    runs: list[SolveRun] = []
    for seed in range(seeds):
        for side in SIDES:
            if side == "zmqrl":
                run = run_zmqrl(config, seed, work, timeout)
            else:
                run = run_sb3(seed, work, timeout, eval_every=eval_every, algo=algo, episodes=episodes)
            runs.append(run)
            extra = ""
            if run.train_seconds is not None:
                extra += f", training alone {secs_text(run.train_seconds)}"
            if run.startup_seconds is not None:
                extra += f", first update at {secs_text(run.startup_seconds)}"
            echo(
                f"{side} seed {seed}: {run.status}, {secs_text(run.seconds)}, "
                f"{steps_text(run.env_steps)} env steps, {run.evaluations} evaluations, "
                f"whole run {run.wall_seconds:.1f} s{extra}"
            )
            if run.error:
                echo(run.error)
    return runs


def register(app: typer.Typer) -> None:
    """Adds ``solve`` to ``app`` (the ``zmqrl bench`` group)."""

    @app.command(
        short_help="Time to solve CartPole (eval >= 475): zmqrl against Stable-Baselines3 DQN or PPO, "
        "side by side.",
        epilog="Example: zmqrl bench solve --seeds 3 --json solve.json; "
        "zmqrl bench solve --config configs/cartpole_appo.yaml (against PPO)",
    )
    def solve(
        seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeds per side (0, 1, ...).")] = 3,
        config: Annotated[
            Path, typer.Option("--config", help="zmqrl's config (its learner evaluates inline).")
        ] = DEFAULT_CONFIG,
        json_path: Annotated[
            Path | None, typer.Option("--json", help="Also write every run and the summary here.")
        ] = None,
        timeout: Annotated[
            float, typer.Option("--timeout", min=1.0, help="Seconds one run may take before it is stopped.")
        ] = DEFAULT_TIMEOUT_S,
        sb3_eval_every: Annotated[
            int | None,
            typer.Option(
                "--sb3-eval-every",
                min=1,
                help="Env steps between SB3's evaluations. Default: an on-policy config's cadence "
                f"(learner.eval_interval x agent.batch_size), else {SB3_EVAL_EVERY}.",
            ),
        ] = None,
        sb3_eval_episodes: Annotated[
            int | None,
            typer.Option(
                "--sb3-eval-episodes",
                min=1,
                help="Greedy episodes per SB3 evaluation. Default: the config's learner.eval_episodes.",
            ),
        ] = None,
        sb3_algo: Annotated[
            str | None,
            typer.Option(
                "--sb3-algo",
                metavar="|".join(SB3_ALGOS),
                help="SB3's algorithm. Default: from the config's agent.kind, ppo for appo "
                "(on-policy), dqn otherwise.",
            ),
        ] = None,
    ) -> None:
        """Run zmqrl's CartPole config and Stable-Baselines3 (RL-Zoo CartPole hyper-parameters,
        one torch thread) one after the other, alternating seed by seed, and print for each seed
        and their median the wall time and env steps to the first greedy evaluation (the config's
        learner.eval_episodes on both sides) at a mean return >= 475, with the ratios SB3/zmqrl
        (above 1: zmqrl is faster). SB3 runs DQN against a DQN config and PPO (the Zoo's 8 envs)
        against an on-policy one (agent.kind appo), unless --sb3-algo says otherwise.

        Wall time counts from the start of each run's process, start-up included on both sides;
        both evaluate inline, so evaluation time counts on both. The last two columns put SB3's
        training time alone (model.learn to the target, without its start-up and evaluations)
        against zmqrl's time, start-up and evaluations still counted on zmqrl's side.

        A run that does not reach 475 (SB3 stops at the Zoo's n_timesteps, 50k for DQN and 100k
        for PPO, zmqrl at learner.max_updates, either at --timeout) shows as such. Needs
        Stable-Baselines3: pip install 'zmqrl\\[sb3]'."""
        version = sb3_version()
        if version is None:
            typer.echo(f"error: zmqrl bench solve needs Stable-Baselines3: {SB3_PIP}", err=True)
            raise typer.Exit(1)
        if not config.is_file():
            typer.echo(f"error: {config}: no such config file", err=True)
            raise typer.Exit(2)
        if sb3_algo is not None and sb3_algo not in SB3_ALGOS:
            typer.echo(f"error: --sb3-algo: {sb3_algo!r}; choose from {', '.join(SB3_ALGOS)}", err=True)
            raise typer.Exit(2)
        from zmqrl.errors import ConfigError

        try:
            algo = sb3_algo or sb3_algo_for(config)
            every, episodes = sb3_evaluation_for(config)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        every = sb3_eval_every or every
        episodes = sb3_eval_episodes or episodes
        with tempfile.TemporaryDirectory(prefix="zmqrl-solve-") as tmp:
            runs = compare(
                config.resolve(),
                seeds,
                timeout,
                every,
                Path(tmp),
                echo=typer.echo,
                algo=algo,
                episodes=episodes,
            )
        summary = summarise(runs)
        from zmqrl_bench.cli import machine_meta  # loaded already: this command is one of its group's

        cpu = machine_meta()["cpu"]
        machine = f"{platform.node()}, {os.cpu_count()} CPUs ({cpu}), {time.strftime('%Y-%m-%d')}"
        z_every = summary["zmqrl"]["median_eval_every_steps"]
        typer.echo(
            f"\n{machine}; SB3 {version} {algo.upper()}; evaluations of {episodes} episodes every {every} "
            f"env steps (SB3) and every {steps_text(z_every)} env steps (zmqrl, median); zmqrl's first "
            f"update {secs_text(summary['zmqrl']['median_startup_seconds'])} after its launch (median)\n"
        )
        typer.echo(markdown_table(runs, summary))
        if json_path is not None:
            from zmqrl import strictjson

            meta = {
                "machine": machine,
                "target": TARGET_RETURN,
                "config": str(config),
                "seeds": seeds,
                "timeout": timeout,
                "sb3_version": version,
                "sb3_eval_every": every,
                "sb3_eval_episodes": episodes,
                "sb3_algo": algo,
                "sb3_hyperparameters": ZOO_CARTPOLE[algo].meta(),
            }
            payload = {"meta": meta, "summary": summary, "runs": [asdict(r) for r in runs]}
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(strictjson.dumps(payload, indent=2) + "\n")
