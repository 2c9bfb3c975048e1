"""What the learner reports: its counters, TensorBoard scalars, progress lines and final stats."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl import strictjson
from zmqrl.agents import store_label
from zmqrl.evaluator.greedy import EvalResult
from zmqrl.metrics import Logger, fmt_value
from zmqrl.transport.sequence import SequenceCounts

if TYPE_CHECKING:
    from zmqrl.learner.trainer import Trainer

STATS_FILE = "learner-stats.json"
# Keys of a replay draw's metrics (zmqrl.core.Sampled.metrics) among an update's: logged as replay/.
REPLAY_DRAW_PREFIX = "per_"
# The samples streams' counts among the counters: lost, reordered, restarted and untracked.
SEQUENCE_COUNTERS = ("lost_batches", "reordered_batches", "actor_restarts", "untracked_batches")
# When the run first reached (and first held) its target: ``target_time``, ``target_held_samples``...
TARGET_KEYS = ("time", "samples", "updates")
# Seconds each side of the replay-ratio limiter waited (zmqrl.replay.ratelimit's stats).
LIMITER_BLOCKED = ("sample_blocked_seconds", "insert_blocked_seconds")
# The learner/ scalars of docs/metrics.md: counters, written at each log point and at the run's end.
LEARNER_COUNTERS = (
    "stale_batches",
    "weights_version",
    "bad_messages",
    "nonfinite_updates",
    "lost_batches",
    "reordered_batches",
    "actor_restarts",
)
# The TensorBoard tags read from a log point's counters snapshot, each with its counter.
SNAPSHOT_TAGS = (
    ("replay/samples_per_insert", "samples_per_insert"),
    *((f"perf/{key}", key) for key in LIMITER_BLOCKED),
    ("replay/size", "replay_size"),
    ("replay/megabytes", "replay_mb"),
)

log = logging.getLogger("zmqrl.learner")


class LearnerReports:
    """Reads the trainer (and the receiving side's counts) into reports; changes nothing.

    ``bad_messages`` and ``seqs`` are the receiving side's: the samples socket's malformed
    messages and per-actor sequence accounting (serial mode has its own tracker and no drops);
    ``extra`` adds role-specific counts (e.g. Curve handshakes refused).
    """

    def __init__(
        self,
        trainer: Trainer,
        tb: Logger,
        *,
        bad_messages: Callable[[], int],
        seqs: SequenceCounts,
        extra: Callable[[], dict[str, float | int]] = dict,
    ) -> None:
        self.trainer = trainer
        self.tb = tb
        self._bad_messages = bad_messages
        self.seqs = seqs
        self._extra = extra
        self._store = store_label(trainer.cfg.agent)  # what the progress line calls its store
        self._rate_mark = (time.monotonic(), trainer.counters.updates, trainer.counters.samples)
        self._last_progress = time.monotonic()

    def counters(self) -> dict[str, float | int]:
        t = self.trainer
        c = t.counters
        elapsed = max(c.training_seconds(), 1e-9)
        with c.lock:
            samples, batches, episodes = c.samples, c.batches, c.episodes
            stale_batches, stale_samples = c.stale_batches, c.stale_samples
        limits = t.limiter.stats
        seqs = self.seqs.totals()
        return {
            **t.replay.stats(),
            **self._extra(),
            **{k: seqs[k] for k in SEQUENCE_COUNTERS},
            **{f"target_{k}": (t.evals.reached or {}).get(k, math.nan) for k in TARGET_KEYS},
            **{f"target_held_{k}": (t.evals.held or {}).get(k, math.nan) for k in TARGET_KEYS},
            **{k: limits[k] for k in LIMITER_BLOCKED},
            "samples_per_insert": limits["ratio"],
            "policy_lag": c.recent_lag(),
            "stale_batches": stale_batches,
            "stale_samples": stale_samples,
            "updates": c.updates,
            "samples": samples,
            "batches": batches,
            "episodes": episodes,
            "replay_size": len(t.replay),
            "replay_capacity": t.replay.capacity,  # replay's rows, or the on-policy queue's env steps
            "replay_mb": t.replay.nbytes / 2**20,
            "weights_version": t.published_version,
            "bad_messages": self._bad_messages(),
            "nonfinite_updates": t.nonfinite.total,
            "checkpoints_deferred": t.checkpoints.deferred,  # came due mid-write: taken right after it
            "updates_per_s": c.updates / elapsed,
            "samples_per_s": samples / elapsed,
            "duration": elapsed,
            "evaluations": len(t.evals.history),  # the dashboard's eval history grows when this does
            "eval_return": t.evals.last,
            "eval_best": t.evals.best_or_nan,
        }

    def final_stats(self, state: str, endpoints: dict[str, str]) -> dict[str, Any]:
        return {
            **self.counters(),
            "per_actor": self.seqs.per_actor(),  # which actor feeds the learner, and how well
            "eval_history": self.trainer.evals.history,
            "endpoints": endpoints,
            "state": state,
        }

    def progress_line_if_due(self) -> None:
        t = self.trainer
        now = time.monotonic()
        if now - self._last_progress < t.cfg.learner.progress_seconds:
            return
        self._last_progress = now
        c = self.counters()
        # With the evaluator on, evaluations are the evaluator's (its log, the supervisor's lines).
        separate = t.cfg.evaluator.enabled
        evals = "evaluator" if separate else "eval %s (best %s)"
        log.info(
            "updates %d/%d | samples %d (%.0f/s) | %.0f upd/s | %s %d | v%d | " + evals,
            c["updates"],
            t.cfg.learner.max_updates,
            c["samples"],
            c["samples_per_s"],
            c["updates_per_s"],
            self._store,
            c["replay_size"],
            c["weights_version"],
            *(() if separate else (fmt_value(c["eval_return"]), fmt_value(c["eval_best"]))),
        )

    def log_eval(self, result: EvalResult | None) -> None:
        """An evaluation's return (if one was made), indexed by env steps (transitions received),
        as the evaluator's are."""
        if result is not None:
            samples = self.trainer.counters.samples
            self.tb.scalar("charts/eval_return", result.mean, samples)
            self.tb.scalar("charts/eval_return_std", result.std, samples)

    def log_scalars(self, metrics: dict[str, float]) -> None:
        """Every learner tag of docs/metrics.md: returns at env steps, the rest at updates.

        ``metrics`` is the update's (the agent's loss terms) plus the replay draw's, whose keys
        start with ``per_`` (prioritized experience replay): those go under ``replay/``."""
        t = self.trainer
        step = t.counters.updates
        tb = self.tb
        for key, value in metrics.items():
            space = "replay" if key.startswith(REPLAY_DRAW_PREFIX) else "losses"
            tb.scalar(f"{space}/{key}", value, step)
        lags = self._log_episodes()
        samples = t.counters.samples
        if lags:
            for name, reduce in (("min", np.min), ("mean", np.mean), ("max", np.max)):
                tb.scalar(f"learner/policy_lag_{name}", float(reduce(lags)), step)
        c = self.counters()  # one snapshot for the log point's tags (learner/ ones included)
        for tag, key in SNAPSHOT_TAGS:
            tb.scalar(tag, c[key], step)
        now = time.monotonic()
        t0, u0, s0 = self._rate_mark
        if now > t0:
            tb.scalar("perf/updates_per_s", (step - u0) / (now - t0), step)
            tb.scalar("perf/samples_per_s", (samples - s0) / (now - t0), step)
        self._rate_mark = (now, step, samples)
        for key, value in t.replay.stats().items():
            tb.scalar(f"replay/{key}", value, step)
        self.log_counters(c)

    def _log_episodes(self) -> list[int]:
        """The episodes finished since the last report, at env steps; returns the policy lags of
        the batches received meanwhile."""
        episodes, lags = self.trainer.counters.take_for_report()
        samples = self.trainer.counters.samples
        for ep in episodes:
            self.tb.scalar("charts/episodic_return", ep.ret, samples)
            self.tb.scalar("charts/episodic_length", ep.length, samples)
        return lags

    def log_end(self) -> None:
        """At the run's end: the episodes since the last log point (a run that never trained, its
        replay never full, had none on its curves) and the learner/ counts."""
        self._log_episodes()
        self.log_counters()

    def log_counters(self, c: dict[str, float | int] | None = None) -> None:
        """The learner/ counts at the current update: at each log point, and once more at the
        run's end, so that TensorBoard's last values are the final stats' (a run whose last
        batches arrived after its last log point, or that stopped between two, would otherwise
        end its curves short)."""
        c = self.counters() if c is None else c
        for key in LEARNER_COUNTERS:
            self.tb.scalar(f"learner/{key}", c[key], self.trainer.counters.updates)


def write_stats(run_dir: Path, stats: dict[str, Any]) -> None:
    path = run_dir / STATS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(strictjson.dumps(stats, indent=2))
