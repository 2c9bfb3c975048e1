"""The evaluator: follows the learner's published weights and scores them greedily, out of its way.

Evaluation in the learner stalls training for as long as the episodes take (minutes for Atari);
here it costs the learner nothing: this process subscribes to the weights like an actor does,
plays ``evaluator.episodes`` greedy episodes of each new version it picks up (at most one
evaluation per ``evaluator.interval_seconds``) and keeps ``checkpoints/best`` as a weights-only
checkpoint of the best version seen.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

import torch
import zmq

from zmqrl import strictjson
from zmqrl.checkpoint import load_checkpoint, save_checkpoint
from zmqrl.config import Config
from zmqrl.envs import make_env, sample_spec
from zmqrl.evaluation import (
    EVAL_SEED_OFFSET,
    WEIGHTS_ONLY,
    EvalResult,
    EvalTracker,
    EvaluationAborted,
    evaluate,
    make_eval_agent,
)
from zmqrl.fingerprint import run_fingerprint
from zmqrl.metrics import Logger, TensorBoardLogger, fmt_value
from zmqrl.roles.link import SupervisorLink, launch_time, socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, WeightsSubscriber
from zmqrl.transport.wire import WeightsMsg

# The supervisor knows this process as ("evaluator", EVALUATOR_ID).
ROLE = "evaluator"
EVALUATOR_ID = 0
# Between evaluations: wait this long for weights to arrive before heartbeating again.
IDLE_POLL_MS = 100
# During an evaluation: drain the weights socket this often. Its receive queue is tiny, so an
# undrained socket would drop the learner's stop announcement behind newer republishes.
DRAIN_SECONDS = 0.25
# Where the results go, under the run directory.
TB_SUBDIR = Path("tb") / "evaluator"
BEST = Path("checkpoints") / "best"
STATS_FILE = "evaluator-stats.json"

log = logging.getLogger("zmqrl.evaluator")


class Evaluator:
    """Evaluates each newly published weights version once, greedily, on its own eval envs.

    A version is evaluated when it is newer than the last one evaluated and ``interval_seconds``
    passed since the last evaluation started; versions published meanwhile are skipped in favour
    of the newest. When the learner announces its stop, the newest unevaluated version (the
    learner's final weights) is evaluated regardless of the interval, then the evaluator leaves.
    A supervisor stop or ``request_stop()`` ends it at once, abandoning an evaluation under way.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        ctx: zmq.Context | None = None,
        logger: Logger | None = None,
        run_dir: Path | None = None,
        resume: bool = False,
        link: SupervisorLink | None = None,
    ) -> None:
        self.cfg = cfg
        self._ctx = ctx or zmq.Context.instance()
        self._link = link  # made by the process main before torch loaded, or here in run()
        self.run_dir = run_dir if run_dir is not None else cfg.run_dir
        self._logger = logger
        # Continuing a run: the existing `best` checkpoint's score must be beaten before it is replaced.
        self.resume = resume
        self.stop_event = threading.Event()
        self.stats: dict[str, Any] = {}
        self.evaluated_version = 0
        self.eval_seconds = float("nan")
        self.evals = EvalTracker(cfg.learner.target_return, cfg.learner.target_hold)
        self._env_steps = 0  # the learner's env steps when it published the weights being evaluated
        self._pending: WeightsMsg | None = None  # newest weights received and not loaded yet
        self._last_eval_start = -math.inf
        self._next_drain = 0.0

    @property
    def evaluations(self) -> int:
        """Evaluations completed by this process."""
        return len(self.evals.history)

    @property
    def eval_last(self) -> float:
        """Mean return of the latest evaluation (NaN before the first)."""
        return self.evals.last

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(cfg.evaluator.torch_threads)
        envs = [make_env(cfg.env, training=False) for _ in range(cfg.evaluator.episodes)]
        self.agent = make_eval_agent(cfg, envs[0], seed=cfg.run.seed)
        if self.resume:
            self._restore_best()
        self._tb: Logger = self._logger or TensorBoardLogger(self.run_dir / TB_SUBDIR)
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        weights_sock = sockets.weights_sub(self._ctx, cfg.transport.weights, limits, security=security)
        self._weights_sock = weights_sock
        # Scores only weights trained with this run's settings: a learner with another env,
        # network or n-step raises FingerprintMismatch (exit 2) instead of being scored.
        self.weights = WeightsSubscriber(
            weights_sock,
            self.agent.weights_spec(),
            BadMessages(f"{ROLE} weights", log),
            expected_fingerprint=run_fingerprint(cfg, sample_spec(envs[0])),
        )
        self.link = self._link or SupervisorLink(self._ctx, cfg, ROLE, EVALUATOR_ID)
        self.link.attach(self.stop_event)
        log.info(
            "evaluator up: %d greedy episodes per evaluation, at most every %.1f s, weights <- %s",
            cfg.evaluator.episodes,
            cfg.evaluator.interval_seconds,
            cfg.transport.weights,
        )
        self.started = time.monotonic()
        self.launched = launch_time(log)  # "seconds" in the eval history count from here
        state = "failed"
        try:
            self._loop(envs)
            state = "stopped"
        finally:
            self.stats = {
                **self._counters(),
                "state": state,
                "stop_reason": self.link.stop_reason,
                "eval_history": self.evals.history,
                "target_reached": self.evals.reached,
                "target_held": self.evals.held,
            }
            self.weights.bad.flush()
            self._write_stats()  # before the goodbye: a supervisor that hears it may read the file
            self.link.final(state, self._counters())
            self._tb.close()
            for env in envs:
                env.close()
            weights_sock.close(linger=0)
            self.link.close()
        return self.stats

    def _loop(self, envs: list[Any]) -> None:
        interval = self.cfg.evaluator.interval_seconds
        while not self.link.tick(self._counters, state=self._idle_state()):
            self._drain_weights()
            announced = self.weights.stop
            if announced is not None and self.link.outlives(announced.reason):
                log.warning("the learner failed; waiting for the supervisor's replacement")
                self.weights.stop = announced = None
            due = announced is not None or time.monotonic() - self._last_eval_start >= interval
            if due and self._pending is not None:
                # Loaded only now: versions superseded while waiting are never even imported.
                self.agent.import_weights(self._pending.weights)
                self._env_steps = self._pending.env_steps or 0
                self._pending = None
                if not self._evaluate(envs):
                    return  # told to stop mid-evaluation
                continue
            if announced is not None:  # and its final weights are evaluated
                self.link.stop_reason = announced.reason or "learner stopped"
                log.info("stop announced by the learner: %s", self.link.stop_reason)
                return
            self._weights_sock.poll(IDLE_POLL_MS)

    @property
    def received_version(self) -> int:
        """The newest weights version received from the learner (0: none yet)."""
        return self._pending.weights.version if self._pending is not None else self.agent.weights_version

    def _idle_state(self) -> str:
        return "waiting" if self.received_version == 0 else "running"

    def _drain_weights(self) -> None:
        """Keep the newest weights received that are newer than those evaluated last; they are
        loaded when their evaluation starts, never during one. (The learner republishes its current
        weights every second: a version already evaluated is not evaluated again.)"""
        msg = self.weights.latest()
        if msg is not None and msg.weights.version > self.received_version:
            self._pending = msg

    def _tick(self) -> bool:
        """Called every lockstep step of an evaluation: heartbeat, stop check, and a time-gated
        drain of the weights socket; returns whether to abandon the evaluation."""
        now = time.monotonic()
        if now >= self._next_drain:
            self._next_drain = now + DRAIN_SECONDS
            self._drain_weights()
        return self.link.tick(self._counters, state="evaluating")

    def _evaluate(self, envs: list[Any]) -> bool:
        """Evaluate the weights the agent holds; False if told to stop before it finished."""
        version = self.agent.weights_version
        episodes = len(envs)
        # Seeds as the learner's own evaluations use them: far from any actor's, new ones each time.
        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + self.evaluations * episodes
        self._last_eval_start = start = time.monotonic()
        try:
            result = evaluate(self.agent, envs, seed=seed, tick=self._tick)
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
        # Indexed by the learner's env steps at publish time: the same x-axis as the learner's returns.
        tb.scalar("charts/eval_return", result.mean, self._env_steps)
        tb.scalar("charts/eval_return_std", result.std, self._env_steps)
        tb.scalar("evaluator/weights_version", version, version)
        tb.scalar("evaluator/eval_seconds", self.eval_seconds, version)
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
        weights = self.agent.export_weights()
        payload = {
            "contents": WEIGHTS_ONLY,
            "agent_kind": self.cfg.agent.kind,
            "version": version,
            "weights": {name: torch.from_numpy(array) for name, array in weights.arrays.items()},
            "config": self.cfg.to_dict(),
            "eval": {"mean": result.mean, "std": result.std, "time": when},
        }
        save_checkpoint(self.run_dir / BEST, payload)

    def _restore_best(self) -> None:
        """Start from the score of the run's existing ``best`` (ours or the learner's), if any."""
        path = self.run_dir / BEST
        if not path.is_file():
            return
        try:
            score = load_checkpoint(path).get("eval", {})
        except (ValueError, OSError) as exc:
            log.warning("cannot read %s (%s); it will be replaced by the next evaluation", path, exc)
            return
        best = score.get("mean", score.get("best"))  # weights-only payload, or the learner's full state
        if isinstance(best, (int, float)) and math.isfinite(best):
            self.evals.best = float(best)
            log.info("resuming: %s holds a policy scoring %.1f; only a better one replaces it", path, best)

    def _counters(self) -> dict[str, float | int]:
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
            "bad_messages": self.weights.bad.count,
            "duration": time.monotonic() - self.started,
        }

    def _write_stats(self) -> None:
        path = self.run_dir / STATS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(strictjson.dumps(self.stats, indent=2))
