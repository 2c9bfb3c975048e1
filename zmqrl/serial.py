"""Serial mode: one process, one thread, the components of a launched run interleaved deterministically.

The same sampling loop and adder (Sampler's exploration and n-step processing, or an on-policy
agent's rollouts), wire encoding and decoding, Trainer (ingest, replay or the rollout queue,
agent update, evaluation, checkpoints) and weights import run here as in ``zmqrl launch``, but
in turns instead of in parallel and with no sockets: a batch is encoded to its wire frames and
decoded back exactly as a learner would receive it, and each published snapshot goes through the
wire to every actor, which imports it at its next weights poll. With a fixed ``run.seed`` two
runs give identical results, so this is the mode for breakpoints, profilers and fast tests.

The interleaving follows the replay ratio. With ``learner.samples_per_insert`` set, actors take
turns (round robin) producing one batch each, and the learner trains whenever the ratio admits
an update and before any insert it would refuse; an on-policy run does the same with its queue
(an update whenever a batch of rollouts is queued). Unset (processes then train as fast as they
can), serial mode makes one update per batch received once replay holds ``min_replay_size``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from zmqrl.actor.parts import build_acting
from zmqrl.actor.sampler import Collected
from zmqrl.checkpoints.choice import choose_deployment
from zmqrl.config import Config, save_config
from zmqrl.core import Policy
from zmqrl.learner.reporting import LearnerReports, write_stats
from zmqrl.learner.stopping import ENDED_MAX_STEPS
from zmqrl.learner.trainer import Published, Trainer
from zmqrl.metrics import Logger, run_logger
from zmqrl.replay import QueueLimiter, RateLimiter
from zmqrl.transport import wire
from zmqrl.transport.sequence import SequenceTracker
from zmqrl.transport.wire import SamplesMsg, WeightsMsg

log = logging.getLogger("zmqrl.serial")


class SerialActor:
    """One actor's parts (its adder holds nothing back: the learner is there from the start), with an
    inbox holding the newest published weights frames."""

    def __init__(self, cfg: Config, actor_id: int) -> None:
        parts = build_acting(cfg, actor_id)
        self.policy: Policy = parts.policy
        self.weights = parts.weights  # newer versions only, as an actor's
        self.sampler = parts.sampler  # steps the env(s) into the adder
        self.adder = parts.adder  # n-step transitions, or on-policy rollouts, as messages
        self.inbox: list[bytes | memoryview] | None = None
        self.started = time.monotonic()
        self.weights_loaded = 0
        self.samples_sent = 0

    def take_weights(self) -> None:
        """Import the newest published weights, if any arrived since the last poll."""
        if self.inbox is None:
            return
        msg = wire.load_weights(self.inbox)
        self.inbox = None
        if self.weights.offer(msg.weights):
            self.weights_loaded += 1

    def next_batch(self) -> list[bytes | memoryview]:
        """Step until a batch is ready, taking in weights whenever they are due; its wire frames."""
        while (msg := self.adder.pop()) is None:
            if self.sampler.collect(1 << 30) is Collected.WEIGHTS_DUE:
                self.take_weights()
        self.samples_sent += msg.batch.size
        return wire.dump(msg)

    def stats(self) -> dict[str, Any]:
        return {
            "actor_id": self.adder.actor_id,
            **self.sampler.counters(time.monotonic() - self.started),
            "samples": self.samples_sent,
            "weights_loaded": self.weights_loaded,
        }


class SerialRun:
    """A whole run in this thread: ``run()`` returns ``{"learner": ..., "actors": [...], "deploy": ...}``.

    It ends at ``learner.max_updates``, ``learner.max_seconds``, every actor at ``actor.max_steps``
    or, with ``learner.stop_at_target``, once the learner's evaluations held the target (the
    trainer's StopPolicy decides, as in the learner process); the learner stats' ``ended`` says which."""

    def __init__(
        self, cfg: Config, *, run_dir: Path | None = None, logger: Logger | None = None, resume: bool = False
    ) -> None:
        if cfg.evaluator.enabled:
            log.info("serial mode: the learner evaluates (evaluator.enabled is for separate processes)")
            cfg = replace(cfg, evaluator=replace(cfg.evaluator, enabled=False))
        self.cfg = cfg
        self.run_dir = run_dir if run_dir is not None else cfg.run_dir
        self._logger = logger
        self.resume = resume
        self.stopped = False  # set by request_stop (e.g. from a signal handler)

    def request_stop(self) -> None:
        self.stopped = True

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        import torch  # the learner's agent needs it anyway; its intra-op threads as the learner's

        torch.set_num_threads(cfg.learner.torch_threads)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        self.actors: list[SerialActor] = []
        self.seqs = SequenceTracker.for_run(cfg.actor.num_actors)
        self.trainer = trainer = Trainer(cfg, self.run_dir, resume=self.resume, background_checkpoints=False)
        launched = time.time()  # serial mode is its own launch: "time" in metrics.jsonl counts from here
        tb = self._logger or run_logger(self.run_dir, "learner", launched=launched, config=cfg)
        self.reports = reports = LearnerReports(trainer, tb, bad_messages=lambda: 0, seqs=self.seqs)
        state = "failed"
        try:
            self.actors = [SerialActor(cfg, i) for i in range(cfg.actor.num_actors)]
            trainer.start(launched)
            self._deliver(trainer.publish())
            finished = self._loop()
            self._deliver(trainer.publish())  # the last weights, then the final evaluation of them
            reports.log_eval(trainer.final_evaluation(finished))
            reports.log_end()  # TensorBoard ends on the final stats' counts and episodes
            trainer.save_latest(final=True)
            state = "finished" if finished else "stopped"
        finally:
            learner = {**reports.final_stats(state, {}), **trainer.end_stats(state)}
            write_stats(self.run_dir, learner)
            tb.close()
            for actor in self.actors:
                actor.sampler.close()
            trainer.close()
        return {
            "mode": "serial",
            "learner": learner,
            "actors": [a.stats() for a in self.actors],
            "deploy": choose_deployment(self.run_dir, learner).to_dict(),
        }

    def _deliver(self, published: Published) -> None:
        msg = WeightsMsg(
            weights=published.weights,
            agent=self.cfg.agent.kind,
            fingerprint=self.trainer.fingerprint,
            env_steps=published.env_steps,
        )
        frames = wire.dump(msg)
        for actor in self.actors:
            actor.inbox = frames  # a newer publish replaces one not yet polled, as actors keep the latest

    def _train_step(self) -> None:
        """One update; then deliver and log what it made due, and the evaluation and checkpoint."""
        report = self.trainer.train_step()
        if report.published is not None:
            self._deliver(report.published)
        if report.scalars is not None:
            self.reports.log_scalars(report.scalars)
        self.reports.log_eval(self.trainer.follow_up(report))

    def _loop(self) -> bool:
        """Alternate batches and updates until the run's end (its reason in ``trainer.ended``);
        False if stopped (request_stop)."""
        cfg, trainer = self.cfg, self.trainer
        lcfg, stop = cfg.learner, trainer.stop
        batch_size = cfg.agent.batch_size
        # A replay ratio, or an on-policy queue: the learner trains as the limiter admits.
        ratio = isinstance(trainer.limiter, RateLimiter | QueueLimiter)
        max_steps = cfg.actor.max_steps
        turn = 0
        while not self.stopped:
            if stop.check(trainer.counters.updates, time.monotonic()) is not None:
                return True
            live = [a for a in self.actors if max_steps is None or a.sampler.steps < max_steps]
            if not live:
                log.info("every actor reached actor.max_steps: ending the run")
                stop.end(ENDED_MAX_STEPS)
                return True
            actor = live[turn % len(live)]
            turn += 1
            frames = actor.next_batch()
            msg = wire.load_samples(frames, trainer.spec)  # what a learner receives, checked as it checks
            self._insert(msg, batch_size)
            if ratio:
                while (
                    trainer.counters.updates < lcfg.max_updates
                    and trainer.ended is None
                    and trainer.limiter.can_sample(batch_size)
                ):
                    self._train_step()
            elif trainer.ingest.replay_ready.is_set():
                self._train_step()
            self.reports.progress_line_if_due()
        return False

    def _insert(self, msg: SamplesMsg, batch_size: int) -> None:
        """Hand one batch to ingest; first train as long as the replay ratio would refuse it."""
        trainer = self.trainer
        while not trainer.limiter.can_insert(msg.batch.size):
            if trainer.ended is not None:
                return  # the run ends with this update's weights; the batch would not be trained on
            # No deadlock (zmqrl/replay/ratelimit.py): a limiter refusing an insert admits a sample.
            if not trainer.limiter.can_sample(batch_size):
                raise RuntimeError(f"replay ratio deadlock: {trainer.limiter!r}")
            self._train_step()
        self.seqs.observe(msg.actor_id, msg.seq, msg.batch.size)
        accepted = trainer.ingest.accept(msg)
        assert accepted, "the limiter admitted this insert"


def run_serial(
    cfg: Config, *, run_dir: Path | None = None, logger: Logger | None = None, resume: bool = False
) -> dict[str, Any]:
    """Run ``cfg`` in serial mode; returns ``{"mode", "learner", "actors"}`` (see SerialRun)."""
    return SerialRun(cfg, run_dir=run_dir, logger=logger, resume=resume).run()
