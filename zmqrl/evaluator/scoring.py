"""The evaluator's scoring without sockets: which published weights are due, their greedy score,
the record of scores, and ``checkpoints/best``.

``zmqrl.evaluator.main`` wires it to the weights channel and the supervisor link: it ``offer``s
every weights message it reads, asks between heartbeats whether an evaluation is ``due``, and
runs ``evaluate_pending`` with a ``tick`` that keeps heartbeating and notices stops.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from zmqrl.checkpoints.files import WriteRetries, checkpoint_weights_version, load_checkpoint, save_checkpoint
from zmqrl.checkpoints.policy import WEIGHTS_ONLY, load_checkpoint_weights, make_eval_agent
from zmqrl.config import Config
from zmqrl.core import Policy
from zmqrl.evaluator.greedy import (
    EVAL_SEED_OFFSET,
    EvalResult,
    EvalTracker,
    EvaluationAborted,
    evaluate,
)
from zmqrl.metrics import Logger, fmt_value
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.transport.wire import WeightsMsg
from zmqrl.types import Weights

# The weights-only checkpoint of the best version seen, under the run directory.
BEST = Path("checkpoints") / "best"

log = logging.getLogger("zmqrl.evaluator")  # the role's logger: these are its lines


def stored_best_score(path: Path) -> float | None:
    """The score of the run's existing ``best`` checkpoint (ours or the learner's), if there is one
    and it can be read: a resumed evaluator must beat it before replacing it."""
    if not path.is_file():
        return None
    try:
        score = load_checkpoint(path).get("eval", {})
    except (ValueError, OSError) as exc:
        log.warning("cannot read %s (%s); it will be replaced by the next evaluation", path, exc)
        return None
    best = score.get("mean", score.get("best"))  # weights-only payload, or the learner's full state
    if not (isinstance(best, (int, float)) and math.isfinite(best)):
        return None
    log.info("resuming: %s holds a policy scoring %.1f; only a better one replaces it", path, best)
    return float(best)


def final_weights(cfg: Config, checkpoint: Path) -> WeightsMsg:
    """A learner checkpoint's acting weights as the weights message the learner would publish."""
    from zmqrl.envs.factory import make_env

    payload = load_checkpoint(checkpoint)
    env = make_env(cfg.env, training=False)
    try:
        agent = make_eval_agent(cfg, env)
    finally:
        env.close()
    load_checkpoint_weights(agent, payload, checkpoint)
    version = max(checkpoint_weights_version(payload), 1)
    steps = int(payload.get("counters", {}).get("samples", 0))
    return WeightsMsg(weights=Weights(version, agent.export_weights()), agent=cfg.agent.kind, env_steps=steps)


