"""The learner: a receiving thread fills replay while the main loop trains and publishes weights."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl import strictjson, testhooks
from zmqrl.agents import make_agent
from zmqrl.checkpoint import load_resumable, save_checkpoint
from zmqrl.config import Config
from zmqrl.envs import EnvError, action_bounds, make_env, sample_spec
from zmqrl.errors import ConfigError
from zmqrl.evaluation import EVAL_SEED_OFFSET, EvalResult, EvalTracker, evaluate
from zmqrl.fingerprint import run_fingerprint
from zmqrl.guard import ThreadDied, start_guarded
from zmqrl.memory import ReplayMemoryError, available_memory_bytes, format_bytes
from zmqrl.metrics import Logger, TensorBoardLogger, fmt_value
from zmqrl.ratelimit import NoLimit, RateLimiter, make_rate_limiter
from zmqrl.replay import (
    PrioritizedReplay,
    SharedFramesPrioritizedReplay,
    SharedFramesReplay,
    UniformReplay,
)
from zmqrl.roles.link import SupervisorLink, launch_time, socket_limits, transport_security
from zmqrl.snapshots import REPLAY_SNAPSHOT, CheckpointWriter, detached, read_replay_snapshot
from zmqrl.spec import SampleSpec
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages, SampleReceiver, WeightsPublisher
from zmqrl.transport.wire import Fingerprint, SamplesMsg, WeightsMsg
from zmqrl.types import EpisodeStat, TransitionBatch, Weights

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

# File in the run directory: the highest weights version published.
VERSION_FILE = "weights-version"

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


def check_weights_fit(
    spec: Mapping[str, tuple[tuple[int, ...], str]],
    agent_kind: str,
    fingerprint: Fingerprint,
    max_message_mb: int,
) -> None:
    """Refuse a network whose weights message subscribers would drop: ZeroMQ refuses any frame
    larger than ``transport.max_message_mb`` (the limit holds per frame: the header, and each
    array) and drops the connection, so actors and the evaluator would act with their initial
    weights forever without a word. Measured on the message as encoded, from the agent's
    ``weights_spec()`` (zeros of those shapes: exporting would bump the agent's version)."""
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in spec.items()}
    frames = wire.dump(WeightsMsg(weights=Weights(0, arrays), agent=agent_kind, fingerprint=fingerprint))
    sizes = [f.nbytes if isinstance(f, memoryview) else len(f) for f in frames]
    largest, limit = max(sizes), max_message_mb * 2**20
    if largest > limit:
        need = math.ceil(largest / 2**20)
        raise ConfigError(
            f"the weights message ({format_bytes(sum(sizes))}) has a {format_bytes(largest)} frame, "
            f"more than transport.max_message_mb {max_message_mb} ({format_bytes(limit)}): actors and "
            f"the evaluator would drop every weights message; raise transport.max_message_mb to {need} "
            f"or use a smaller network"
        )


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
        link: SupervisorLink | None = None,
    ) -> None:
        self.cfg = cfg
        self.resume = resume  # continue from the run directory's newest readable checkpoint
        self._ctx = ctx or zmq.Context.instance()
        self._link = link  # made by the process main before torch loaded, or here in run()
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
        self.evals = EvalTracker(cfg.learner.target_return, cfg.learner.target_hold)
        self._thread_error: tuple[str, BaseException] | None = None  # a background thread that died
        # Test hook, looked up once: the ingest path must not read the environment per batch.
        self._ingest_fault_armed = testhooks.hook(testhooks.INGEST_FAULT_ONCE) is not None
        # Counts restored from a checkpoint, and the training seconds they took: rates divide
        # counts by the time over which they were made, also across a learner restart.
        self._restored_seconds = 0.0

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
        # What this run's actors must share with it (env, spaces, network, n-step): sent with the weights.
        self.fingerprint = run_fingerprint(cfg, self.spec)
        self.replay = self._make_replay(self.spec)
        bounds = action_bounds(eval_envs[0])
        self.agent = make_agent(
            cfg.agent,
            self.spec,
            seed=cfg.run.seed,
            action_low=bounds.get("action_low"),
            action_high=bounds.get("action_high"),
        )
        check_weights_fit(
            self.agent.weights_spec(), cfg.agent.kind, self.fingerprint, cfg.transport.max_message_mb
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
        self.link = self._link or SupervisorLink(self._ctx, cfg, "learner", 0)
        self.link.attach(self.stop_event)
        self.checkpoints = CheckpointWriter(
            self.run_dir / "checkpoints",
            cfg.checkpoint.keep,
            self._background_died,
            self._slow_checkpoint_hook,
        )
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        # Authentication must be running before a Curve server socket binds.
        self._auth = security.start_authenticator(self._ctx) if security else None
        insecure = cfg.transport.insecure
        samples_sock = weights_sock = None
        ingest: threading.Thread | None = None
        tb: Logger | None = None
        state = "failed"
        try:
            samples_sock, samples_ep = sockets.samples_pull(
                self._ctx, cfg.transport.samples, limits, security=security, insecure=insecure
            )
            weights_sock, weights_ep = sockets.weights_pub(
                self._ctx, cfg.transport.weights, limits, security=security, insecure=insecure
            )
            self.endpoints = {"samples": samples_ep, "weights": weights_ep}
            self.receiver = SampleReceiver(samples_sock, self.spec, BadMessages("learner samples", log))
            self.publisher = WeightsPublisher(weights_sock, cfg.agent.kind, fingerprint=self.fingerprint)
            self._tb = tb = self._logger or TensorBoardLogger(self.run_dir / "tb")
            self.started = time.monotonic()
            self.started_wall = time.time()
            self.launched = launch_time(log)  # "seconds" in the eval history count from here
            self._last_progress = self.started
            self._rate_mark = (self.started, self.updates, self.samples)
            ingest = start_guarded(self._ingest_loop, "ingest", self._background_died)
            self.ready.set()
            log.info("learner up: samples %s, weights %s", samples_ep, weights_ep)
            self._publish()  # first publish: actors adopt the learner's weights
            self._wait_for_replay()
            if not self.stop_event.is_set():
                self._train(eval_envs)
            self._raise_if_thread_died()
            finished = not self.stop_event.is_set()  # max_updates or max_seconds reached
            last_eval = self.evals.history[-1]["updates"] if self.evals.history else -1
            evaluates = not cfg.evaluator.enabled
            if evaluates and finished and last_eval != self.updates:  # the run's final word on quality
                self._evaluate(eval_envs)
            state = "finished" if finished else "stopped"
            self._save_latest(final=True)
        finally:
            self._ingest_stop.set()
            self.limiter.close()  # an ingest thread waiting for room must not outlive the run
            if ingest is not None:
                ingest.join(timeout=5)
            if hasattr(self, "receiver"):
                self.receiver.bad.flush()  # drops still waiting for their rate-limited log line
                self.stats = {**self._final_stats(), "state": state}
                self._write_stats()  # before the goodbye: a supervisor that hears it reads the file
                self.link.final(state, self._counters(), self.endpoints)
            else:
                self.stats = {"state": state}
                self._write_stats()
                self.link.final(state, {}, {})
            if tb is not None:
                tb.close()
            for env in eval_envs:
                env.close()
            if hasattr(self, "publisher"):
                self.publisher.announce_stop(f"learner {state}")
            if samples_sock is not None:
                samples_sock.close(linger=0)
            if weights_sock is not None:
                weights_sock.close(linger=STOP_LINGER_MS)
            self.versions.close()
            self._stop_auth()
            self.link.close()
        return self.stats

    def _background_died(self, exc: BaseException) -> None:
        """A background thread (ingest, checkpoint writer) died: the main loop raises ThreadDied
        at its next housekeeping, so the process exits non-zero and is restarted from its checkpoint."""
        if self._thread_error is None:
            self._thread_error = (threading.current_thread().name, exc)
        self.stop_event.set()
        self.limiter.close()  # wake a trainer waiting on data that will never come

    def _raise_if_thread_died(self) -> None:
        if self._thread_error is not None:
            name, exc = self._thread_error
            raise ThreadDied(f"the learner's {name} thread died: {type(exc).__name__}: {exc}") from exc

    def _slow_checkpoint_hook(self) -> None:
        delay = testhooks.hook(testhooks.SLOW_CHECKPOINT)
        if delay:
            log.warning("test hook: checkpoint write sleeps %s s", delay)
            time.sleep(float(delay))

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
            if self.updates == 1 and testhooks.fire_once(testhooks.DEADLOCK_ONCE):
                log.warning("test hook: the main loop deadlocks now")
                testhooks.block_forever()
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
            return per(
                *args,
                seed=self.cfg.run.seed,
                alpha=rcfg.alpha,
                priority_eps=rcfg.priority_eps,
                max_initial_priority_ratio=rcfg.max_initial_priority_ratio,
            )
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
        if self._ingest_fault_armed and self.samples > 0 and testhooks.fire_once(testhooks.INGEST_FAULT_ONCE):
            raise RuntimeError("test hook: replay add failed")
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
        self._raise_if_thread_died()
        self.publisher.republish_if_due(self.cfg.learner.republish_seconds)
        self.receiver.bad.maybe_flush()  # a burst of drops that stopped is still reported
        self.link.tick(self._counters, self.endpoints)
        now = time.monotonic()
        if now - self._last_progress >= self.cfg.learner.progress_seconds:
            self._last_progress = now
            c = self._counters()
            # With the evaluator on, evaluations are the evaluator's (its log, the supervisor's lines).
            evals = "evaluator" if self.cfg.evaluator.enabled else "eval %s (best %s)"
            log.info(
                "updates %d/%d | samples %d (%.0f/s) | %.0f upd/s | replay %d | v%d | " + evals,
                c["updates"],
                self.cfg.learner.max_updates,
                c["samples"],
                c["samples_per_s"],
                c["updates_per_s"],
                c["replay_size"],
                c["weights_version"],
                *(
                    ()
                    if self.cfg.evaluator.enabled
                    else (fmt_value(c["eval_return"]), fmt_value(c["eval_best"]))
                ),
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
            tb.scalar("charts/episodic_return", ep.ret, self.samples)
            tb.scalar("charts/episodic_length", ep.length, self.samples)
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
        seqs = self.receiver.seqs.totals()
        tb.scalar("learner/lost_batches", seqs["lost_batches"], step)
        tb.scalar("learner/reordered_batches", seqs["reordered_batches"], step)
        tb.scalar("learner/actor_restarts", seqs["actor_restarts"], step)
        if isinstance(self.replay, PrioritizedReplay):
            tb.scalar("replay/clipped_priorities", self.replay.clipped_priorities, step)

    def _evaluate(self, eval_envs: list[Any]) -> EvalResult:
        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + len(self.evals.history) * len(eval_envs)
        result = evaluate(self.agent, eval_envs, seed=seed, tick=self._eval_tick)
        _, improved = self.evals.add(
            result, updates=self.updates, samples=self.samples, seconds=time.time() - self.launched
        )
        # Returns are indexed by env steps (transitions received), the learner's and the evaluator's alike.
        self._tb.scalar("charts/eval_return", result.mean, self.samples)
        self._tb.scalar("charts/eval_return_std", result.std, self.samples)
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

    def _eval_tick(self) -> bool:
        """Progress during an evaluation (minutes of Atari episodes are not a hang); never abandons it."""
        self.link.progress()
        return False

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()

    # ------------------------------------------------------------------ checkpoints and resume
    def _publish(self) -> None:
        weights = self.agent.export_weights()
        self.publisher.publish(weights, env_steps=self.samples)
        self.versions.record(weights.version)

    def _payload(self) -> dict[str, Any]:
        """Everything a resumed learner needs; the caller holds ``self._lock`` so that the counters
        agree with each other (and with a replay snapshot taken under the same lock)."""
        counters = {
            "updates": self.updates,
            "samples": self.samples,
            "batches": self.batches,
            "episodes": self.episodes,
            "seconds": self._training_seconds(),
        }
        return {
            "agent": self.agent.state_dict(),
            "counters": counters,
            "eval": self.evals.state(),
            "replay_rng": self.replay.rng_state(),
            "config": self.cfg.to_dict(),
        }

    def _save_latest(self, final: bool = False) -> None:
        """Checkpoint (and replay snapshot) from copies taken under the lock, written in the
        background; the final one is written before returning."""
        snap: TransitionBatch | None = None
        with self._lock:  # counters and replay snapshot from the same instant
            payload = detached(self._payload())
            if self.cfg.checkpoint.replay:
                row_bytes = replay_footprint(1, self.spec, prioritized=False)  # as saved: dense
                snap = self.replay.snapshot(int(self.cfg.checkpoint.replay_max_mb * 2**20 / row_bytes))
            total_added = self.replay.total_added
        if final:
            # Written while the main thread keeps reporting progress: a final replay snapshot may
            # take longer than supervisor.progress_timeout, and this is not a hang.
            self.checkpoints.write_now(self.updates, payload, snap, total_added, tick=self.link.progress)
        else:
            self.checkpoints.submit(self.updates, payload, snap, total_added)

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
        self._restored_seconds = float(counters.get("seconds", 0.0))
        snapshot = directory / REPLAY_SNAPSHOT
        if self.cfg.checkpoint.replay and snapshot.is_file():
            try:
                found = read_replay_snapshot(snapshot, self.updates)
                if found is not None:
                    batch, total_added = found
                    self.replay.restore(batch, total_added)
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

    def _training_seconds(self) -> float:
        """Seconds over which the counters were made: this process's, plus those restored."""
        return self._restored_seconds + (time.monotonic() - self.started if hasattr(self, "started") else 0.0)

    def _counters(self) -> dict[str, float | int]:
        elapsed = max(self._training_seconds(), 1e-9)
        with self._lock:
            samples, batches, episodes = self.samples, self.batches, self.episodes
            stale_batches, stale_samples = self.stale_batches, self.stale_samples
            lag = float(np.mean(self._recent_lags)) if self._recent_lags else math.nan
        reached = self.evals.reached or {}
        held = self.evals.held or {}
        limits = self.limiter.stats
        seqs = self.receiver.seqs.totals()
        extra: dict[str, float | int] = {}
        if isinstance(self.replay, PrioritizedReplay):
            extra["clipped_priorities"] = self.replay.clipped_priorities
        if self._auth is not None:
            extra["auth_denied"] = self._auth.denied  # Curve handshakes refused (unknown or revoked keys)
        return {
            **extra,
            "lost_batches": seqs["lost_batches"],
            "reordered_batches": seqs["reordered_batches"],
            "actor_restarts": seqs["actor_restarts"],
            "untracked_batches": seqs["untracked_batches"],
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
            "target_held_time": held.get("time", float("nan")),
            "target_held_samples": held.get("samples", float("nan")),
            "target_held_updates": held.get("updates", float("nan")),
        }

    def _final_stats(self) -> dict[str, Any]:
        return {
            **self._counters(),
            "per_actor": self.receiver.seqs.per_actor(),  # which actor feeds the learner, and how well
            "eval_history": self.evals.history,
            "endpoints": self.endpoints,
        }

    def _write_stats(self) -> None:
        path = self.run_dir / "learner-stats.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(strictjson.dumps(self.stats, indent=2))
