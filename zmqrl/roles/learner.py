"""The learner: a receiving thread fills replay while the main loop trains and publishes weights."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl.agents import make_agent
from zmqrl.checkpoint import load_resumable, save_checkpoint, save_periodic
from zmqrl.config import Config
from zmqrl.envs import EnvError, action_bounds, make_env, sample_spec
from zmqrl.evaluation import EVAL_SEED_OFFSET, EvalResult, EvalTracker, evaluate
from zmqrl.memory import ReplayMemoryError, available_memory_bytes, format_bytes
from zmqrl.metrics import Logger, TensorBoardLogger, fmt_value
from zmqrl.ratelimit import NoLimit, RateLimiter, make_rate_limiter
from zmqrl.replay import (
    PrioritizedReplay,
    SharedFramesPrioritizedReplay,
    SharedFramesReplay,
    UniformReplay,
)
from zmqrl.roles.link import SupervisorLink, socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, SampleReceiver, WeightsPublisher
from zmqrl.transport.wire import SamplesMsg, SampleSpec
from zmqrl.types import EpisodeStat, TransitionBatch

# Ingest thread: wait this long for a message before re-checking its stop flag.
INGEST_POLL_MS = 100
# Ingest thread: messages drained per wake-up before yielding the replay lock to the trainer.
INGEST_MAX_DRAIN = 64
# Main loop: updates between (cheap, time-gated) housekeeping calls.
HOUSEKEEPING_EVERY = 8
# How long the closing weights socket may take to deliver the learner's stop announcement.
STOP_LINGER_MS = 500
# Batches over which the reported policy lag is averaged.
RECENT_LAGS = 100
# Longest single wait on the replay-ratio limiter, so waiting threads still heartbeat and see stops.
LIMITER_WAIT_SECONDS = 0.1
# Bytes per slot of prioritized replay's bookkeeping (sum tree leaves and parents, insertion ids).
PRIORITY_BYTES_PER_ROW = 8 + 16 + 8
# Distinct image planes a row adds with replay.share_frames, for the memory estimate: about one
# (the newest frame) plus the stacks at episode starts; measured on Pong: see README.
SHARED_PLANES_PER_ROW = 1.25

# Files in the run directory: the highest weights version published, and the replay snapshot.
VERSION_FILE = "weights-version"
REPLAY_SNAPSHOT = "replay.npz"

log = logging.getLogger("zmqrl.learner")


def replay_footprint(capacity: int, spec: SampleSpec, prioritized: bool, share_frames: bool = False) -> int:
    """Bytes the replay buffer will occupy once full: obs and next_obs, action, reward, discount
    (and the priority bookkeeping). Computed before allocating, so it can be refused up front.
    With shared frames, the planes are an estimate (SHARED_PLANES_PER_ROW distinct planes a row)."""
    obs = int(np.prod(spec.obs_shape, dtype=np.int64)) * np.dtype(spec.obs_dtype).itemsize
    action = int(np.prod(spec.action_shape, dtype=np.int64)) * np.dtype(spec.action_dtype).itemsize
    row = action + 4 + 4 + (PRIORITY_BYTES_PER_ROW if prioritized else 0)
    if not share_frames:
        return capacity * (row + 2 * obs)
    planes = spec.obs_shape[0]
    ids = 2 * planes * 8
    return int(capacity * (row + ids + SHARED_PLANES_PER_ROW * obs / planes))


class PublishedVersions:
    """The highest weights version this run ever published, kept in a small file.

    One ``pwrite`` per publish (no fsync): it survives the learner process crashing, which is what
    a restarted learner must number above; a machine crash takes the actors down too."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.highest = int(os.pread(self._fd, 32, 0).decode().strip() or 0)
        except ValueError:
            self.highest = 0

    def record(self, version: int) -> None:
        if version > self.highest:
            self.highest = version
            os.pwrite(self._fd, f"{version:<20d}\n".encode(), 0)

    def close(self) -> None:
        os.close(self._fd)


