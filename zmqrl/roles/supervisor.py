"""The supervisor behind ``zmqrl launch``: starts the learner and N actors as OS processes,
watches their heartbeats and exits, restarts failed actors, and shuts everything down in order.

Shutdown order: stop broadcast (repeated, PUB/SUB may drop the first) -> after ``stop_grace``
SIGTERM -> after another ``stop_grace`` SIGKILL. Children run in their own sessions so a
terminal's Ctrl-C reaches only the supervisor, which then stops them in that order; on Linux they
also get SIGTERM from the kernel if the supervisor itself dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import zmq

from zmqrl.config import Config, save_config
from zmqrl.metrics import fmt_value
from zmqrl.roles.link import SUPERVISED_ENV, socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages, ControlPublisher, HeartbeatReceiver
from zmqrl.transport.wire import HeartbeatMsg

# Seconds between repeated stop broadcasts while children are still alive.
STOP_REPEAT_SECONDS = 0.5
# Lines of a failed child's log shown on the console.
LOG_TAIL_LINES = 15
# Exit codes of `zmqrl launch`.
EXIT_OK, EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 130, 143
_PR_SET_PDEATHSIG = 1

log = logging.getLogger("zmqrl.supervisor")


class _Console:
    """The supervisor's output stream. A closed terminal or pipe must never stop the supervisor
    from shutting its children down, so write errors are swallowed."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


class RestartPolicy:
    """When to restart a failed slot: exponential backoff, and at most ``max_restarts`` within any
    ``window`` seconds (a crash loop should end in a clear warning, not burn the machine)."""

    def __init__(self, max_restarts: int, window: float, backoff: float, backoff_max: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.backoff_max = backoff_max

    def delay(self, restart_times: list[float], now: float) -> float | None:
        """Seconds to wait before the next restart, or None when the slot used up its restarts."""
        recent = sum(1 for t in restart_times if now - t < self.window)
        if recent >= self.max_restarts:
            return None
        return min(self.backoff_max, self.backoff * 2.0**recent)


@dataclass
class Child:
    """One slot (learner, or actor i) and the process currently filling it."""

    role: str
    id: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    last_seen: float = 0.0
    last: HeartbeatMsg | None = None
    exit_code: int | None = None
    retired: bool = False  # no longer watched: finished on its own, or out of restarts
    heard: bool = False  # this process has sent a heartbeat (until then it is still starting up)
    restart_at: float | None = None  # clock() at which a failed slot is started again
    restart_times: list[float] = field(default_factory=list)  # clock() of this slot's restarts

    @property
    def restarts(self) -> int:
        return len(self.restart_times)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.id}"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:  # not Linux: rely on the control channel instead
        pass


