"""The end of every run's summary: whether it stopped at its target, and which checkpoint to
deploy, and why (the last line).

A run leaves two policies worth playing: ``checkpoints/latest`` (the final weights, a full training
state) and ``checkpoints/best`` (the best-scoring evaluated weights: the learner's full state, or
the evaluator's weights only). Off-policy training is not monotonic (CartPole's DQN can score 500
and then, thousands of updates later, 150), so the final weights are not necessarily the ones to
ship. The rule is simple and said in the summary: ``best`` when it exists, as it holds the best
evaluated weights; else ``latest``. Both scores are said when known, so the choice can be checked.

Built from the stats the roles wrote (their ``eval_history``), never by loading a checkpoint: the
supervisor writing the summary does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Under the run directory (the names zmqrl.checkpoints.files and zmqrl.evaluator.scoring write; not imported
# from there, as both import torch).
CHECKPOINTS = "checkpoints"
BEST = "best"
LATEST = "latest"
LATEST_NAME = f"{CHECKPOINTS}/{LATEST}"
# Episodes the summary's `zmqrl eval` hint plays.
CHECK_EPISODES = 20


@dataclass
class Deployment:
    """The checkpoint to deploy (None: the run wrote none), its score and the final weights'."""

    path: Path | None
    eval_return: float  # mean return of the evaluation that scored it (NaN: not evaluated)
    eval_std: float
    final_eval_return: float  # the final weights' (checkpoints/latest) score (NaN: not evaluated)
    why: str  # one sentence for the summary and stats.json

    def to_dict(self) -> dict[str, Any]:
        """The ``deploy`` entry of ``stats.json`` (NaN becomes null there)."""
        return {
            "path": str(self.path) if self.path is not None else None,
            "eval_return": self.eval_return,
            "eval_std": self.eval_std,
            "final_eval_return": self.final_eval_return,
            "why": self.why,
        }

    def line(self) -> str:
        return deploy_line(self.to_dict())


def deploy_line(deploy: dict[str, Any]) -> str:
    """The summary's last line, from a ``deploy`` entry (as stats.json holds it)."""
    path = deploy.get("path")
    if not path:
        return f"deploy: nothing ({deploy.get('why', 'no checkpoint was written')})"
    return f"deploy: {path}, {deploy.get('why', '')}. Check it: zmqrl eval {path} --episodes {CHECK_EPISODES}"


def stopped_at_target_line(target: float, hold: int, held: dict[str, Any]) -> str:
    """What the summary says when ``learner.stop_at_target`` ended the run; ``held`` is the
    evaluation record that completed the streak (its ``seconds`` count from the launch)."""
    seconds = _number(held.get("seconds"))
    when = f" at {seconds:.1f} s after launch" if _finite(seconds) else ""
    at = [
        f"{int(held[key])} {what}"
        for key, what in (("updates", "updates"), ("samples", "env steps"), ("env_steps", "env steps"))
        if _finite(held.get(key))
    ]
    where = f" ({', '.join(at)})" if at else ""
    return f"stopped at target: held {target:g} for {hold} evaluations{when}{where}"


def choose_deployment(
    run_dir: Path, learner: dict[str, Any], evaluator: dict[str, Any] | None = None
) -> Deployment:
    """``best`` if the run has one, else ``latest``, with the evaluations that scored them.

    ``learner`` is the learner's final stats; ``evaluator`` the evaluator's when a separate
    evaluator did the evaluations (then its history is the one that counts, and weights versions
    tie its records to the learner's final weights)."""
    directory = run_dir / CHECKPOINTS
    best_path, latest_path = directory / BEST, directory / LATEST
    scorer = evaluator if evaluator is not None else learner
    history = [r for r in scorer.get("eval_history") or [] if _finite(r.get("mean"))]
    final = _final_record(history, learner, by_version=evaluator is not None)
    final_score = float(final["mean"]) if final is not None else math.nan
    if best_path.is_file():
        best = _best_record(history)
        stored = _number(scorer.get("eval_best"))
        if best is not None and not (_finite(stored) and stored > float(best["mean"])):
            detail = _describe(best)
            if best is final:
                tail = f"these are also the final weights ({LATEST_NAME})"
            else:
                tail = _final_words(final)
            return Deployment(
                best_path,
                float(best["mean"]),
                _number(best.get("std")),
                final_score,
                f"the best evaluated weights ({detail}); {tail}",
            )
        # Scored before a resume (the evaluator's history starts afresh): its score is in eval_best.
        score = f"eval {stored:.1f}, " if _finite(stored) else ""
        return Deployment(
            best_path,
            stored,
            math.nan,
            final_score,
            f"the best evaluated weights ({score}an evaluation before the run was resumed); "
            + _final_words(final),
        )
    if latest_path.is_file():
        scored = f"eval {final_score:.1f} ± {_number(final.get('std')):.1f}" if final is not None else ""
        why = "the final weights" + (f" ({scored})" if scored else ", not evaluated")
        return Deployment(
            latest_path,
            final_score,
            _number(final.get("std")) if final is not None else math.nan,
            final_score,
            f"{why}; there is no {CHECKPOINTS}/{BEST}, as no evaluation ran",
        )
    return Deployment(None, math.nan, math.nan, math.nan, "the run wrote no checkpoint")


def _best_record(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation whose weights ``best`` holds: the highest mean, the later one on a tie (as
    the evaluation tracker keeps the later weights)."""
    best: dict[str, Any] | None = None
    for record in history:
        if best is None or float(record["mean"]) >= float(best["mean"]):
            best = record
    return best


def _final_record(
    history: list[dict[str, Any]], learner: dict[str, Any], *, by_version: bool
) -> dict[str, Any] | None:
    """The evaluation of the final weights, if the last one was of them: by weights version for
    an evaluator's records, by update count for the learner's own."""
    if not history:
        return None
    last = history[-1]
    key, mine = ("weights_version", "weights_version") if by_version else ("updates", "updates")
    theirs = learner.get(mine)
    if theirs is None or last.get(key) is None:
        return None
    return last if int(last[key]) == int(theirs) else None


def _final_words(final: dict[str, Any] | None) -> str:
    if final is None:
        return f"the final weights ({LATEST_NAME}) were not evaluated"
    return f"the final weights scored {float(final['mean']):.1f} ({LATEST_NAME})"


def _describe(record: dict[str, Any]) -> str:
    parts = [f"eval {float(record['mean']):.1f} ± {_number(record.get('std')):.1f}"]
    if record.get("weights_version") is not None:
        parts.append(f"weights v{int(record['weights_version'])}")
    elif record.get("updates") is not None:
        parts[0] += f" at {int(record['updates'])} updates"
    seconds = _number(record.get("seconds"))
    if _finite(seconds):
        parts.append(f"{seconds:.1f} s after launch")
    return ", ".join(parts)


def _number(value: Any) -> float:
    """A stats value as a float; NaN for one not measured (null in a JSON file) or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _finite(value: Any) -> bool:
    return math.isfinite(_number(value))
