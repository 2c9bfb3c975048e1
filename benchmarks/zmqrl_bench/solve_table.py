"""``zmqrl bench solve``'s runs and their table: one side's run for one seed (:class:`SolveRun`),
the medians and ratios over seeds (:func:`summarise`), and the markdown table (:func:`markdown_table`).

Apart from benchmarks/zmqrl_bench/solve.py, which makes the runs, so each module keeps one job: this one only
reads finished runs. Ratios are SB3/zmqrl throughout (above 1: zmqrl needed less).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SIDES = ("zmqrl", "sb3")


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
    # SB3: model.learn's wall time to the target, less its evaluations (no start-up); zmqrl: None.
    train_seconds: float | None = None
    # zmqrl: from this process starting the run to the learner's first update (its start-up).
    startup_seconds: float | None = None


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
    """Per side: solved count, medians (with min-max over solved seeds) of seconds and env steps,
    SB3's training time alone and zmqrl's start-up; and the ratios SB3/zmqrl of those medians
    (``ratio_train_seconds``: SB3's training time alone over zmqrl's time from launch)."""
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
    sb3 = [r for r in runs if r.side == "sb3"]
    trained = [r.train_seconds for r in sb3 if r.train_seconds is not None]
    out["sb3"]["median_train_seconds"] = median_or_inf([r.train_seconds for r in sb3])
    out["sb3"]["min_train_seconds"] = min(trained, default=math.nan)
    out["sb3"]["max_train_seconds"] = max(trained, default=math.nan)
    startups = [r.startup_seconds for r in runs if r.side == "zmqrl" and r.startup_seconds is not None]
    out["zmqrl"]["median_startup_seconds"] = statistics.median(startups) if startups else math.nan
    out["ratio_seconds"] = ratio(out["sb3"]["median_seconds"], out["zmqrl"]["median_seconds"])
    out["ratio_env_steps"] = ratio(out["sb3"]["median_env_steps"], out["zmqrl"]["median_env_steps"])
    out["ratio_train_seconds"] = ratio(out["sb3"]["median_train_seconds"], out["zmqrl"]["median_seconds"])
    return out


def secs_text(value: float | None) -> str:
    return "not reached" if value is None or not math.isfinite(value) else f"{value:.1f} s"


def steps_text(value: float | None) -> str:
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
    return secs_text(run.seconds), steps_text(run.env_steps)


def markdown_table(runs: Sequence[SolveRun], summary: dict[str, Any]) -> str:
    """Seeds as rows, then the medians: wall seconds and env steps to the target on each side and
    the ratios SB3/zmqrl; then SB3's training time alone and its ratio to zmqrl's time."""
    lines = [
        "| seed | zmqrl time | zmqrl env steps | SB3 time | SB3 env steps "
        "| time SB3/zmqrl | steps SB3/zmqrl | SB3 training | SB3 training/zmqrl time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed in sorted({r.seed for r in runs}):
        ours = next((r for r in runs if r.side == "zmqrl" and r.seed == seed), None)
        sb3 = next((r for r in runs if r.side == "sb3" and r.seed == seed), None)
        cells = [*_cell(ours), *_cell(sb3)]
        r_time = ratio(sb3.seconds, ours.seconds) if sb3 and ours else None
        r_steps = ratio(_solved_steps(sb3), _solved_steps(ours))
        train = sb3.train_seconds if sb3 else None
        r_train = ratio(train, ours.seconds) if ours else None
        trained = "—" if train is None else secs_text(train)
        cells += [_ratio(r_time), _ratio(r_steps), trained, _ratio(r_train)]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    z, s = summary["zmqrl"], summary["sb3"]

    def spread(side: dict[str, Any], key: str, fmt: Any) -> str:
        if side["solved"] < 2 or not math.isfinite(side[f"median_{key}"]):
            return fmt(side[f"median_{key}"])
        return f"{fmt(side[f'median_{key}'])} ({fmt(side[f'min_{key}'])}–{fmt(side[f'max_{key}'])})"

    lines.append(
        f"| median ({z['solved']}/{z['runs']} and {s['solved']}/{s['runs']} solved) | "
        + " | ".join(
            [
                spread(z, "seconds", secs_text),
                spread(z, "env_steps", steps_text),
                spread(s, "seconds", secs_text),
                spread(s, "env_steps", steps_text),
                _ratio(summary["ratio_seconds"]),
                _ratio(summary["ratio_env_steps"]),
                "—" if math.isnan(s["min_train_seconds"]) else spread(s, "train_seconds", secs_text),
                _ratio(summary.get("ratio_train_seconds")),
            ]
        )
        + " |"
    )
    return "\n".join(lines)
