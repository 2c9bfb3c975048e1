"""The learner process: a Trainer wired to its intake process (samples), the weights socket and the
supervisor. One thread trains and, between updates, takes the groups its intake checked into
replay as the replay ratio admits them; no second thread contends with training for the lock."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
import zmq

from zmqrl.checkpoints.files import CheckpointStorageError, CheckpointWriteError
from zmqrl.config import Config
from zmqrl.learner.dynamo_import import defer_adam_step_import, defer_dynamo_import
from zmqrl.learner.endpoints import LearnerSockets, bind_learner_sockets
from zmqrl.learner.ingest import group_limit, warn_if_queues_hide_lag
from zmqrl.learner.intake import SampleFeed
from zmqrl.learner.reporting import LearnerReports, write_stats
from zmqrl.learner.stopping import ENDED_MAX_SECONDS, ENDED_MAX_STEPS, ENDED_TARGET_HELD
from zmqrl.learner.trainer import Published, Trainer
from zmqrl.metrics import Logger, run_logger
from zmqrl.runtime.guard import ThreadDied
from zmqrl.runtime.health import BAD_LATEST_INFO_KEY
from zmqrl.runtime.launched import launch_time
from zmqrl.runtime.link import END_ACTORS_DONE, SupervisorLink
from zmqrl.runtime.testhooks import Faults
from zmqrl.transport.channels import WeightsPublisher

# When this module (and torch with it) finished importing: the first of the start-up marks.
IMPORTED = time.time()
# Main loop: updates between (cheap, time-gated) housekeeping calls.
HOUSEKEEPING_EVERY = 8
# While waiting for the first transitions, the learner answers joining actors this often: the
# run's start waits on each actor's first weights.
WAIT_TICK_SECONDS = 0.02
# Longest single wait for samples when the replay ratio admits no update, so the loop still heartbeats.
TRAIN_WAIT_MS = 100

log = logging.getLogger("zmqrl.learner")


class Learner:
    """Owns the intake process, the weights socket and the run directory around a :class:`Trainer`.

    ``run()`` blocks until ``learner.max_updates``, ``learner.max_seconds``, the target held
    (``learner.stop_at_target``: its own evaluations, or the supervisor's word for the evaluator's),
    a stop broadcast or ``request_stop()``; then it evaluates once more, checkpoints, reports and
    closes everything. ``faults`` are a test's (zmqrl.runtime.testhooks; the process main builds
    them from the environment): none by default, and then no fault code runs.
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
        faults: Faults | None = None,
        bound: LearnerSockets | None = None,
    ) -> None:
        self.cfg = cfg
        self._bound = bound  # bound by the process main before torch loaded, or here in run()
        self._faults = faults
        self.resume = resume  # continue from the run directory's newest readable checkpoint
        self._ctx = ctx or zmq.Context.instance()
        self._link = link  # made by the process main before torch loaded, or here in run()
        self.run_dir = run_dir if run_dir is not None else cfg.run_dir
        self._logger = logger
        self.stop_event = threading.Event()
        self.ready = threading.Event()  # set once sockets are bound and `endpoints` is filled
        self.endpoints: dict[str, str] = {}
        self.stats: dict[str, Any] = {}
        self._thread_error: tuple[str, BaseException] | None = None  # a background thread that died
        self._ignored_end: str | None = None  # a supervisor's end request this learner does not act on
        self.trainer: Trainer | None = None
        self.reports: LearnerReports | None = None  # built by run() once the sockets are bound
        self._auth: Any = None  # the Curve authenticator, when the run uses keys
        self._state = "failed"  # what the final heartbeat reports; run() sets it when it gets there
        # Start-up, in seconds after the launch (wall clock): sockets bound, torch imported, first
        # weights published, replay at min_replay_size, first update done. In the final stats
        # (learner-stats.json "startup") for `zmqrl bench`'s start-up part.
        self.startup: dict[str, float] = {}
        self._launched = time.time()  # the launch's wall time, once run() has read it

    def request_stop(self) -> None:
        self.stop_event.set()

    # What tests and tools read while it runs: the trainer's counters (0 before it is built).
    updates = property(lambda self: self.trainer.counters.updates if self.trainer else 0)
    samples = property(lambda self: self.trainer.counters.samples if self.trainer else 0)
    batches = property(lambda self: self.trainer.counters.batches if self.trainer else 0)
    stale_batches = property(lambda self: self.trainer.counters.stale_batches if self.trainer else 0)

    @property
    def parts(self) -> Trainer:
        """The trainer, once ``run()`` built it."""
        assert self.trainer is not None, "the learner builds its trainer in run()"
        return self.trainer

    fingerprint = property(lambda self: self.parts.fingerprint)
    replay = property(lambda self: self.parts.replay)
    limiter = property(lambda self: self.parts.limiter)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(cfg.learner.torch_threads)
        # The link first: whatever fails after it, the supervisor hears this learner's final state.
        self.link = self._link or SupervisorLink(self._ctx, cfg, "learner", 0)
        self.link.attach(self.stop_event)
        # Everything built is closed again in reverse order, each step even if one before it
        # failed; the final stats and heartbeat come last before the link itself.
        with contextlib.ExitStack() as built:
            built.callback(self.link.close)
            built.callback(self._report_end)
            if self._bound is not None:
                built.callback(self._bound.close)
            # Adam without importing torch._dynamo (slow to import, never used by the built-in
            # agents): zmqrl/learner/dynamo_import.py.
            defer_dynamo_import()
            defer_adam_step_import()
            self.trainer = trainer = Trainer(
                cfg,
                self.run_dir,
                resume=self.resume,
                on_thread_death=self._background_died,
                progress=self.link.progress,
                faults=self._faults,
            )
            built.callback(trainer.close)
            self.agent = trainer.agent
            warn_if_queues_hide_lag(cfg)
            bound = self._bound
            if bound is None:
                bound = bind_learner_sockets(cfg, self._ctx)
                built.callback(bound.close)
            self._auth = bound.auth
            self.endpoints = {"samples": bound.samples_endpoint, "weights": bound.weights_endpoint}
            self.intake = self.receiver = bound.intake  # (receiver: what tests and tools read)
            self.feed = SampleFeed(self.intake, trainer.ingest)  # into replay, between updates
            self.publisher = WeightsPublisher(bound.weights, cfg.agent.kind, fingerprint=trainer.fingerprint)
            built.callback(lambda: self.publisher.announce_stop(f"learner {self._state}"))
            launched = self._launched = launch_time(log)
            self._mark("imported", IMPORTED)
            self._mark("bound", bound.bound_at)
            trainer.start(launched)
            self.intake.begin(trainer.spec, cfg.actor.num_actors, group_limit(trainer.spec, trainer.limiter))
            # The first weights before the rest is built (the TensorBoard writer): the actors act
            # with them meanwhile, and their first batches wait in the intake.
            self._publish(trainer.publish())  # first publish: actors adopt the learner's weights
            self._mark("first_weights")
            tb = self._logger or run_logger(self.run_dir, "learner", launched=launched, config=cfg)
            built.callback(tb.close)
            self.reports = reports = LearnerReports(
                trainer,
                tb,
                bad_messages=lambda: self.intake.bad.count,
                seqs=self.intake.seqs,
                extra=self._extra,
            )
            self.started = time.monotonic()
            self.ready.set()
            log.info("learner up: samples %s, weights %s", bound.samples_endpoint, bound.weights_endpoint)
            self._wait_for_replay()
            self._mark("replay_ready")
            if not self.stop_event.is_set() and trainer.ended is None:
                self._train()
            self._raise_if_thread_died()
            finished = not self.stop_event.is_set()  # max_updates, max_seconds or the target held
            self._publish(trainer.publish())  # the last weights, then the final evaluation of them
            reports.log_eval(trainer.final_evaluation(finished))
            reports.log_end()  # TensorBoard ends on the final stats' counts and episodes
            trainer.save_latest(final=True)  # on disk before returning
            self._state = "finished" if finished else "stopped"
        return self.stats

    def _report_end(self) -> None:
        """The final stats file, then the final heartbeat (a supervisor that hears it reads the
        file): with the learner's counters once it got that far, else its state alone."""
        state = self._state
        try:
            if self.reports is not None and self.trainer is not None:
                self.intake.close()  # its last report in: every drop counted
                self.intake.bad.flush()  # drops still waiting for their rate-limited log line
                final = self.reports.final_stats(state, self.endpoints)
                self.stats = {**final, **self.trainer.end_stats(state)}
            else:
                self.stats = {"state": state}
            if self.startup:
                self.stats["startup"] = dict(self.startup)
                self.stats["launched"] = self._launched  # what the marks count from (Unix seconds)
            write_stats(self.run_dir, self.stats)
        finally:
            counters = self._counters() if self.reports is not None else {}
            self.link.final(state, counters, self.endpoints)

    def _mark(self, what: str, when: float | None = None) -> None:
        """Note a start-up step's time (now, or ``when``), in seconds after the launch."""
        self.startup[what] = round((time.time() if when is None else when) - self._launched, 3)

    def _publish(self, published: Published) -> None:
        self.publisher.publish(published.weights, env_steps=published.env_steps)

    def _train_step(self) -> None:
        """One update; then publish and log what it made due, and the evaluation and checkpoint."""
        assert self.trainer is not None and self.reports is not None
        report = self.trainer.train_step()
        if report.published is not None:
            self._publish(report.published)
        if report.scalars is not None:
            self.reports.log_scalars(report.scalars)
        self.reports.log_eval(self.trainer.follow_up(report))

    def _extra(self) -> dict[str, float | int]:
        # Curve handshakes refused (unknown or revoked keys): at the weights socket and the intake's.
        return {"auth_denied": self._auth.denied + self.intake.auth_denied} if self._auth is not None else {}

    def _counters(self) -> dict[str, float | int]:
        assert self.reports is not None, "counters are read once run() built its reports"
        return self.reports.counters()

    def _background_died(self, exc: BaseException) -> None:
        """A background thread (the checkpoint writer) died: the main loop raises ThreadDied
        at its next housekeeping, so the process exits non-zero and is restarted from its checkpoint."""
        if self._thread_error is None:
            self._thread_error = (threading.current_thread().name, exc)
        self.stop_event.set()
        if self.trainer is not None:
            self.trainer.limiter.close()  # wake a trainer waiting on data that will never come

    def _raise_if_thread_died(self) -> None:
        if self._thread_error is not None:
            name, exc = self._thread_error
            if isinstance(exc, CheckpointWriteError):  # a full disk: the operator's (exit 2), not a bug
                raise exc
            if isinstance(exc, CheckpointStorageError):  # failing storage, said in one line: exit 1
                raise exc
            raise ThreadDied(f"the learner's {name} thread died: {type(exc).__name__}: {exc}") from exc

    def _housekeeping(self, useful: bool = False) -> None:
        """``useful``: updates were made since the last call (waiting for data is not work)."""
        self._raise_if_thread_died()
        self.intake.read_reports()  # its counts; IntakeDied if it ended
        self.publisher.republish_if_due(self.cfg.learner.republish_seconds)
        self.intake.bad.maybe_flush()  # a burst of drops that stopped is still reported
        latest = self.intake.bad.latest  # the operator's line can say why, not only how many
        info = {**self.endpoints, BAD_LATEST_INFO_KEY: latest} if latest else self.endpoints
        self.link.tick(self._counters, info, useful=useful)
        assert self.reports is not None
        self.reports.progress_line_if_due()
        self._heed_end_request()

    def _heed_end_request(self) -> None:
        """With a separate evaluator the learner does not see the evaluations: the supervisor, told
        by the evaluator's heartbeats that the target is held, says so in its own heartbeats on
        the control channel (zmqrl/transport/control.py), and the run ends here as at its end.
        Acted on only with this learner's own ``learner.stop_at_target``, so a learner whose config
        does not ask for it never ends early; an unknown request is logged once and ignored.
        The supervisor also asks once every actor has reached ``actor.max_steps``: no data will
        come any more (a replay ratio would wait for it forever), so the run ends as serial
        mode's does there."""
        assert self.trainer is not None
        request = self.link.control.end_request
        if request is None or self.trainer.ended is not None or request == self._ignored_end:
            return
        reason = ENDED_MAX_STEPS if request == END_ACTORS_DONE else request
        if self.trainer.stop.end_requested(reason):
            if reason == ENDED_TARGET_HELD:
                log.info("the supervisor reports the evaluator held the target return")
            else:
                log.info("every actor reached actor.max_steps: ending the run")
            return
        self._ignored_end = request
        log.warning(
            "the supervisor asks to end the run (%s); ignored: learner.stop_at_target is not set here "
            "(or the request is unknown)",
            request,
        )

    def _wait_for_replay(self) -> None:
        """Take samples (sleeping on the intake, no spinning) until replay holds
        ``min_replay_size`` transitions, keeping the weights republished and the supervisor
        informed meanwhile. ``learner.max_seconds`` counts this wait too: a run whose actors never
        fill replay still ends when its time is up."""
        assert self.trainer is not None
        ready = self.trainer.ingest.replay_ready
        self.trainer.ingest.note_replay_size()  # e.g. restored from a snapshot
        if ready.is_set():
            return
        log.info("waiting for %d transitions before the first update", self.trainer.min_size)
        tick_ms = int(1000 * min(WAIT_TICK_SECONDS, self.cfg.learner.republish_seconds))
        while not ready.is_set():
            if not self.feed.take():
                self.intake.ready(tick_ms)
            self._housekeeping()
            if self._leaving():  # stopped, or the run's end came first (max_seconds, actors done)
                break
        if not ready.is_set() and self.trainer.ended == ENDED_MAX_SECONDS:
            log.warning(
                "learner.max_seconds passed before the first update: replay holds %d of the %d "
                "transitions it waits for (are the actors running? see their logs)",
                len(self.trainer.replay),
                self.trainer.min_size,
            )

    def _train(self) -> None:
        assert self.trainer is not None
        trainer, lcfg = self.trainer, self.cfg.learner
        log.info("training: %d updates of batch %d", lcfg.max_updates, self.cfg.agent.batch_size)
        while not self._leaving():
            took = self.feed.take_if_due()
            if not trainer.can_train():
                took = took or self.feed.take()  # out of data: take what is there at once
                if not took:  # ahead of the data: wait for the actors' next samples
                    self.feed.wait(TRAIN_WAIT_MS)
                self._housekeeping()  # and stay responsive
                continue
            self._train_step()
            if "first_update" not in self.startup:
                self._mark("first_update")
                log.info("first update %.2f s after the launch", self.startup["first_update"])
            if trainer.ended is not None:  # the evaluation in this step held the target
                return
            if trainer.counters.updates % HOUSEKEEPING_EVERY == 0:
                self._housekeeping(useful=True)

    def _leaving(self) -> bool:
        """Whether the training loop ends now: stopped, or the run is at its end (the trainer's
        StopPolicy: an end already decided, learner.max_updates or learner.max_seconds)."""
        assert self.trainer is not None
        if self.stop_event.is_set():
            return True
        return self.trainer.stop.check(self.trainer.counters.updates, time.monotonic()) is not None
