"""One Stable-Baselines3 run (DQN or PPO) on CartPole-v1 with the RL-Zoo hyper-parameters, timed
to a target.

The other side of ``zmqrl bench solve`` (benchmarks/zmqrl_bench/solve.py runs it as ``python -m
zmqrl_bench.sb3_run``, one process per seed, so its start-up is counted as zmqrl's is). It trains on
one torch thread, as zmqrl's learner does, and every ``--eval-every`` env steps (summed over PPO's 8
envs) plays ``--episodes`` greedy episodes on an env of its own, inline, so the evaluations' cost is
in its wall time just as the learner's inline evaluations are in zmqrl's. Each record also says
SB3's *training time alone* (``train_seconds``): the wall time of ``model.learn`` up to the
evaluation's start less the evaluations before it, so the process's start-up (interpreter, imports,
building the model and its envs) and the evaluations are not in it. It stops at the first
evaluation whose mean reaches ``--target`` (or at the Zoo's n_timesteps: 5e4 for DQN, 1e5 for PPO)
and keeps ``--out`` up to date after every evaluation, so a run killed at its timeout still leaves
what it had measured. The Zoo's settings are in benchmarks/zmqrl_bench/sb3_zoo.py.

    python -m zmqrl_bench.sb3_run --algo ppo --seed 0 --out /tmp/sb3-s0.json
"""

from __future__ import annotations

import time

# Before the heavier imports: the process's own start, reported next to the parent's clock.
STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, cast  # noqa: E402

from zmqrl_bench.sb3_zoo import ENV_ID, SB3_ALGOS, ZOO_CARTPOLE, make_model  # noqa: E402

# The evaluation env's seeds start this far from the training seed (as zmqrl keeps them apart).
EVAL_SEED_OFFSET = 10_000


@dataclass
class SolveWatch:
    """When to evaluate and what the evaluations found: the SB3 callback's logic, free of SB3.

    ``due(steps)`` is true once ``every`` more env steps have passed since the last evaluation's
    slot; ``add`` records one evaluation and says whether the target has now been reached (the
    first record at or above it is kept as ``reached``). ``learning(now)`` marks the start of
    ``model.learn``: from then on each record's ``train_seconds`` is the training time alone up to
    that evaluation's start (the evaluations before it taken out)."""

    every: int  # env steps between evaluations
    target: float
    started: float  # this process's start (Unix seconds): "seconds" in the records count from it
    history: list[dict[str, float]] = field(default_factory=list)
    reached: dict[str, float] | None = None
    next_due: int = 0
    learn_started: float | None = None  # when model.learn began (Unix seconds); None: not yet
    eval_seconds: float = 0.0  # wall time spent in the evaluations recorded so far

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"eval every {self.every} env steps: must be >= 1")
        self.next_due = self.next_due or self.every

    def due(self, steps: int) -> bool:
        return steps >= self.next_due

    def learning(self, now: float) -> None:
        """``model.learn`` starts now: the training clock's zero."""
        self.learn_started = now

    def add(self, steps: int, mean: float, std: float, now: float, eval_started: float | None = None) -> bool:
        """One evaluation that ended at ``now`` (and began at ``eval_started``: its own time is
        then kept out of every later record's ``train_seconds``)."""
        record = {"steps": steps, "mean": float(mean), "std": float(std), "time": now}
        record["seconds"] = now - self.started
        began = now if eval_started is None else eval_started
        if self.learn_started is not None:
            record["train_seconds"] = began - self.learn_started - self.eval_seconds
        self.eval_seconds += now - began
        self.history.append(record)
        self.next_due = (steps // self.every + 1) * self.every
        if self.reached is None and mean >= self.target:
            self.reached = record
        return self.reached is not None

    def report(self, steps: int, finished: bool) -> dict[str, Any]:
        """What the parent reads: the absolute time of the first evaluation at the target (so the
        parent can count from its own start of this process), its env steps, and every record."""
        return {
            "started": self.started,
            "steps": steps,
            "finished": finished,
            "target": self.target,
            "eval_every": self.every,
            "reached_time": None if self.reached is None else self.reached["time"],
            "reached_steps": None if self.reached is None else int(self.reached["steps"]),
            "reached_train_seconds": None if self.reached is None else self.reached.get("train_seconds"),
            "learn_started": self.learn_started,
            "eval_seconds": self.eval_seconds,
            "best": max((r["mean"] for r in self.history), default=None),
            "history": self.history,
        }


@dataclass(frozen=True)
class RunArgs:
    seed: int
    out: Path
    eval_every: int = 2_000
    episodes: int = 10
    target: float = 475.0
    timesteps: int | None = None  # env steps at most; None: the Zoo's n_timesteps for ``algo``
    algo: str = "dqn"  # "dqn" or "ppo" (benchmarks/zmqrl_bench/sb3_zoo.py)


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Atomically (the parent may read it after killing this process mid-write)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)


def train(args: RunArgs) -> dict[str, Any]:
    """The run itself: SB3 imported here, after STARTED, so its import counts in the wall time."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(1)
    watch = SolveWatch(every=args.eval_every, target=args.target, started=STARTED)
    eval_env = Monitor(gym.make(ENV_ID))
    eval_env.reset(seed=args.seed + EVAL_SEED_OFFSET)

    class SolveCallback(BaseCallback):
        def _on_step(self) -> bool:
            if not watch.due(self.num_timesteps):
                return True
            eval_started = time.time()
            mean, std = cast(  # (mean, std) as floats: return_episode_rewards is off
                tuple[float, float],
                evaluate_policy(self.model, eval_env, n_eval_episodes=args.episodes, deterministic=True),
            )
            solved = watch.add(self.num_timesteps, float(mean), float(std), time.time(), eval_started)
            write_report(args.out, watch.report(self.num_timesteps, finished=False))
            return not solved  # False ends model.learn

    model = make_model(args.algo, args.seed)
    timesteps = ZOO_CARTPOLE[args.algo].n_timesteps if args.timesteps is None else args.timesteps
    watch.learning(time.time())  # training alone counts from here: imports and the model are built
    model.learn(total_timesteps=timesteps, callback=SolveCallback())
    report = watch.report(int(model.num_timesteps), finished=True)
    write_report(args.out, report)
    return report


def parse(argv: list[str] | None = None) -> RunArgs:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="JSON report, rewritten after every evaluation")
    p.add_argument("--eval-every", type=int, default=RunArgs.eval_every, help="env steps between evaluations")
    p.add_argument("--episodes", type=int, default=RunArgs.episodes, help="greedy episodes per evaluation")
    p.add_argument("--target", type=float, default=RunArgs.target, help="mean return that ends the run")
    p.add_argument("--timesteps", type=int, default=None, help="env steps at most (default: the Zoo's)")
    p.add_argument("--algo", choices=SB3_ALGOS, default=RunArgs.algo, help="the SB3 algorithm")
    ns = p.parse_args(argv)
    return RunArgs(ns.seed, ns.out, ns.eval_every, ns.episodes, ns.target, ns.timesteps, ns.algo)


def main(argv: list[str] | None = None) -> None:
    report = train(parse(argv))
    shown = {k: v for k, v in report.items() if k != "history"}
    print(json.dumps(shown), flush=True)


if __name__ == "__main__":
    main()
