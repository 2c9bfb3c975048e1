"""The evaluator process: follows the learner's published weights and scores them greedily, out of its way.

Evaluation in the learner stalls training for as long as the episodes take (minutes for Atari);
here it costs the learner nothing: this process subscribes to the weights like an actor does,
plays ``evaluator.episodes`` greedy episodes of each new version it picks up (at most one
evaluation per ``evaluator.interval_seconds``) and keeps ``checkpoints/best`` as a weights-only
checkpoint of the best version seen. Which version, when, and what is kept is
``zmqrl.evaluator.scoring.Scorer``; this module wires it to the weights socket and the supervisor link.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from zmqrl import strictjson
from zmqrl.checkpoints.files import LATEST
from zmqrl.config import Config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.evaluator.greedy import make_eval_policy
from zmqrl.evaluator.scoring import BEST, Scorer, final_weights, stored_best_score
from zmqrl.metrics import Logger, run_logger
from zmqrl.runtime.launched import launch_time
from zmqrl.runtime.link import LEARNER_FINISHED, SupervisorLink, socket_limits, transport_security
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, WeightsSubscriber

# The supervisor knows this process as ("evaluator", EVALUATOR_ID).
ROLE = "evaluator"
EVALUATOR_ID = 0
# Between evaluations: wait this long for weights to arrive before heartbeating again.
IDLE_POLL_MS = 100
# During an evaluation: drain the weights socket this often. Its receive queue is tiny, so an
# undrained socket would drop the learner's stop announcement behind newer republishes.
DRAIN_SECONDS = 0.25
# Where the results go, under the run directory (scalars: zmqrl.metrics; `best`: zmqrl.evaluator.scoring).
STATS_FILE = "evaluator-stats.json"
# The supervisor's stop reason at the normal end of a run (the learner finished).
RUN_FINISHED = "run finished"

log = logging.getLogger("zmqrl.evaluator")


class Evaluator:
    """The evaluator process: a weights subscriber and a supervisor link around a ``Scorer``.

    The ``Scorer`` decides which published version to evaluate and when; this class feeds it the
    weights channel and stops it. When the learner announces its stop, the newest unevaluated
    version (the learner's final weights) is evaluated, then the evaluator leaves. A supervisor
    stop or ``request_stop()`` ends it at once, abandoning an evaluation under way.
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
        self.scorer: Scorer | None = None  # built by run(), with the envs and the policy
        self._next_drain = 0.0

    @property
    def evaluations(self) -> int:
        """Evaluations completed by this process."""
        return self.scorer.evaluations if self.scorer is not None else 0

    @property
    def eval_last(self) -> float:
        """Mean return of the latest evaluation (NaN before the first)."""
        return self.scorer.evals.last if self.scorer is not None else float("nan")

    @property
    def evaluated_version(self) -> int:
        """The weights version evaluated last (0: none yet)."""
        return self.scorer.evaluated_version if self.scorer is not None else 0

    @property
    def received_version(self) -> int:
        """The newest weights version received from the learner (0: none yet)."""
        return self.scorer.received_version if self.scorer is not None else 0

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        envs = [make_env(cfg.env, training=False) for _ in range(cfg.evaluator.episodes)]
        # The acting side only (numpy for an MLP): it imports published weights and plays greedily.
        policy = make_eval_policy(cfg, envs[0], seed=cfg.run.seed)
        # Torch is loaded by now only for a policy that plays with it (a CNN's): an MLP's evaluator
        # starts without it, as fast as an actor, and loads it at its first best checkpoint.
        if (torch := sys.modules.get("torch")) is not None:
            torch.set_num_threads(cfg.evaluator.torch_threads)
        best = stored_best_score(self.run_dir / BEST) if self.resume else None
        launched = launch_time(log)
        tb: Logger = self._logger or run_logger(self.run_dir, ROLE, launched=launched, config=cfg)
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        weights_sock = sockets.weights_sub(self._ctx, cfg.transport.weights, limits, security=security)
        self._weights_sock = weights_sock
        # Scores only weights trained with this run's settings: a learner with another env,
        # network or n-step raises FingerprintMismatch (exit 2) instead of being scored.
        self.weights = WeightsSubscriber(
            weights_sock,
            None,  # the policy checks names and shapes itself (see the Scorer's weights client)
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
        self.scorer = scorer = Scorer(
            cfg, policy, envs, tb, self.run_dir, launched=launched, best=best, bad=self.weights.bad
        )
        state = "failed"
        try:
            self._loop(scorer)
            state = "stopped"
        finally:
            self.stats = {
                **self._counters(),
                "state": state,
                "stop_reason": self.link.stop_reason,
                **scorer.record(),
            }
            self.weights.bad.flush()
            self._write_stats()  # before the goodbye: a supervisor that hears it may read the file
            self.link.final(state, self._counters())
            tb.close()
            for env in envs:
                env.close()
            weights_sock.close(linger=0)
            self.link.close()
        return self.stats

    def _loop(self, scorer: Scorer) -> None:
        self._follow(scorer)
        # The normal end reaches an evaluator either way: the supervisor's stop, or first the
        # learner's own announcement on the weights channel (a run shorter than our start-up).
        finished = self.link.stop_reason in (RUN_FINISHED, LEARNER_FINISHED)
        if finished and scorer.received_version == 0:
            self._score_final_checkpoint(scorer)

    def _score_final_checkpoint(self, scorer: Scorer) -> None:
        """The learner finished before this evaluator heard any of its weights (a short run, or an
        evaluator slow to start): score the final weights from the learner's last checkpoint, so
        a run with an evaluator always ends with its final policy evaluated."""
        latest = self.run_dir / "checkpoints" / LATEST
        if not latest.is_file():
            return
        log.info("the learner finished before any weights arrived: evaluating %s", latest)
        scorer.offer(final_weights(self.cfg, latest))
        scorer.evaluate_pending(self._progress_only)

    def _follow(self, scorer: Scorer) -> None:
        while not self.link.tick(self._counters, state=self._idle_state()):
            scorer.offer(self.weights.latest())
            announced = self.weights.stop
            if announced is not None and self.link.outlives(announced.reason):
                log.warning("the learner failed; waiting for the supervisor's replacement")
                self.weights.stop = announced = None
            if scorer.due(final=announced is not None):
                if not scorer.evaluate_pending(self._tick):
                    return  # told to stop mid-evaluation
                continue
            if announced is not None:  # and its final weights are evaluated
                self.link.stop_reason = announced.reason or "learner stopped"
                log.info("stop announced by the learner: %s", self.link.stop_reason)
                return
            self._weights_sock.poll(IDLE_POLL_MS)

    def _idle_state(self) -> str:
        return "waiting" if self.received_version == 0 else "running"

    def _tick(self) -> bool:
        """Called every lockstep step of an evaluation: heartbeat, stop check, and a time-gated
        drain of the weights socket; returns whether to abandon the evaluation."""
        now = time.monotonic()
        if now >= self._next_drain and self.scorer is not None:
            self._next_drain = now + DRAIN_SECONDS
            self.scorer.offer(self.weights.latest())
        return self.link.tick(self._counters, state="evaluating", useful=True)

    def _progress_only(self) -> bool:
        """Called every step of the final evaluation, after the stop: progress (so the watchdog
        does not take minutes of Atari episodes for a hang); never abandons it."""
        self.link.progress()
        return False

    def _counters(self) -> dict[str, float | int]:
        scorer = self.scorer
        assert scorer is not None, "counters are read from run() on"
        return {
            **scorer.counters(),
            "bad_messages": self.weights.bad.count,
            "duration": time.monotonic() - self.started,
        }

    def _write_stats(self) -> None:
        path = self.run_dir / STATS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(strictjson.dumps(self.stats, indent=2))