class Scorer:
    """Evaluates each newly published weights version once, greedily, on its own eval envs.

    A version is due when it is newer than the last one evaluated and ``interval_seconds`` passed
    since the last evaluation started; versions published meanwhile are skipped in favour of the
    newest. Once the learner has announced its stop, the newest unevaluated version (its final
    weights) is due regardless of the interval.
    """

    def __init__(
        self,
        cfg: Config,
        policy: Policy,
        envs: list[gym.Env[Any, Any]],
        tb: Logger,
        run_dir: Path,
        *,
        launched: float,
        best: float | None = None,
        bad: BadMessages | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        # Hands the policy newer weights only; what it refuses is counted with the channel's.
        self.weights = WeightsClient(policy, bad)
        self.envs = envs
        self._tb = tb
        self.run_dir = run_dir
        self.launched = launched  # Unix time the run began: "seconds" in the history count from it
        self.evals = EvalTracker(cfg.learner.target_return, cfg.learner.target_hold)
        if best is not None:  # a resumed run's `best` to beat
            self.evals.best = best
        self.evaluated_version = 0
        self.eval_seconds = float("nan")
        self._env_steps = 0  # the learner's env steps when it published the weights being evaluated
        self._pending: WeightsMsg | None = None  # newest weights received and not loaded yet
        self._loaded: Weights | None = None  # the weights the policy holds (what `best` saves)
        self._last_eval_start = -math.inf
        # `best`'s writes: a transient error (NFS) retried; a full disk one line and exit 2, as the learner's.
        self.retries = WriteRetries()

    @property
    def evaluations(self) -> int:
        """Evaluations completed."""
        return len(self.evals.history)

    @property
    def received_version(self) -> int:
        """The newest weights version received from the learner (0: none yet)."""
        return self._pending.weights.version if self._pending is not None else self.weights.version

    def offer(self, msg: WeightsMsg | None) -> None:
        """Keep ``msg`` if it is newer than the weights received so far; it is loaded when its
        evaluation starts, never during one. (The learner republishes its current weights every
        second: a version already evaluated is not evaluated again.)"""
        if msg is not None and msg.weights.version > self.received_version:
            self._pending = msg

    def due(self, final: bool) -> bool:
        """Whether to evaluate now: newer weights wait and the interval passed, or ``final`` (the
        learner announced its stop, so its last weights are scored at once)."""
        interval = self.cfg.evaluator.interval_seconds
        return self._pending is not None and (final or time.monotonic() - self._last_eval_start >= interval)

    def evaluate_pending(self, tick: Callable[[], bool]) -> bool:
        """Load the waiting weights and score them; False if ``tick`` asked to stop before the end.

        Loaded only now: versions superseded while waiting are never even imported."""
        pending = self._pending
        assert pending is not None, "evaluate_pending() without due()"
        if self.weights.offer(pending.weights):
            self._loaded = pending.weights
        self._env_steps = pending.env_steps or 0
        self._pending = None
        version = self.weights.version
        episodes = len(self.envs)
        # Seeds as the learner's own evaluations use them: far from any actor's, new ones each time.
        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + self.evaluations * episodes
        self._last_eval_start = start = time.monotonic()
        try:
            result = evaluate(self.policy, self.envs, seed=seed, tick=tick)
        except EvaluationAborted as exc:
            log.info("evaluation of weights version %d abandoned (%s)", version, exc)
            return False
        self.eval_seconds = time.monotonic() - start
        self._record(version, result)
        return True

    def _record(self, version: int, result: EvalResult) -> None:
        self.evaluated_version = version
        was_reached = self.evals.reached is not None
        record, improved = self.evals.add(
            result,
            weights_version=version,
            seconds=time.time() - self.launched,
            env_steps=self._env_steps,
            episodes=len(result.returns),
            eval_seconds=self.eval_seconds,
        )
        tb = self._tb
        # Indexed by the learner's env steps at publish time: the same x-axis as the learner's returns
        # (the evaluator does not know the learner's update count, so all its tags are charts/).
        tb.scalar("charts/eval_return", result.mean, self._env_steps)
        tb.scalar("charts/eval_return_std", result.std, self._env_steps)
        tb.scalar("charts/eval_weights_version", version, self._env_steps)
        tb.scalar("charts/eval_seconds", self.eval_seconds, self._env_steps)
        tb.flush()
        if improved:
            self._save_best(version, result, record["time"])
        if self.evals.reached is not None and not was_reached:
            log.info("target return %s reached by weights version %d", fmt_value(self.evals.target), version)
        log.info(
            "eval of weights v%d: %.1f ± %.1f over %d episodes in %.1f s (best %.1f)%s",
            version,
            result.mean,
            result.std,
            len(result.returns),
            self.eval_seconds,
            self.evals.best,
            " (new best)" if improved else "",
        )

    def _save_best(self, version: int, result: EvalResult, when: float) -> None:
        """``checkpoints/best``: the evaluated weights alone, as tensors, so that
        ``torch.load(weights_only=True)`` reads it and ``zmqrl eval`` can play it."""
        import torch  # only now: an evaluator whose policy plays with numpy starts without it

        weights = self._loaded
        assert weights is not None and weights.version == version, "only imported weights are evaluated"
        payload = {
            "contents": WEIGHTS_ONLY,
            "agent_kind": self.cfg.agent.kind,
            "version": version,
            # Copies: received arrays are read-only views of the message's frames.
            "weights": {name: torch.tensor(array) for name, array in weights.arrays.items()},
            "config": self.cfg.to_dict(),
            "eval": {"mean": result.mean, "std": result.std, "time": when},
        }
        path = self.run_dir / BEST
        self.retries.run(lambda: save_checkpoint(path, payload), path, self.run_dir)

    def counters(self) -> dict[str, float | int]:
        """The scoring counters a heartbeat and the stats carry (the role adds its own)."""
        reached = self.evals.reached or {}
        return {
            "evaluations": self.evaluations,
            "weights_version": self.received_version,
            "evaluated_version": self.evaluated_version,
            "eval_return": self.evals.last,
            "eval_best": self.evals.best_or_nan,
            "eval_seconds": self.eval_seconds,
            "target_time": reached.get("time", float("nan")),
            "target_held_time": (self.evals.held or {}).get("time", float("nan")),
        }

    def record(self) -> dict[str, Any]:
        """Every evaluation, and the first that reached and held the target return, for the stats."""
        return {
            "eval_history": self.evals.history,
            "target_reached": self.evals.reached,
            "target_held": self.evals.held,
        }
