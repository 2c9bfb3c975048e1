"""The learner without sockets or threads: builds replay and agent from the config, trains, evaluates.

The learner process and serial mode drive the same ``Trainer``: they differ only in where samples
come from, where published weights and reports go, and in whether ingest runs on a thread. The
trainer returns what each step made due (weights to publish, scalars to log, an evaluation's
result) and its role sends and logs them: nothing here calls back into a role.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from zmqrl.agents import make_learner
from zmqrl.config import Config
from zmqrl.envs.factory import make_env
from zmqrl.errors import ConfigError
from zmqrl.evaluator.greedy import EVAL_SEED_OFFSET, EvalResult, EvalTracker, evaluate
from zmqrl.learner.checkpointing import VERSION_FILE, Checkpoints, PublishedVersions
from zmqrl.learner.data import checkpointed_config, learner_spec, make_learner_data
from zmqrl.learner.ingest import Ingest, LearnerCounters
from zmqrl.learner.nonfinite import (
    NonFiniteTraining,
    NonFiniteUpdates,
    refuse_nonfinite_state,
    refuse_nonfinite_weights,
)
from zmqrl.learner.stopping import ENDED_MAX_UPDATES, StopPolicy
from zmqrl.replay.memory import format_bytes
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.runtime.testhooks import Faults
from zmqrl.transport import wire
from zmqrl.transport.weights_channel import WeightsNumbering
from zmqrl.transport.wire import MAX_ARRAYS, Fingerprint, WeightsMsg
from zmqrl.types import Weights

log = logging.getLogger("zmqrl.learner")


class Published(NamedTuple):
    """Weights for the role to publish: guarded against non-finite values, their version reserved
    on disk, and the env steps (transitions received) they were trained on."""

    weights: Weights
    env_steps: int


@dataclass
class UpdateReport:
    """What one update made due at its count, for the role to act on before ``follow_up``."""

    updates: int
    published: Published | None = None  # learner.sync_interval: weights to send now
    scalars: dict[str, float] | None = None  # learner.log_interval: the update's metrics to log


def check_weights_fit(
    spec: Mapping[str, tuple[tuple[int, ...], str]],
    agent_kind: str,
    fingerprint: Fingerprint,
    max_message_mb: int,
) -> None:
    """Refuse a network whose weights message subscribers would drop: a message larger than
    ``transport.max_message_mb`` over all its frames is dropped as it is read (and ZeroMQ itself
    refuses any one frame above it), so actors and the evaluator would act with their initial
    weights forever without a word. Measured on the message as encoded, from the agent's
    exported weights (zeros of those shapes, names and dtypes). A
    network of more tensors than one message may carry (the wire format's MAX_ARRAYS) is
    refused the same way, before the encoder would fail on it."""
    if len(spec) > MAX_ARRAYS:
        raise ConfigError(
            f"the {agent_kind} agent's published network has {len(spec)} tensors, more than the "
            f"{MAX_ARRAYS} one weights message may carry (the wire format's limit): use fewer "
            f"layers (agent.hidden_sizes: each hidden layer adds a weight and a bias)"
        )
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in spec.items()}
    frames = wire.dump(WeightsMsg(weights=Weights(0, arrays), agent=agent_kind, fingerprint=fingerprint))
    total = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
    limit = max_message_mb * 2**20
    if total > limit:
        need = math.ceil(total / 2**20)
        raise ConfigError(
            f"the weights message ({format_bytes(total)}) is larger than transport.max_message_mb "
            f"{max_message_mb} ({format_bytes(limit)}): actors and the evaluator would drop every "
            f"weights message; raise transport.max_message_mb to {need} or use a smaller network"
        )


class Trainer:
    """Replay, agent, rate limiter, counters, evaluations and checkpoints of one learner.

    Its role drives it: ``train_step()`` returns an ``UpdateReport`` (weights to publish, scalars to
    log), the role publishes and logs them, then ``follow_up(report)`` runs the evaluation and the
    checkpoint due at that count (after the publish, so actors act with the new weights meanwhile)
    and returns the evaluation made. When the run ends is ``stop``'s to say (``StopPolicy``).

    ``progress`` is called while long work (an evaluation, the final checkpoint) runs, so a
    supervised learner keeps reporting progress; ``on_thread_death`` receives the exception of a
    background checkpoint write that failed; ``faults`` are a test's (zmqrl.runtime.testhooks),
    handed to ingest and the checkpoint writer.
    """

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        *,
        resume: bool = False,
        background_checkpoints: bool = True,
        on_thread_death: Callable[[BaseException], None] | None = None,
        progress: Callable[[], None] = lambda: None,
        faults: Faults | None = None,
    ) -> None:
        self.cfg = cfg = checkpointed_config(cfg)
        self.run_dir = run_dir
        self._progress = progress
        lcfg = cfg.learner
        # With a separate evaluator process the learner keeps one env, only to read the spaces.
        n_eval = 1 if cfg.evaluator.enabled else lcfg.eval_episodes
        self.eval_envs = [make_env(cfg.env, training=False) for _ in range(n_eval)]
        # What the learner accepts (zmqrl.learner.data: transitions or rollouts, and their limits).
        self.spec = learner_spec(cfg, self.eval_envs[0])
        # What this run's actors must share with it (env, spaces, network, n-step): sent with the weights.
        self.fingerprint = run_fingerprint(cfg, self.spec)
        # Replay and its ratio, or the on-policy rollout queue; and how much before the first update.
        self.replay, self.limiter, self.min_size = make_learner_data(cfg, self.spec)
        min_size = self.min_size
        self.agent = make_learner(cfg.agent, self.spec, seed=cfg.run.seed)
        # A test's faulty update (zmqrl.runtime.testhooks) in place of the agent's own, when given.
        self._faulty_update = faults.update(lambda *a: self.agent.update(*a)) if faults is not None else None
        check_weights_fit(
            {name: (a.shape, a.dtype.name) for name, a in self.agent.export_weights().items()},
            cfg.agent.kind,
            self.fingerprint,
            cfg.transport.max_message_mb,
        )
        # Numbers what is published: a new version after updates, above any published before.
        self.numbering = WeightsNumbering()
        self.counters = LearnerCounters()
        self.evals = EvalTracker(lcfg.target_return, lcfg.target_hold)
        self.versions = PublishedVersions(run_dir / VERSION_FILE)
        # Until this learner publishes, the newest version any actor can hold is the highest
        # published before (ingest refuses batches stamped above it, and lags count from it).
        self.published_version = self.versions.highest
        self.nonfinite = NonFiniteUpdates(lcfg.max_nonfinite_updates)
        self.failure: str | None = None  # why the learner gave up (NonFiniteTraining), for the stats
        self.checkpoints = Checkpoints(self, on_thread_death or _reraise, background_checkpoints, faults)
        if resume:
            self.checkpoints.restore()
        # Count the ratio from what replay holds now: a restored snapshot of at least min_replay_size
        # puts the run exactly on the ratio's line, so a resumed learner neither waits for data it
        # already has nor holds the actors back for training it has already done.
        self.limiter.reset(inserted=min(len(self.replay), min_size))
        # Number above anything published before in this run (a previous learner may have got
        # further than its last checkpoint), so actors never see the version go backwards.
        self.numbering.continue_after(self.versions.highest)
        self.ingest = Ingest(
            self.replay,
            self.limiter,
            self.counters,
            spec=self.spec,
            published_version=lambda: self.published_version,
            min_replay_size=min_size,
            max_policy_lag=lcfg.max_policy_lag,
            faults=faults,
        )
        self.launched = time.time()  # "seconds" in the eval history count from here (see start)
        # When the run ends, and why: the loops that drive the trainer ask it after every update.
        self.stop = StopPolicy(lcfg)
        # Where updates run, for agents that say (the built-in ones do); else the configured device.
        log.info("agent %s on %s", cfg.agent.kind, getattr(self.agent, "device", cfg.agent.device))

    @property
    def ended(self) -> str | None:
        """Why the run is at its end (one of the ENDED_* reasons), once something decided it is."""
        return self.stop.ended

    @property
    def evaluates(self) -> bool:
        """The learner evaluates unless a separate evaluator process does."""
        return not self.cfg.evaluator.enabled

    def start(self, launched: float) -> None:
        """Start the training clock; ``launched`` (wall time) is what eval "seconds" count from."""
        self.launched = launched
        self.counters.start_clock()
        self.stop.start(time.monotonic())

    def publish(self) -> Published:
        """The weights to publish now (the role sends them): refused if not finite, and their
        version reserved on disk before any actor can hold it."""
        weights = self.numbering.stamp(self.agent.export_weights())
        self._refuse(refuse_nonfinite_weights, weights.arrays, "publish weights")  # the last guard
        self.versions.reserve(weights.version)  # on disk before any actor can hold it
        self.published_version = weights.version
        return Published(weights, self.counters.samples)

    def can_train(self, timeout: float = 0.0) -> bool:
        """Whether the replay ratio (and min_replay_size) admits the next update."""
        return self.limiter.await_sample(self.cfg.agent.batch_size, timeout)

    def train_step(self) -> UpdateReport:
        """One update, and what falls due at its count for the role: weights to publish, scalars.

        With prioritized replay the update is importance-weighted and the batch's rows get their
        new |TD error| priorities (rows overwritten meanwhile are skipped by the buffer). An
        update the agent skipped for a non-finite loss or gradient is counted (and a run of them
        ends the learner: NonFiniteTraining); a row whose TD error was not finite gets priority 0,
        so what broke the update is rarely drawn again."""
        lcfg = self.cfg.learner
        batch_size = self.cfg.agent.batch_size
        drawn = self.replay.sample(batch_size, self.counters.updates)
        result = (self._faulty_update or self.agent.update)(drawn.batch, drawn.importance)
        self.numbering.changed()  # even if skipped: an update may have changed part of the weights
        if drawn.ids is not None:  # prioritized: the rows' new priorities (agents may defer them)
            td_errors = result.td_errors
            if not np.isfinite(td_errors).all():
                td_errors = np.nan_to_num(td_errors, nan=0.0, posinf=0.0, neginf=0.0)
            self.replay.update_priorities(drawn.ids, td_errors)
        self.limiter.sampled(batch_size)
        self.counters.updates += 1
        updates = self.counters.updates
        self._refuse(self._count_skipped, result.skipped, updates)
        report = UpdateReport(updates)
        if updates % lcfg.sync_interval == 0:
            report.published = self.publish()
        if updates % lcfg.log_interval == 0:  # only now are the update's metrics read
            report.scalars = {**result.metrics, **drawn.metrics}
        return report

    def follow_up(self, report: UpdateReport) -> EvalResult | None:
        """After the role acted on ``report``: the evaluation and the checkpoint due at its count;
        returns the evaluation made, if any (the role logs it)."""
        lcfg, updates = self.cfg.learner, report.updates
        result = None
        if self.evaluates and lcfg.eval_interval and updates % lcfg.eval_interval == 0:
            result = self.evaluate()
        if self.checkpoints.due(bool(lcfg.checkpoint_interval) and updates % lcfg.checkpoint_interval == 0):
            self.save_latest()
        return result

    def evaluate(self) -> EvalResult:
        envs = self.eval_envs
        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + len(self.evals.history) * len(envs)
        result = evaluate(self.agent, envs, seed=seed, tick=self._eval_tick)
        c = self.counters
        _, improved = self.evals.add(
            result, updates=c.updates, samples=c.samples, seconds=time.time() - self.launched
        )
        if improved:
            self.save_best()
        log.info(
            "eval @ %d updates: %.1f ± %.1f over %d episodes%s",
            c.updates,
            result.mean,
            result.std,
            len(envs),
            " (new best)" if improved else "",
        )
        if self.stop.evaluated(self.evals.holding):
            lcfg = self.cfg.learner
            log.info(
                "target return %g held for %d evaluations in a row: ending the run (learner.stop_at_target)",
                lcfg.target_return,
                lcfg.target_hold,
            )
        return result

    def final_evaluation(self, finished: bool) -> EvalResult | None:
        """At the run's end, after the last publish: the final evaluation, if the run reached its
        end and the last one is not of these weights (then the role saves ``latest``, final)."""
        last_eval = self.evals.history[-1]["updates"] if self.evals.history else -1
        if self.evaluates and finished and last_eval != self.counters.updates:
            return self.evaluate()
        return None

    def save_latest(self, final: bool = False) -> None:
        """Checkpoint ``latest`` (the final one on disk before returning), unless the agent's state
        holds a non-finite value: then NonFiniteTraining, and the newest checkpoint stays the last
        finite one."""
        self._refuse(refuse_nonfinite_state, self.agent.state_dict(), "checkpoint")
        if final:
            self.checkpoints.save_latest(final=True, tick=self._progress)
        else:
            self.checkpoints.save_latest()

    def save_best(self) -> None:
        """Checkpoint ``best`` (after an improved evaluation), as guarded as ``save_latest``."""
        self._refuse(refuse_nonfinite_state, self.agent.state_dict(), "checkpoint")
        self.checkpoints.save_best()

    def end_stats(self, state: str) -> dict[str, Any]:
        """What the final stats add about the run's end: ``ended`` (why a finished run ended; a
        stopped or failed one says its state), the record that first held the target, and for a
        resumed learner ``resumed_from`` (the checkpoint, its counts, the replay rows restored)."""
        ended = (self.stop.ended or ENDED_MAX_UPDATES) if state == "finished" else state
        stats: dict[str, Any] = {"ended": ended, "target_held": self.evals.held}
        if self.failure is not None:
            stats["failure"] = self.failure
        if self.checkpoints.resumed_from is not None:
            stats["resumed_from"] = self.checkpoints.resumed_from
        return stats

    def close(self) -> None:
        self.limiter.close()  # an ingest thread waiting for room must not outlive the run
        self.checkpoints.settle()  # nor a checkpoint writer (it would turn exit 1 into SIGABRT)
        for env in self.eval_envs:
            env.close()
        self.versions.close()

    def _refuse(self, check: Callable[..., None], *args: Any) -> None:
        """Run one of the non-finite guards; if it gives up, keep its reason for the final stats
        and say it in the log before the exception ends the learner (exit 1)."""
        try:
            check(*args)
        except NonFiniteTraining as exc:
            if self.failure is None:
                self.failure = str(exc)
            log.error("%s", exc)
            raise

    def _count_skipped(self, skipped: bool, updates: int) -> None:
        """Count a skipped update. Giving up, first finish the checkpoint being written and take
        one that came due meanwhile: skipped updates changed nothing, so the state is the last
        finite one, and the restarted learner resumes from as close to it as checkpoint.interval
        allows (a process exit would kill the writer's thread mid-write)."""
        try:
            self.nonfinite.record(skipped, updates)
        except NonFiniteTraining:
            if self.checkpoints.owed:
                self.save_latest(final=True)  # waits for the write in flight first
            else:
                self.checkpoints.finish_writing(self._progress)
            raise

    def _eval_tick(self) -> bool:
        """Progress during an evaluation (minutes of Atari episodes are not a hang); never abandons it."""
        self._progress()
        return False


def _reraise(exc: BaseException) -> None:
    raise exc