class Learner:
    """Owns the agent, the replay buffer, the samples and weights sockets, and the run directory.

    ``run()`` blocks until ``learner.max_updates``, ``learner.max_seconds``, a stop broadcast or
    ``request_stop()``; then it evaluates once more, checkpoints, reports and closes everything.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        ctx: zmq.Context | None = None,
        logger: Logger | None = None,
        run_dir: Path | None = None,
        resume: bool = False,
    ) -> None:
        self.cfg = cfg
        self.resume = resume  # continue from the run directory's newest readable checkpoint
        self._ctx = ctx or zmq.Context.instance()
        self.run_dir = run_dir if run_dir is not None else cfg.run_dir
        self._logger = logger
        self.stop_event = threading.Event()
        self.ready = threading.Event()  # set once sockets are bound and `endpoints` is filled
        self.endpoints: dict[str, str] = {}
        self.stats: dict[str, Any] = {}

        self.updates = 0
        self.samples = 0
        self.batches = 0
        self.episodes = 0
        self.stale_batches = 0  # dropped for exceeding learner.max_policy_lag
        self.stale_samples = 0
        self._lock = threading.Lock()  # guards the counters and queues shared with the ingest thread
        self._episode_queue: deque[EpisodeStat] = deque(maxlen=10_000)
        self._lags: deque[int] = deque(maxlen=10_000)  # policy lag per batch since the last log point
        self._recent_lags: deque[int] = deque(maxlen=RECENT_LAGS)  # for the progress line and stats
        self._replay_ready = threading.Event()
        self._ingest_stop = threading.Event()
        self.evals = EvalTracker(cfg.learner.target_return)

    def request_stop(self) -> None:
        self.stop_event.set()

    # ------------------------------------------------------------------ main
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(cfg.learner.torch_threads)
        # With a separate evaluator process the learner keeps one env, only to read the spaces.
        n_eval = 1 if cfg.evaluator.enabled else cfg.learner.eval_episodes
        eval_envs = [make_env(cfg.env, training=False) for _ in range(n_eval)]
        self.spec = sample_spec(eval_envs[0])
        self.replay = self._make_replay(self.spec)
        bounds = action_bounds(eval_envs[0])
        self.agent = make_agent(
            cfg.agent,
            self.spec,
            seed=cfg.run.seed,
            action_low=bounds.get("action_low"),
            action_high=bounds.get("action_high"),
        )
        if cfg.learner.samples_per_insert is not None and not cfg.transport.samples_buffer_kb:
            log.warning(
                "learner.samples_per_insert is set but transport.samples_buffer_kb is 0: transitions "
                "waiting in the OS's TCP buffers will be inserted long after they were acted (see "
                "policy_lag); consider --set transport.samples_buffer_kb=4 --set transport.samples_hwm=1"
            )
        self.limiter: RateLimiter | NoLimit = make_rate_limiter(
            cfg.learner.samples_per_insert,
            cfg.learner.samples_per_insert_tolerance,
            cfg.learner.min_replay_size,
        )
        self.versions = PublishedVersions(self.run_dir / VERSION_FILE)
        if self.resume:
            self._restore()
        # Count the ratio from what replay holds now: a restored snapshot of at least min_replay_size
        # puts the run exactly on the ratio's line, so a resumed learner neither waits for data it
        # already has nor holds the actors back for training it has already done.
        self.limiter.reset(inserted=min(len(self.replay), cfg.learner.min_replay_size))
        # Number above anything published before in this run (a previous learner may have got
        # further than its last checkpoint), so actors never see the version go backwards.
        self.agent.continue_versions_after(self.versions.highest)
        log.info("agent %s on %s", cfg.agent.kind, self.agent.device)
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        # Authentication must be running before a Curve server socket binds.
        self._auth = security.start_authenticator(self._ctx) if security else None
        insecure = cfg.transport.insecure
        try:
            samples_sock, samples_ep = sockets.samples_pull(
                self._ctx, cfg.transport.samples, limits, security=security, insecure=insecure
            )
        except Exception:
            self._stop_auth()
            raise
        try:
            weights_sock, weights_ep = sockets.weights_pub(
                self._ctx, cfg.transport.weights, limits, security=security, insecure=insecure
            )
        except Exception:
            samples_sock.close(linger=0)
            self._stop_auth()
            raise
        self.endpoints = {"samples": samples_ep, "weights": weights_ep}
        self.receiver = SampleReceiver(samples_sock, self.spec, BadMessages("learner samples", log))
        self.publisher = WeightsPublisher(weights_sock, self.cfg.agent.kind)
        self.link = SupervisorLink(self._ctx, cfg, "learner", 0, self.stop_event)
        logger = self._logger or TensorBoardLogger(self.run_dir / "tb")
        self._tb: Logger = logger
        ingest = threading.Thread(target=self._ingest_loop, name="ingest", daemon=True)
        self.started = time.monotonic()
        self.started_wall = time.time()
        self._last_progress = self.started
        self._rate_mark = (self.started, 0, 0)
        ingest.start()
        self.ready.set()
        log.info("learner up: samples %s, weights %s", samples_ep, weights_ep)
        state = "failed"
        try:
            self._publish()  # first publish: actors adopt the learner's weights
            self._wait_for_replay()
            if not self.stop_event.is_set():
                self._train(eval_envs)
            finished = not self.stop_event.is_set()  # max_updates or max_seconds reached
            last_eval = self.evals.history[-1]["updates"] if self.evals.history else -1
            evaluates = not cfg.evaluator.enabled
            if evaluates and finished and last_eval != self.updates:  # the run's final word on quality
                self._evaluate(eval_envs)
            state = "finished" if finished else "stopped"
            self._save_latest()
        finally:
            self._ingest_stop.set()
            self.limiter.close()  # an ingest thread waiting for room must not outlive the run
            ingest.join(timeout=5)
            self.stats = {**self._final_stats(), "state": state}
            self.link.final(state, self._counters(), self.endpoints)
            self._tb.close()
            for env in eval_envs:
                env.close()
            self.publisher.announce_stop(f"learner {state}")
            samples_sock.close(linger=0)
            weights_sock.close(linger=STOP_LINGER_MS)
            self.versions.close()
            self._stop_auth()
            self.link.close()
            self._write_stats()
        return self.stats

    def _wait_for_replay(self) -> None:
        """Sleep (no spinning) until replay holds ``min_replay_size`` transitions, keeping the
        weights republished and the supervisor informed meanwhile."""
        if len(self.replay) >= self.cfg.learner.min_replay_size:  # e.g. restored from a snapshot
            self._replay_ready.set()
            return
        log.info("waiting for %d transitions before the first update", self.cfg.learner.min_replay_size)
        while not self._replay_ready.wait(timeout=min(0.25, self.cfg.learner.republish_seconds)):
            self._housekeeping()
            if self.stop_event.is_set():
                return

    def _train(self, eval_envs: list[Any]) -> None:
        lcfg = self.cfg.learner
        batch_size = self.cfg.agent.batch_size
        deadline = self.started + lcfg.max_seconds if lcfg.max_seconds else math.inf
        log.info("training: %d updates of batch %d", lcfg.max_updates, batch_size)
        evaluates = lcfg.eval_interval and not self.cfg.evaluator.enabled
        while self.updates < lcfg.max_updates:
            if not self.limiter.await_sample(batch_size, LIMITER_WAIT_SECONDS):
                self._housekeeping()  # ahead of the data: wait for actors, but stay responsive
                if self.stop_event.is_set() or time.monotonic() > deadline:
                    break
                continue
            metrics = self._update(batch_size)
            self.limiter.sampled(batch_size)
            self.updates += 1
            if self.updates % lcfg.sync_interval == 0:
                self._publish()
            if self.updates % lcfg.log_interval == 0:
                self._log_scalars(metrics)
            if evaluates and self.updates % lcfg.eval_interval == 0:
                self._evaluate(eval_envs)
            if lcfg.checkpoint_interval and self.updates % lcfg.checkpoint_interval == 0:
                self._save_latest()
            if self.updates % HOUSEKEEPING_EVERY == 0:
                self._housekeeping()
                if self.stop_event.is_set() or time.monotonic() > deadline:
                    break
        self._publish()

    def _update(self, batch_size: int) -> dict[str, float]:
        """One agent update; with prioritized replay, importance-weighted, and the batch's rows get
        their new |TD error| priorities (rows overwritten meanwhile are skipped by the buffer)."""
        replay = self.replay
        if not isinstance(replay, PrioritizedReplay):
            return self.agent.update(replay.sample(batch_size))
        beta = self._beta()
        batch, ids, importance = replay.sample_prioritized(batch_size, beta)
        metrics = self.agent.update(batch, importance)
        replay.update_priorities(ids, self.agent.last_td_errors)
        metrics["per_beta"] = beta
        metrics["per_importance_min"] = float(importance.min())
        return metrics

    def _beta(self) -> float:
        """Importance-sampling exponent, annealed linearly from replay.beta to 1 (full correction
        by the end of training, when unbiased updates matter most)."""
        rcfg = self.cfg.replay
        frac = min(1.0, self.updates / rcfg.beta_updates)
        return rcfg.beta + frac * (1.0 - rcfg.beta)

    def _make_replay(self, spec: SampleSpec) -> UniformReplay:
        """The configured buffer, after checking that it fits: printed so people see the cost."""
        rcfg = self.cfg.replay
        if rcfg.share_frames and len(spec.obs_shape) < 2:
            raise EnvError(
                f"replay.share_frames needs image observations (planes, height, width); {self.cfg.env.id}'s "
                f"are {list(spec.obs_shape)}: set replay.share_frames: false"
            )
        need = replay_footprint(rcfg.capacity, spec, rcfg.prioritized, rcfg.share_frames)
        available = available_memory_bytes()
        log.info(
            "replay: %s%s, %d transitions of obs %s %s: %s%s when full (%s available)",
            "prioritized" if rcfg.prioritized else "uniform",
            ", each image plane stored once" if rcfg.share_frames else "",
            rcfg.capacity,
            spec.obs_dtype,
            list(spec.obs_shape),
            "about " if rcfg.share_frames else "",
            format_bytes(need),
            format_bytes(available) if available is not None else "unknown",
        )
        if available is not None and need > available:
            raise ReplayMemoryError(
                f"replay.capacity {rcfg.capacity} needs {format_bytes(need)} but this machine has "
                f"{format_bytes(available)} available; lower replay.capacity (e.g. --set replay.capacity="
                f"{max(1, int(rcfg.capacity * available / need * 0.8))})"
            )
        args = (rcfg.capacity, spec.obs_shape, spec.obs_dtype, spec.action_shape, spec.action_dtype)
        if rcfg.prioritized:
            per = SharedFramesPrioritizedReplay if rcfg.share_frames else PrioritizedReplay
            return per(*args, seed=self.cfg.run.seed, alpha=rcfg.alpha, priority_eps=rcfg.priority_eps)
        uniform = SharedFramesReplay if rcfg.share_frames else UniformReplay
        return uniform(*args, seed=self.cfg.run.seed)

    # ------------------------------------------------------------------ ingest thread
    def _ingest_loop(self) -> None:
        while not self._ingest_stop.is_set():
            if not self.receiver.wait(INGEST_POLL_MS):
                continue
            for _ in range(INGEST_MAX_DRAIN):
                msg = self.receiver.recv_nowait()
                if msg is False:
                    break
                if msg is not None:
                    self._accept(msg)  # type: ignore[arg-type]

    def _accept(self, msg: SamplesMsg) -> None:
        n = msg.batch.size
        # Replay-ratio backpressure: while the learner is behind, hold this batch (and stop reading
        # the socket), so the actors' queues fill and their sends block.
        while not self.limiter.await_insert(n, LIMITER_WAIT_SECONDS):
            if self._ingest_stop.is_set():
                return
        lag = self.publisher.version - msg.weights_version  # measured when it would enter replay
        max_lag = self.cfg.learner.max_policy_lag
        stale = max_lag is not None and lag > max_lag  # acted by a policy too old to learn from
        with self._lock:  # replay and counters change together, so a checkpoint sees them agree
            if stale:
                self.stale_batches += 1
                self.stale_samples += n
            else:
                if isinstance(self.replay, PrioritizedReplay):
                    self.replay.add_with_priorities(msg.batch, msg.priorities)
                else:
                    self.replay.add(msg.batch)
                self.limiter.inserted(n)
                self.samples += n
                self.batches += 1
            self.episodes += len(msg.episodes)
            self._episode_queue.extend(msg.episodes)
            self._lags.append(lag)
            self._recent_lags.append(lag)
        if len(self.replay) >= self.cfg.learner.min_replay_size:
            self._replay_ready.set()

    # ------------------------------------------------------------------ reporting
    def _housekeeping(self) -> None:
        self.publisher.republish_if_due(self.cfg.learner.republish_seconds)
        self.link.tick(self._counters, self.endpoints)
        now = time.monotonic()
        if now - self._last_progress >= self.cfg.learner.progress_seconds:
            self._last_progress = now
            c = self._counters()
            log.info(
                "updates %d/%d | samples %d (%.0f/s) | %.0f upd/s | replay %d | v%d | eval %s (best %s)",
                c["updates"],
                self.cfg.learner.max_updates,
                c["samples"],
                c["samples_per_s"],
                c["updates_per_s"],
                c["replay_size"],
                c["weights_version"],
                fmt_value(c["eval_return"]),
                fmt_value(c["eval_best"]),
            )

    def _log_scalars(self, metrics: dict[str, float]) -> None:
        step = self.updates
        tb = self._tb
        for key, value in metrics.items():
            tb.scalar(f"losses/{key}", value, step)
        with self._lock:
            episodes = list(self._episode_queue)
            self._episode_queue.clear()
            lags = list(self._lags)
            self._lags.clear()
        for ep in episodes:
            tb.scalar("charts/episodic_return", ep.ret, step)
            tb.scalar("charts/episodic_length", ep.length, step)
        if lags:
            tb.scalar("learner/policy_lag_min", float(np.min(lags)), step)
            tb.scalar("learner/policy_lag_mean", float(np.mean(lags)), step)
            tb.scalar("learner/policy_lag_max", float(np.max(lags)), step)
        tb.scalar("learner/stale_batches", self.stale_batches, step)
        limits = self.limiter.stats
        tb.scalar("replay/samples_per_insert", limits["ratio"], step)
        tb.scalar("perf/sample_blocked_seconds", limits["sample_blocked_seconds"], step)
        tb.scalar("perf/insert_blocked_seconds", limits["insert_blocked_seconds"], step)
        now = time.monotonic()
        t0, u0, s0 = self._rate_mark
        if now > t0:
            tb.scalar("perf/updates_per_s", (self.updates - u0) / (now - t0), step)
            tb.scalar("perf/samples_per_s", (self.samples - s0) / (now - t0), step)
        self._rate_mark = (now, self.updates, self.samples)
        tb.scalar("replay/size", len(self.replay), step)
        tb.scalar("replay/megabytes", self.replay.nbytes / 2**20, step)
        tb.scalar("learner/weights_version", self.publisher.version, step)
        tb.scalar("learner/bad_messages", self.receiver.bad.count, step)

    def _evaluate(self, eval_envs: list[Any]) -> EvalResult:
        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + len(self.evals.history) * len(eval_envs)
        result = evaluate(self.agent, eval_envs, seed=seed)
        _, improved = self.evals.add(
            result, updates=self.updates, samples=self.samples, seconds=time.monotonic() - self.started
        )
        self._tb.scalar("charts/eval_return", result.mean, self.updates)
        self._tb.scalar("charts/eval_return_std", result.std, self.updates)
        if improved:
            with self._lock:
                payload = self._payload()
            save_checkpoint(self.run_dir / "checkpoints" / "best", payload)
        log.info(
            "eval @ %d updates: %.1f ± %.1f over %d episodes%s",
            self.updates,
            result.mean,
            result.std,
            len(eval_envs),
            " (new best)" if improved else "",
        )
        return result

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()

    # ------------------------------------------------------------------ checkpoints and resume
    def _publish(self) -> None:
        weights = self.agent.export_weights()
        self.publisher.publish(weights)
        self.versions.record(weights.version)

    def _payload(self) -> dict[str, Any]:
        """Everything a resumed learner needs; the caller holds ``self._lock`` so that the counters
        agree with each other (and with a replay snapshot taken under the same lock)."""
        counters = {
            "updates": self.updates,
            "samples": self.samples,
            "batches": self.batches,
            "episodes": self.episodes,
        }
        return {
            "agent": self.agent.state_dict(),
            "counters": counters,
            "eval": self.evals.state(),
            "replay_rng": self.replay.rng_state(),
            "config": self.cfg.to_dict(),
        }

    def _save_latest(self) -> None:
        directory = self.run_dir / "checkpoints"
        snap: TransitionBatch | None = None
        with self._lock:  # counters and replay snapshot from the same instant
            payload = self._payload()
            if self.cfg.checkpoint.replay:
                row_bytes = replay_footprint(1, self.spec, prioritized=False)  # as saved: dense
                snap = self.replay.snapshot(int(self.cfg.checkpoint.replay_max_mb * 2**20 / row_bytes))
        save_periodic(directory, self.updates, payload, self.cfg.checkpoint.keep)
        if snap is not None:
            self._save_replay(directory / REPLAY_SNAPSHOT, snap)

    def _save_replay(self, path: Path, snap: TransitionBatch) -> None:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                updates=np.int64(self.updates),
                total_added=np.int64(self.replay.total_added),
                **snap._asdict(),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _restore(self) -> None:
        directory = self.run_dir / "checkpoints"
        try:
            path, payload = load_resumable(directory, log)
        except FileNotFoundError:
            log.warning("asked to resume, but %s holds no readable checkpoint: starting fresh", directory)
            return
        self.agent.load_state_dict(payload["agent"])
        counters = payload["counters"]
        self.updates = int(counters["updates"])
        self.samples = int(counters["samples"])
        self.batches = int(counters.get("batches", 0))
        self.episodes = int(counters["episodes"])
        self.evals.load_state(payload.get("eval", {}))
        if payload.get("replay_rng"):
            self.replay.set_rng_state(payload["replay_rng"])
        restored = 0
        snapshot = directory / REPLAY_SNAPSHOT
        if self.cfg.checkpoint.replay and snapshot.is_file():
            try:
                with np.load(snapshot, allow_pickle=False) as data:
                    if int(data["updates"]) == self.updates:
                        batch = TransitionBatch(*(data[name] for name in TransitionBatch._fields))
                        self.replay.restore(batch, int(data["total_added"]))
                        restored = batch.size
                    else:
                        log.warning("replay snapshot is from another checkpoint; starting with empty replay")
            except (OSError, ValueError, KeyError) as exc:
                log.warning("replay snapshot %s unreadable (%s); starting with empty replay", snapshot, exc)
        log.info(
            "resumed from %s: %d updates, %d samples, weights version %d, %d transitions in replay",
            path,
            self.updates,
            self.samples,
            self.agent.weights_version,
            restored,
        )

    def _counters(self) -> dict[str, float | int]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        with self._lock:
            samples, batches, episodes = self.samples, self.batches, self.episodes
            stale_batches, stale_samples = self.stale_batches, self.stale_samples
            lag = float(np.mean(self._recent_lags)) if self._recent_lags else math.nan
        reached = self.evals.reached or {}
        limits = self.limiter.stats
        return {
            "policy_lag": lag,
            "stale_batches": stale_batches,
            "stale_samples": stale_samples,
            "samples_per_insert": limits["ratio"],
            "sample_blocked_seconds": limits["sample_blocked_seconds"],
            "insert_blocked_seconds": limits["insert_blocked_seconds"],
            "updates": self.updates,
            "samples": samples,
            "batches": batches,
            "episodes": episodes,
            "replay_size": len(self.replay),
            "replay_mb": self.replay.nbytes / 2**20,
            "weights_version": self.publisher.version,
            "bad_messages": self.receiver.bad.count,
            "updates_per_s": self.updates / elapsed,
            "samples_per_s": samples / elapsed,
            "duration": elapsed,
            "eval_return": self.evals.last,
            "eval_best": self.evals.best_or_nan,
            "target_time": reached.get("time", float("nan")),
            "target_samples": reached.get("samples", float("nan")),
            "target_updates": reached.get("updates", float("nan")),
        }

    def _final_stats(self) -> dict[str, Any]:
        return {**self._counters(), "eval_history": self.evals.history, "endpoints": self.endpoints}

    def _write_stats(self) -> None:
        path = self.run_dir / "learner-stats.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.stats, indent=2, default=float))