class Supervisor:
    def __init__(
        self,
        cfg: Config,
        *,
        out: TextIO | None = None,
        ctx: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        launched: float | None = None,
        resume: bool = False,
    ) -> None:
        self.cfg = cfg
        self.resume = resume  # the learner continues from the run directory's checkpoints
        self._launched = launched  # when `zmqrl launch` began (Unix s): "after launch" counts from it
        self.run_dir = cfg.run_dir
        self._out = _Console(out or sys.stdout)
        self._ctx = ctx or zmq.Context.instance()
        self._clock = clock
        self.children: dict[str, Child] = {}
        scfg = cfg.supervisor
        self.restart_policy = RestartPolicy(
            scfg.max_restarts, scfg.restart_window, scfg.restart_backoff, scfg.restart_backoff_max
        )
        self._signal: int | None = None
        self.shutdown_seconds = float("nan")
        self._next_control_beat = 0.0
        self.summary: dict[str, Any] = {}
        # The learner's counters when the evaluator first reported the target return.
        self.target_at_learner: dict[str, Any] | None = None
        # Per slot: (pid, heartbeat time, counter value) at the previous progress line.
        self._rate_marks: dict[str, tuple[int, float, float]] = {}

    # ------------------------------------------------------------------ entry point
    def run(self) -> int:
        self.launched = self._launched if self._launched is not None else time.time()
        self._t0 = self._clock()
        limits = socket_limits(self.cfg)
        security = transport_security(self.cfg)
        auth = security.start_authenticator(self._ctx) if security else None
        insecure = self.cfg.transport.insecure
        try:
            hb_sock, hb_ep = sockets.heartbeat_pull(
                self._ctx, self.cfg.transport.heartbeat, limits, security=security, insecure=insecure
            )
            try:
                ctl_sock, ctl_ep = sockets.control_pub(
                    self._ctx, self.cfg.transport.control, limits, security=security, insecure=insecure
                )
            except Exception:
                hb_sock.close(linger=0)
                raise
        except Exception:
            if auth is not None:
                auth.stop()
            raise
        self.heartbeats = HeartbeatReceiver(hb_sock, BadMessages("supervisor heartbeats", log))
        self.control = ControlPublisher(ctl_sock)
        self.cfg = replace(self.cfg, transport=replace(self.cfg.transport, heartbeat=hb_ep, control=ctl_ep))
        self._install_signals()
        code = EXIT_FAILED
        try:
            code = self._run()
        finally:
            self._shutdown()
            hb_sock.close(linger=0)
            ctl_sock.close(linger=0)
            if auth is not None:
                auth.stop()
        self._report()
        if self._signal == signal.SIGINT:
            return EXIT_SIGINT
        if self._signal == signal.SIGTERM:
            return EXIT_SIGTERM
        return code

    def _run(self) -> int:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "learner-stats.json").unlink(missing_ok=True)  # never report a previous run
        config_path = self.run_dir / "config.yaml"
        save_config(self.cfg, config_path)
        self._say(f"run directory {self.run_dir} | TensorBoard: tensorboard --logdir {self.run_dir / 'tb'}")
        learner = self._spawn("learner", 0)
        t = self.cfg.transport
        # With fixed ports the actors start right away (they block until the learner binds), which
        # hides one process start-up; with port 0 they must learn the learner's real ports first.
        early = not (_asks_os_for_port(t.samples) or _asks_os_for_port(t.weights))
        if early:
            self._spawn_actors()
        endpoints = self._await_learner(learner)
        if endpoints is None:
            return EXIT_FAILED
        if not early:
            self.cfg = replace(
                self.cfg, transport=replace(t, samples=endpoints["samples"], weights=endpoints["weights"])
            )
            save_config(self.cfg, config_path)
            self._spawn_actors()
        self._say(
            f"learner on {endpoints['samples']} (samples) / {endpoints['weights']} (weights); "
            f"{self.cfg.actor.num_actors} actor(s) started"
        )
        return self._monitor()

    # ------------------------------------------------------------------ processes
    def _spawn_actors(self) -> None:
        """Every role that consumes the learner's weights: the actors and, if enabled, the evaluator."""
        for i in range(self.cfg.actor.num_actors):
            self._spawn("actor", i)
        if self.cfg.evaluator.enabled:
            self._spawn("evaluator", 0)

    def _spawn(self, role: str, index: int, previous: Child | None = None) -> Child:
        log_path = self.run_dir / "logs" / f"{role}-{index}.log"
        cmd = [sys.executable, "-m", "zmqrl", role, str(self.run_dir / "config.yaml")]
        if role == "actor":
            cmd += ["--id", str(index)]
            if previous is not None:
                cmd.append("--replacement")
        elif previous is not None or self.resume:  # learner: its checkpoint; evaluator: best so far
            cmd.append("--resume")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", SUPERVISED_ENV: "1"}
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        now = self._clock()
        child = Child(role, index, proc, log_path, started=now, last_seen=now)
        if previous is not None:
            child.restart_times = [*previous.restart_times, now]
            child.last = previous.last
        self.children[child.name] = child
        log.debug("started %s pid %d", child.name, proc.pid)
        return child

    def _await_learner(self, learner: Child) -> dict[str, str] | None:
        """Wait for the learner's first heartbeat, which carries the endpoints it really bound."""
        deadline = self._clock() + self.cfg.supervisor.startup_timeout
        while self._clock() < deadline and self._signal is None:
            self._pump(100)
            if learner.last is not None and {"samples", "weights"} <= learner.last.info.keys():
                return dict(learner.last.info)
            if learner.proc.poll() is not None:
                learner.exit_code = learner.proc.returncode
                self._say(f"error: the learner exited with code {learner.exit_code} before it was ready")
                self._show_tail(learner)
                return None
        if self._signal is None:
            self._say(
                f"error: no heartbeat from the learner within {self.cfg.supervisor.startup_timeout:.0f} s "
                f"(see {learner.log_path})"
            )
        return None

    def _monitor(self) -> int:
        scfg = self.cfg.supervisor
        next_progress = self._clock() + scfg.progress_seconds
        while self._signal is None:
            self._pump(100)
            now = self._clock()
            learner = self.children["learner-0"]
            if learner.restart_at is None and learner.proc.poll() == 0:
                learner.exit_code = 0
                self._say("learner finished; stopping actors")
                self._let_evaluator_finish()
                return EXIT_OK
            if not self._check_learner(learner, now):
                return EXIT_FAILED
            for child in list(self.children.values()):
                if child.role != "learner" and not child.retired:
                    self._check_actor(child, now)
            if now >= next_progress:
                next_progress = now + scfg.progress_seconds
                self._progress()
        return EXIT_FAILED

    def _let_evaluator_finish(self) -> None:
        """The evaluator saw the learner's end on the weights channel and is scoring the final
        weights: give it up to ``stop_grace`` to finish before the stop broadcast cuts it short."""
        evaluator = self.children.get("evaluator-0")
        if evaluator is None or evaluator.retired or evaluator.proc.poll() is not None:
            return
        self._say("waiting for the evaluator's final evaluation")
        deadline = self._clock() + self.cfg.supervisor.stop_grace
        while evaluator.proc.poll() is None and self._clock() < deadline and self._signal is None:
            self._pump(100)

    def _silent_too_long(self, child: Child, now: float) -> bool:
        """A starting process (python, torch, env) gets ``startup_timeout`` for its first
        heartbeat; after that, ``heartbeat_timeout`` of silence means it is hung."""
        scfg = self.cfg.supervisor
        limit = scfg.heartbeat_timeout if child.heard else max(scfg.startup_timeout, scfg.heartbeat_timeout)
        return now - child.last_seen > limit

    def _check_learner(self, learner: Child, now: float) -> bool:
        """Replace a crashed or silent learner from its latest checkpoint; False once it used up its
        restarts (the run then stops with an error)."""
        scfg = self.cfg.supervisor
        if learner.restart_at is not None:
            if now >= learner.restart_at:
                self._spawn("learner", 0, previous=learner)
            return True
        rc = learner.proc.poll()
        if rc is None and self._silent_too_long(learner, now):
            self._say(
                f"warning: no heartbeat from the learner for {now - learner.last_seen:.0f} s; killing it"
            )
            learner.proc.kill()
            rc = learner.proc.wait()
        if rc is None:
            return True
        learner.exit_code = rc
        self._show_tail(learner)
        delay = self.restart_policy.delay(learner.restart_times, now)
        checkpoints = self.run_dir / "checkpoints"
        if delay is None:
            self._say(
                f"error: the learner failed (exit code {rc}) {scfg.max_restarts + 1} times within "
                f"{scfg.restart_window:.0f} s; stopping the run. Its latest checkpoint is in {checkpoints}: "
                f"fix the cause (see {learner.log_path}), then `zmqrl launch --resume {self.run_dir}`"
            )
            return False
        self._say(
            f"warning: the learner exited with code {rc}; restarting it from its latest checkpoint "
            f"in {delay:.1f} s"
        )
        learner.restart_at = now + delay
        return True

    def _check_actor(self, child: Child, now: float) -> None:
        scfg = self.cfg.supervisor
        rc = child.proc.poll()
        if rc is None and self._silent_too_long(child, now):
            self._say(
                f"warning: {child.name} (pid {child.proc.pid}) silent for "
                f"{now - child.last_seen:.0f} s; killing"
            )
            child.proc.kill()
            child.proc.wait()
            rc = child.proc.returncode
        if rc is None:
            return
        if child.restart_at is not None:  # already failed: waiting out the backoff
            if now >= child.restart_at:
                self._spawn(child.role, child.id, previous=child)
            return
        child.exit_code = rc
        if rc == 0:  # it finished on its own (e.g. actor.max_steps): nothing to repair
            child.retired = True
            self._say(f"{child.name} finished")
            return
        delay = self.restart_policy.delay(child.restart_times, now)
        if delay is None:
            child.retired = True
            self._say(
                f"warning: {child.name} exited with code {rc} and already restarted {scfg.max_restarts} "
                f"times within {scfg.restart_window:.0f} s; the run goes on without it (degraded)"
            )
            self._show_tail(child)
            return
        self._say(f"warning: {child.name} exited with code {rc}; restarting in {delay:.1f} s")
        self._show_tail(child)
        child.restart_at = now + delay

    def _pump(self, timeout_ms: int) -> None:
        """Heartbeat the roles (time-gated), then receive theirs and attribute each to the process
        currently in its slot."""
        now = self._clock()
        if now >= self._next_control_beat:
            self._next_control_beat = now + self.cfg.supervisor.heartbeat_interval
            self.control.heartbeat()
        for hb in self.heartbeats.recv_all(timeout_ms):
            child = self.children.get(f"{hb.role}-{hb.id}")
            if child is None or hb.pid != child.proc.pid:
                continue  # a stranger, or a previous incarnation's last words
            child.last = hb
            child.last_seen = self._clock()
            child.heard = True
            if hb.role == "evaluator" and self.target_at_learner is None:
                reached = hb.counters.get("target_time", math.nan)
                learner = self.children.get("learner-0")
                if math.isfinite(reached) and learner is not None and learner.last is not None:
                    # The evaluator knows weights versions, not env steps: take the learner's
                    # counters from the moment the evaluator said so (a heartbeat apart at most).
                    self.target_at_learner = dict(learner.last.counters)

    # ------------------------------------------------------------------ shutdown
    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, _frame: Any) -> None:
            if self._signal is None:
                self._signal = signum
                self._say(
                    f"{signal.Signals(signum).name} received: stopping every process "
                    "(press Ctrl-C again to kill them now)"
                )
            else:
                for child in self.children.values():
                    if child.proc.poll() is None:
                        child.proc.kill()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _alive(self) -> list[Child]:
        return [c for c in self.children.values() if c.proc.poll() is None]

    def _shutdown(self) -> None:
        grace = self.cfg.supervisor.stop_grace
        reason = "interrupted" if self._signal is not None else "run finished"
        started = self._clock()
        deadline_term = started + grace
        deadline_kill = started + 2 * grace
        termed = False
        next_stop = 0.0
        while self._alive():
            now = self._clock()
            if now >= next_stop:
                self.control.stop(reason)
                next_stop = now + STOP_REPEAT_SECONDS
            if now >= deadline_kill:
                for child in self._alive():
                    self._say(f"warning: {child.name} ignored SIGTERM; killing")
                    child.proc.kill()
                break
            if now >= deadline_term and not termed:
                termed = True
                for child in self._alive():
                    self._say(f"warning: {child.name} did not stop within {grace:.0f} s; sending SIGTERM")
                    child.proc.terminate()
            self._pump(50)
        for child in self.children.values():
            child.proc.wait()
            if child.exit_code is None:
                child.exit_code = child.proc.returncode
        self._pump(200)  # final heartbeats that arrived while we reaped
        self.shutdown_seconds = self._clock() - started

    # ------------------------------------------------------------------ reporting
    def _say(self, text: str) -> None:
        elapsed = self._clock() - self._t0
        print(f"[{elapsed:7.1f}s] {text}", file=self._out, flush=True)

    def _show_tail(self, child: Child) -> None:
        try:
            lines = child.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            return
        self._say(f"last lines of {child.log_path}:")
        for line in lines:
            print(f"    {line}", file=self._out)

    def _progress(self) -> None:
        learner = self.children["learner-0"].last
        c = dict(learner.counters) if learner else {}
        evaluator = self.children.get("evaluator-0")
        if evaluator is not None and evaluator.last is not None:
            c["eval_return"] = evaluator.last.counters.get("eval_return", math.nan)
            c["eval_best"] = evaluator.last.counters.get("eval_best", math.nan)
        actors = [ch for ch in self.children.values() if ch.role == "actor"]
        alive = sum(1 for a in actors if a.proc.poll() is None)
        steps_per_s = sum(self._recent_rate(a, "steps", "steps_per_s") for a in actors)
        updates_per_s = self._recent_rate(self.children["learner-0"], "updates", "updates_per_s")
        self._say(
            f"updates {int(c.get('updates', 0))}/{self.cfg.learner.max_updates} | "
            f"samples {int(c.get('samples', 0))} | {updates_per_s:.0f} upd/s | "
            f"eval {fmt_value(c.get('eval_return'))} (best {fmt_value(c.get('eval_best'))}) | "
            f"actors {alive}/{len(actors)}, {steps_per_s:.0f} steps/s"
        )

    def _recent_rate(self, child: Child, counter: str, fallback: str) -> float:
        """``counter`` per second since the previous progress line (the counters' own rates are
        lifetime averages, which hide a slowdown); the lifetime rate for a new process."""
        if child.last is None:
            return 0.0
        now, value = child.last.time, float(child.last.counters.get(counter, 0.0))
        mark = self._rate_marks.get(child.name)
        self._rate_marks[child.name] = (child.proc.pid, now, value)
        if mark is None or mark[0] != child.proc.pid or now <= mark[1]:
            return float(child.last.counters.get(fallback, 0.0))
        return max(0.0, (value - mark[2]) / (now - mark[1]))

    def _report(self) -> None:
        learner_stats = self._learner_stats()
        actors = sorted((c for c in self.children.values() if c.role == "actor"), key=lambda c: c.id)
        rows = []
        for a in actors:
            c = a.last.counters if a.last else {}
            rows.append(
                {
                    "actor_id": a.id,
                    "samples": int(c.get("samples", 0)),
                    "samples_per_s": float(c.get("samples_per_s", 0)),
                    "duration": float(c.get("duration", 0.0)),
                    "steps": int(c.get("steps", 0)),
                    "episodes": int(c.get("episodes", 0)),
                    "weights_version": int(c.get("weights_version", 0)),
                    "epsilon": float(c.get("epsilon", float("nan"))),
                    "restarts": a.restarts,
                    "exit_code": a.exit_code,
                    "state": a.last.state if a.last else "unknown",
                }
            )
        self.summary = {
            "launched": self.launched,
            "wall_seconds": self._clock() - self._t0,
            "shutdown_seconds": self.shutdown_seconds,
            "learner": {**learner_stats, "restarts": self.children["learner-0"].restarts}
            if "learner-0" in self.children
            else learner_stats,
            "actors": rows,
        }
        evaluator = self.children.get("evaluator-0")
        if evaluator is not None:
            ev = self._evaluator_stats()
            self.summary["evaluator"] = {
                **ev,
                "restarts": evaluator.restarts,
                "exit_code": evaluator.exit_code,
            }
        out = self._out
        print("\n== learner ==", file=out)
        if learner_stats:
            ls = learner_stats
            print(
                f"updates {int(ls.get('updates', 0))} | samples received {int(ls.get('samples', 0))} | "
                f"{ls.get('updates_per_s', 0.0):.1f} updates/s | "
                f"{ls.get('samples_per_s', 0.0):.1f} samples/s | "
                f"duration {ls.get('duration', 0.0):.1f} s | bad messages {int(ls.get('bad_messages', 0))}",
                file=out,
            )
            extra = [
                f"{key.replace('_', ' ')} {fmt_value(ls[key])}"
                for key in (
                    "policy_lag",
                    "samples_per_insert",
                    "sample_blocked_seconds",
                    "insert_blocked_seconds",
                )
                if key in ls and math.isfinite(float(ls[key])) and float(ls[key]) > 0
            ]
            if int(ls.get("stale_batches", 0)):
                extra.append(f"stale batches dropped {int(ls['stale_batches'])}")
            if extra:
                print(" | ".join(extra), file=out)
            if self.cfg.evaluator.enabled:
                self._report_evaluator(out)
            else:
                print(
                    f"eval return: last {fmt_value(ls.get('eval_return'))}, "
                    f"best {fmt_value(ls.get('eval_best'))}",
                    file=out,
                )
            target = None if self.cfg.evaluator.enabled else self.cfg.learner.target_return
            when = ls.get("target_time")
            if target is not None and isinstance(when, (int, float)) and math.isfinite(when):
                print(
                    f"target return {target:g} first reached {when - self.launched:.1f} s after launch "
                    f"({int(ls['target_samples'])} env steps, {int(ls['target_updates'])} updates)",
                    file=out,
                )
            elif target is not None:
                print(f"target return {target:g} not reached", file=out)
        else:
            print("no stats (the learner did not report)", file=out)
        print("\n== actors ==", file=out)
        print(
            f"{'actor_id':>8} {'samples':>10} {'samples/sec':>12} {'duration':>9} {'episodes':>9} "
            f"{'weights_v':>9} {'restarts':>8}",
            file=out,
        )
        for r in rows:
            print(
                f"{r['actor_id']:>8} {r['samples']:>10} {r['samples_per_s']:>12.1f} {r['duration']:>8.1f}s "
                f"{r['episodes']:>9} {r['weights_version']:>9} {r['restarts']:>8}",
                file=out,
            )
        print(
            f"\nshutdown took {self.summary['shutdown_seconds']:.2f} s; "
            f"stats in {self.run_dir / 'stats.json'}",
            file=out,
            flush=True,
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "stats.json").write_text(json.dumps(self.summary, indent=2, default=str))

    def _evaluator_stats(self) -> dict[str, Any]:
        """The evaluator's own final stats file if it wrote one, else its last heartbeat."""
        path = self.run_dir / "evaluator-stats.json"
        evaluator = self.children.get("evaluator-0")
        if path.is_file():
            try:
                return dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        return dict(evaluator.last.counters) if evaluator and evaluator.last else {}

    def _report_evaluator(self, out: Any) -> None:
        ev = self._evaluator_stats()
        print(
            f"evaluator: {int(ev.get('evaluations', 0))} evaluations, "
            f"last {fmt_value(ev.get('eval_return'))} "
            f"(weights v{int(ev.get('evaluated_version', 0))}), best {fmt_value(ev.get('eval_best'))}",
            file=out,
        )
        target = self.cfg.learner.target_return
        when = ev.get("target_time")
        if target is not None and isinstance(when, (int, float)) and math.isfinite(when):
            at = self.target_at_learner or {}
            where = (
                f" (about {int(at['samples'])} env steps, {int(at['updates'])} updates)"
                if {"samples", "updates"} <= at.keys()
                else ""
            )
            print(
                f"target return {target:g} first reached {when - self.launched:.1f} s after launch{where}",
                file=out,
            )
        elif target is not None:
            print(f"target return {target:g} not reached", file=out)

    def _learner_stats(self) -> dict[str, Any]:
        """The learner's own final stats file if it wrote one, else its last heartbeat."""
        path = self.run_dir / "learner-stats.json"
        learner = self.children.get("learner-0")
        if path.is_file():
            try:
                return dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        return dict(learner.last.counters) if learner and learner.last else {}


def previous_run_state(run_dir: Path) -> str | None:
    """How the last run in ``run_dir`` ended ("finished", "stopped", "failed"), if it left
    checkpoints to continue from; None otherwise."""
    stats = run_dir / "learner-stats.json"
    if not (run_dir / "checkpoints" / "latest").is_file() or not stats.is_file():
        return None
    try:
        return str(json.loads(stats.read_text()).get("state"))
    except (OSError, ValueError):
        return None


def _asks_os_for_port(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1] in ("0", "*")
