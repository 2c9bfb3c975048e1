"""``zmqrl bench solve``: time to solve CartPole with zmqrl against Stable-Baselines3 (DQN or PPO).

A solve is the first greedy evaluation (10 episodes) whose mean return reaches 475. Each side runs
as its own process, started from here, so start-up (interpreter, imports, zmqrl's supervisor,
learner and actors) counts on both sides, and wall time runs from this process's start of it. The
sides alternate seed by seed (zmqrl 0, SB3 0, zmqrl 1, ...) so that whatever else loads the
machine loads both alike; the table gives each seed, the medians and the ratios SB3/zmqrl
(above 1: zmqrl solves sooner).

zmqrl runs ``zmqrl launch CONFIG`` with ``learner.stop_at_target`` at the first evaluation at 475
(nothing before it changes). SB3 runs zmqrl/bench/sb3_run.py with the RL-Zoo CartPole
hyper-parameters (zmqrl/bench/sb3_zoo.py) on one torch thread, evaluating inline every
``--sb3-eval-every`` env steps: DQN against zmqrl's off-policy configs, PPO (8 envs in one vector
env) against an on-policy one (``agent.kind: appo``, APPO or IMPALA), or whichever ``--sb3-algo``
names.
``register(app)`` adds the command to the ``zmqrl bench`` group.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from zmqrl.bench.runs import Reached, reached_in_history, reached_in_run_dir, run_process
from zmqrl.bench.sb3_zoo import SB3_ALGOS, ZOO_CARTPOLE

TARGET_RETURN = 475.0  # CartPole-v1's "solved" (gymnasium's reward_threshold)
DEFAULT_CONFIG = Path("configs/cartpole_dqn.yaml")
DEFAULT_TIMEOUT_S = 600.0
# SB3's evaluation cadence: zmqrl's config evaluates every 500 updates, which is about 1k env steps
# on the 2-core reference machine at full learner speed and 4k when it is loaded.
SB3_EVAL_EVERY = 2_000
SB3_PIP = "pip install 'zmqrl[sb3]'"
# Characters of a crashed run's log kept in its result.
ERROR_TAIL = 2_000
SIDES = ("zmqrl", "sb3")
# The SB3 algorithm raced against a zmqrl agent kind when --sb3-algo does not name one: the
# on-policy family against PPO, everything else (DQN) against DQN.
SB3_ALGO_FOR_KIND = {"appo": "ppo"}
DEFAULT_SB3_ALGO = "dqn"


@dataclass(frozen=True)
class SolveRun:
    """One side's run for one seed."""

    side: str  # "zmqrl" or "sb3"
    seed: int
    status: str  # "solved", "not reached" (ran to its end), "timeout", "crashed"
    seconds: float | None  # from this process starting the run to its first evaluation at the target
    env_steps: int | None  # env steps at that evaluation
    wall_seconds: float  # the whole run, start to exit
    evaluations: int = 0
    best: float | None = None  # best mean evaluation return
    eval_every_steps: float | None = None  # median env steps between evaluations
    error: str = ""  # the end of a crashed run's output


def _result(side: str, seed: int, reached: Reached, started: float, code: int | None, log: Path) -> SolveRun:
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
    )


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
    return _result("zmqrl", seed, reached_in_run_dir(work / name, target), started, code, log)


def run_sb3(
    seed: int,
    work: Path,
    timeout: float,
    target: float = TARGET_RETURN,
    eval_every: int = SB3_EVAL_EVERY,
    algo: str = DEFAULT_SB3_ALGO,
) -> SolveRun:
    out = work / f"sb3-s{seed}.json"
    cmd = [
        *(sys.executable, "-m", "zmqrl.bench.sb3_run", "--seed", str(seed), "--out", str(out)),
        *("--target", str(target), "--eval-every", str(eval_every), "--algo", algo),
    ]
    log = work / f"sb3-s{seed}.log"
    started, code = run_process(cmd, log, timeout)
    try:
        history = json.loads(out.read_text()).get("history") or []
    except (OSError, ValueError):
        history = []
    return _result("sb3", seed, reached_in_history(history, target, "steps"), started, code, log)


# ---- the table ---------------------------------------------------------------------------------


def median_or_inf(values: Sequence[float | None]) -> float:
    """The median with a run that never reached the target counted as infinitely slow: a side that
    solved on most seeds still has a median, one that did not has none (inf)."""
    return statistics.median([math.inf if v is None else float(v) for v in values]) if values else math.nan


def ratio(sb3: float | None, ours: float | None) -> float | None:
    """SB3/zmqrl, None unless both are finite (above 1: zmqrl needed less)."""
    if sb3 is None or ours is None or not (math.isfinite(sb3) and math.isfinite(ours)) or ours <= 0:
        return None
    return sb3 / ours


def summarise(runs: Sequence[SolveRun]) -> dict[str, Any]:
    """Per side: solved count, medians (with min-max over solved seeds) of seconds and env steps;
    and the ratios SB3/zmqrl of those medians."""
    out: dict[str, Any] = {}
    for side in SIDES:
        mine = [r for r in runs if r.side == side]
        secs = [r.seconds for r in mine if r.seconds is not None]
        steps = [s for s in map(_solved_steps, mine) if s is not None]
        out[side] = {
            "runs": len(mine),
            "solved": len(secs),
            "median_seconds": median_or_inf([r.seconds for r in mine]),
            "min_seconds": min(secs, default=math.nan),
            "max_seconds": max(secs, default=math.nan),
            "median_env_steps": median_or_inf([_solved_steps(r) for r in mine]),
            "min_env_steps": min(steps, default=math.nan),
            "max_env_steps": max(steps, default=math.nan),
            "median_eval_every_steps": median_or_inf([r.eval_every_steps for r in mine]),
        }
    out["ratio_seconds"] = ratio(out["sb3"]["median_seconds"], out["zmqrl"]["median_seconds"])
    out["ratio_env_steps"] = ratio(out["sb3"]["median_env_steps"], out["zmqrl"]["median_env_steps"])
    return out


