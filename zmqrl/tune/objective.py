"""A trial's score, and its running value after each evaluation (what the pruner sees).

Both come from the same evaluations a run writes to ``metrics.jsonl`` (``charts/eval_return``),
read while it runs; pure functions of them, so the tests feed made-up curves.

- ``final_eval``: the last evaluation's mean return; while running, the latest one.
- ``auc``: the mean of all evaluation returns, the area under the eval curve divided by its
  length (evaluations are ``learner.eval_interval`` updates apart, so equally spaced in updates);
  while running, the mean so far. It rewards learning early and staying learned, where
  ``final_eval`` is one noisy point.
- ``time_to_target``: seconds after launch of the first evaluation at or above the target. A run
  that never gets there scores ``UNREACHED_FACTOR`` times its whole duration: worse than any run
  of the same length that reached it, and still ordered (a run that gave up sooner is no better).
  While running: the time it reached the target, else the time so far, a lower bound of its
  final score, so the pruner stops a trial that has already taken longer than most others took.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zmqrl.tune.space import Objective

UNREACHED_FACTOR = 2.0


class NoEvaluations(RuntimeError):
    """A run ended without a single evaluation: nothing to score it on."""


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of a run, as its metrics.jsonl row has it."""

    seconds: float  # after launch
    samples: int  # env steps received by then
    mean: float  # mean greedy return


def reached_at(points: Sequence[EvalPoint], target: float) -> float | None:
    """Seconds after launch of the first evaluation at or above ``target``, or None."""
    for point in points:
        if point.mean >= target:
            return point.seconds
    return None


def running_value(objective: Objective, points: Sequence[EvalPoint], target: float | None) -> float:
    """The value reported to the pruner after the last of ``points`` (at least one)."""
    if objective.metric == "final_eval":
        return points[-1].mean
    if objective.metric == "auc":
        return sum(p.mean for p in points) / len(points)
    reached = reached_at(points, _target(target))
    return reached if reached is not None else points[-1].seconds


def final_value(
    objective: Objective, points: Sequence[EvalPoint], target: float | None, duration: float
) -> float:
    """The score of one finished run of ``duration`` seconds."""
    if objective.metric == "time_to_target":
        reached = reached_at(points, _target(target))
        return reached if reached is not None else UNREACHED_FACTOR * duration
    if not points:
        raise NoEvaluations("the run ended before its first evaluation: nothing to score")
    return running_value(objective, points, target)


def _target(target: float | None) -> float:
    if target is None or not math.isfinite(target):
        raise ValueError("time_to_target needs a target: objective.target or learner.target_return")
    return target