def _secs(value: float | None) -> str:
    return "not reached" if value is None or not math.isfinite(value) else f"{value:.1f} s"


def _steps(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value / 1000:.1f}k"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _solved_steps(run: SolveRun | None) -> float | None:
    return None if run is None or run.seconds is None or run.env_steps is None else float(run.env_steps)


def _cell(run: SolveRun | None) -> tuple[str, str]:
    if run is None:
        return "—", "—"
    if run.seconds is None:
        return f"{run.status}" + (f" (best {run.best:.0f})" if run.best is not None else ""), "—"
    return _secs(run.seconds), _steps(run.env_steps)


def markdown_table(runs: Sequence[SolveRun], summary: dict[str, Any]) -> str:
    """Seeds as rows, then the medians: wall seconds and env steps to the target on each side and
    the ratios SB3/zmqrl."""
    lines = [
        "| seed | zmqrl time | zmqrl env steps | SB3 time | SB3 env steps "
        "| time SB3/zmqrl | steps SB3/zmqrl |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in sorted({r.seed for r in runs}):
        ours = next((r for r in runs if r.side == "zmqrl" and r.seed == seed), None)
        sb3 = next((r for r in runs if r.side == "sb3" and r.seed == seed), None)
        cells = [*_cell(ours), *_cell(sb3)]
        r_time = ratio(sb3.seconds, ours.seconds) if sb3 and ours else None
        r_steps = ratio(_solved_steps(sb3), _solved_steps(ours))
        lines.append(f"| {seed} | " + " | ".join([*cells, _ratio(r_time), _ratio(r_steps)]) + " |")
    z, s = summary["zmqrl"], summary["sb3"]

    def spread(side: dict[str, Any], key: str, fmt: Any) -> str:
        if side["solved"] < 2 or not math.isfinite(side[f"median_{key}"]):
            return fmt(side[f"median_{key}"])
        return f"{fmt(side[f'median_{key}'])} ({fmt(side[f'min_{key}'])}–{fmt(side[f'max_{key}'])})"

    lines.append(
        f"| median ({z['solved']}/{z['runs']} and {s['solved']}/{s['runs']} solved) | "
        + " | ".join(
            [
                spread(z, "seconds", _secs),
                spread(z, "env_steps", _steps),
                spread(s, "seconds", _secs),
                spread(s, "env_steps", _steps),
                _ratio(summary["ratio_seconds"]),
                _ratio(summary["ratio_env_steps"]),
            ]
        )
        + " |"
    )
    return "\n".join(lines)


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


def compare(
    config: Path,
    seeds: int,
    timeout: float,
    eval_every: int,
    work: Path,
    echo: Any = print,
    algo: str = DEFAULT_SB3_ALGO,
) -> list[SolveRun]:
    """The runs, alternating sides seed by seed; each result is echoed as it comes."""
    runs: list[SolveRun] = []
    for seed in range(seeds):
        for side in SIDES:
            if side == "zmqrl":
                run = run_zmqrl(config, seed, work, timeout)
            else:
                run = run_sb3(seed, work, timeout, eval_every=eval_every, algo=algo)
            runs.append(run)
            echo(
                f"{side} seed {seed}: {run.status}, {_secs(run.seconds)}, {_steps(run.env_steps)} env steps, "
                f"{run.evaluations} evaluations, whole run {run.wall_seconds:.1f} s"
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
            int, typer.Option("--sb3-eval-every", min=1, help="Env steps between SB3's evaluations.")
        ] = SB3_EVAL_EVERY,
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
        and their median the wall time and env steps to the first greedy evaluation (10 episodes)
        at a mean return >= 475, with the ratios SB3/zmqrl (above 1: zmqrl is faster). SB3 runs
        DQN against a DQN config and PPO (the Zoo's 8 envs) against an on-policy one (agent.kind
        appo), unless --sb3-algo says otherwise. Wall time counts from the start of each run's
        process, start-up included on both sides; both evaluate inline, so evaluation time counts
        on both. A run that does not reach 475 (SB3 stops at the Zoo's n_timesteps, 50k for DQN
        and 100k for PPO, zmqrl at learner.max_updates, either at --timeout) shows as such.
        Needs Stable-Baselines3: pip install 'zmqrl\\[sb3]'."""
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
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        with tempfile.TemporaryDirectory(prefix="zmqrl-solve-") as tmp:
            runs = compare(
                config.resolve(), seeds, timeout, sb3_eval_every, Path(tmp), echo=typer.echo, algo=algo
            )
        summary = summarise(runs)
        machine = f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
        z_every = summary["zmqrl"]["median_eval_every_steps"]
        typer.echo(
            f"\n{machine}; SB3 {version} {algo.upper()}; evaluations every {sb3_eval_every} env steps "
            "(SB3) and "
            f"every {_steps(z_every)} env steps (zmqrl, median)\n"
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
                "sb3_eval_every": sb3_eval_every,
                "sb3_algo": algo,
                "sb3_hyperparameters": ZOO_CARTPOLE[algo].meta(),
            }
            payload = {"meta": meta, "summary": summary, "runs": [asdict(r) for r in runs]}
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(strictjson.dumps(payload, indent=2) + "\n")
