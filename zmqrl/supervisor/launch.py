"""The supervisor behind ``zmqrl launch``: starts the learner and N actors as OS processes,
watches their heartbeats and exits, restarts what fails, and shuts everything down in order.

Each process is judged by ``supervisor/liveness.py``: dead (silent, or stopped by a signal), hung
(alive but no progress) or healthy; dead and hung ones are killed and replaced, with a backoff that
only a crash loop makes grow. How children are started and stopped: ``supervisor/processes.py``.
With ``learner.stop_at_target`` and an evaluator, the evaluator decides when the target is held and
the supervisor tells the learner in its control heartbeats (``Reporter.end_request``); the learner
then ends the run as at its end, and the rest stops as after any finished learner.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import replace
from typing import Any

from zmqrl.config import Config, save_config
from zmqrl.runtime.health import STOP_REASON_INFO_KEY
from zmqrl.runtime.link import END_ACTORS_DONE, LEARNER_FINISHED
from zmqrl.supervisor import asked_endpoints, restarts
from zmqrl.supervisor.liveness import os_stopped
from zmqrl.supervisor.oversight import EXIT_FAILED, EXIT_OK, EXIT_OPERATOR, Oversight
from zmqrl.supervisor.processes import (
    last_error_line,
    log_tail,
    reap,
    role_command,
    signal_tree,
    start_child,
    stop_in_order,
)
from zmqrl.supervisor.restarts import ENDED, KILLED, RestartPolicy, classify, ended_by_signal
from zmqrl.supervisor.summary import Slot, given_up_line, restart_line
from zmqrl.transport.wire import HeartbeatMsg

# Lines of a failed child's log shown on the console.
LOG_TAIL_LINES = 15

log = logging.getLogger("zmqrl.supervisor")


class Supervisor(Oversight):
    def __init__(self, cfg: Config, *, resume: bool = False, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.resume = resume  # the learner continues from the run directory's checkpoints
        # The endpoints as asked (port 0 before the OS chose one): a later resume asks for them again.
        self._asked = cfg.transport
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restart_policy = RestartPolicy.from_config(cfg.supervisor)
        self._actors_done_asked = False  # END_ACTORS_DONE sent to the learner

    def _run(self) -> int:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "learner-stats.json").unlink(missing_ok=True)  # never report a previous run
        self._save_config()
        self._say(f"run directory {self.run_dir} | TensorBoard: tensorboard --logdir {self.run_dir / 'tb'}")
        learner = self._spawn("learner", 0)
        t = self.cfg.transport
        # With fixed ports the actors start right away (they block until the learner binds), which
        # hides one process start-up; with port 0 they must learn the learner's real ports first.
        # The evaluator starts once the learner is up: it has nothing to score before the first
        # weights, and a policy that plays with torch would load it beside the learner's start,
        # which the run's first update waits for.
        early = not (_asks_os_for_port(t.samples) or _asks_os_for_port(t.weights))
        if early:
            self._spawn_actors()
        endpoints = self._await_learner(learner)
        if endpoints is None:
            return EXIT_OPERATOR if learner.exit_code == restarts.EXIT_OPERATOR else EXIT_FAILED
        if not early:
            self.cfg = replace(
                self.cfg, transport=replace(t, samples=endpoints["samples"], weights=endpoints["weights"])
            )
            self._save_config()
            self._spawn_actors()
        if self.cfg.evaluator.enabled:
            self._spawn("evaluator", 0)
        self._say(
            f"learner on {endpoints['samples']} (samples) / {endpoints['weights']} (weights); "
            f"{self.cfg.actor.num_actors} actor(s) started"
        )
        self.phase = "running"
        return self._monitor()

    def _save_config(self) -> None:
        """``config.yaml`` with the real endpoints (what every role it starts reads), and beside it
        what port 0 resolved to (zmqrl/supervisor/asked_endpoints.py: a resume asks for 0 again)."""
        save_config(self.cfg, self.run_dir / "config.yaml")
        asked_endpoints.record(self.run_dir, self._asked, self.cfg.transport)

    # ------------------------------------------------------------------ processes
    def _spawn_actors(self) -> None:
        for i in range(self.cfg.actor.num_actors):
            self._spawn("actor", i)

    def _spawn(self, role: str, index: int, previous: Slot | None = None) -> Slot:
        log_path = self.run_dir / "logs" / f"{role}-{index}.log"
        config_path = self.run_dir / "config.yaml"
        cmd = role_command(role, index, config_path, replacement=previous is not None, resume=self.resume)
        proc = start_child(cmd, log_path, self.launched, role)
        now = self._clock()
        slot = self._new_slot(role, index, now, pid=proc.pid)
        slot.log_path = log_path
        if previous is not None:
            slot.live = previous.live.renew(now, proc.pid)
            slot.restart_times = [*previous.restart_times, now]
            slot.crashes = previous.crashes
        self.procs[slot.name] = proc
        log.debug("started %s pid %d", slot.name, proc.pid)
        return slot

    def _slot_for(self, hb: HeartbeatMsg, now: float) -> Slot | None:
        slot = self.slots.get(f"{hb.role}-{hb.id}")
        proc = self.procs.get(f"{hb.role}-{hb.id}")
        if slot is None or proc is None or hb.pid != proc.pid:
            return None
        return slot

    def _await_learner(self, learner: Slot) -> dict[str, str] | None:
        """Wait for the heartbeat that carries the endpoints the learner really bound; meanwhile it
        is judged like any process (so a learner stopped or hung in start-up is not waited on)."""
        scfg = self.cfg.supervisor
        proc = self.procs[learner.name]
        while self._signal is None:
            self._pump(100)
            if learner.last is not None and {"samples", "weights"} <= learner.last.info.keys():
                return dict(learner.last.info)
            if reap(proc) is not None:
                learner.exit_code = proc.returncode
                learner.end = "failed"
                error = last_error_line(learner.log_path)
                self.failure = f"the learner exited with code {learner.exit_code} before it was ready"
                self.failure += f": {error.removeprefix('error: ')}" if error else ""
                self._say(f"error: {self.failure}")
                self._show_tail(learner)
                return None
            now = self._clock()
            learner.live.observe_os_state(os_stopped(proc.pid), now)
            reason = learner.live.verdict(now, scfg)
            if reason is not None:
                self.failure = f"the learner is not starting ({reason})"
                self._say(f"error: {self.failure}; see {learner.log_path}")
                signal_tree(proc)
                proc.wait()
                learner.exit_code = proc.returncode
                learner.end = "killed"
                return None
        return None

    def _monitor(self) -> int:
        scfg = self.cfg.supervisor
        next_progress = self._clock() + scfg.progress_seconds
        while self._signal is None:
            self._pump(100)
            if self.reporter.end_request is not None:  # learner.stop_at_target, the evaluator held it
                self.beacon.request_end(self.reporter.end_request)
            now = self._clock()
            learner = self.slots["learner-0"]
            if learner.restart_at is None and reap(self.procs["learner-0"]) == 0:
                return self._learner_ended(learner)
            for slot in list(self.slots.values()):
                if slot.retired:
                    continue
                if not self._check(slot, now) and slot.role == "learner":
                    self.failure = "the learner was given up"
                    return EXIT_OPERATOR if slot.exit_code == restarts.EXIT_OPERATOR else EXIT_FAILED
            code = self._every_actor_retired()
            if code is not None:
                return code
            if now >= next_progress:
                next_progress = now + scfg.progress_seconds
                alive = sum(1 for s in self.slots.values() if s.role == "actor" and self._alive_proc(s))
                self._progress(alive)
        return EXIT_FAILED

    def _learner_ended(self, learner: Slot) -> int:
        """The learner exited 0: it finished the run (its budget, its target, every actor done),
        or it stopped though nobody in the run asked it to (it lost this supervisor)."""
        learner.exit_code = 0
        state = learner.last.state if learner.last is not None else "finished"
        if state == "stopped":
            learner.end = "stopped"
            error = last_error_line(learner.log_path)
            self.failure = "the learner stopped without being asked"
            self._say(f"error: {self.failure} ({error or f'see {learner.log_path}'}); stopping the run")
            return EXIT_FAILED
        learner.end = "finished"
        self._say("learner finished; stopping actors")
        self._let_evaluator_finish()
        return EXIT_OK

    def _every_actor_retired(self) -> int | None:
        """Once no actor slot is left running: the learner is asked to end the run when some of
        them reached actor.max_steps (no data will come any more); when every one was given up,
        the run ends here, non-zero, with one line. None while actors run, or when they stopped
        (on the learner's announced end, which the learner's own exit follows)."""
        actors = [s for s in self.slots.values() if s.role == "actor"]
        if not actors or not all(s.retired for s in actors):
            return None
        if any(s.end == "finished" for s in actors):
            if not self._actors_done_asked:
                self._actors_done_asked = True
                self._say("every actor is done (actor.max_steps): asking the learner to end the run")
                self.beacon.request_end(END_ACTORS_DONE)
            return None
        if not all(s.end == "given up" for s in actors):  # stopped: the learner's end is under way
            return None
        reasons = "; ".join(
            f"{s.name}: {s.end} after {s.restarts} restart(s), exit code {s.exit_code}"
            + (f", last error: {last_error_line(s.log_path)}" if last_error_line(s.log_path) else "")
            for s in sorted(actors, key=lambda s: s.id)
        )
        self.failure = "every actor was given up"
        self._say(
            f"error: every actor was given up, nothing can feed the learner ({reasons}); stopping the run"
        )
        operator = all(s.exit_code == restarts.EXIT_OPERATOR for s in actors)
        return EXIT_OPERATOR if operator else EXIT_FAILED

    def _alive_proc(self, slot: Slot) -> bool:
        return reap(self.procs[slot.name]) is None

    def _let_evaluator_finish(self) -> None:
        """The evaluator saw the learner's end on the weights channel and is scoring the final
        weights: give it up to ``stop_grace`` to finish before the stop broadcast cuts it short."""
        evaluator = self.slots.get("evaluator-0")
        if evaluator is None or evaluator.retired or not self._alive_proc(evaluator):
            return
        self._say("waiting for the evaluator's final evaluation")
        deadline = self._clock() + self.cfg.supervisor.stop_grace
        proc = self.procs[evaluator.name]
        while reap(proc) is None and self._clock() < deadline and self._signal is None:
            self._pump(100)

    def _check(self, slot: Slot, now: float) -> bool:
        """Judge one slot: replace its process if it died, is dead or hung (zmqrl/supervisor/
        restarts.py decides when); False when the slot is given up (for the learner that ends
        the run)."""
        scfg = self.cfg.supervisor
        proc = self.procs[slot.name]
        if slot.restart_at is not None:  # failed: waiting out the backoff
            if now >= slot.restart_at:
                self._spawn(slot.role, slot.id, previous=slot)
            return True
        rc = reap(proc)
        killed_for: str | None = None
        stopped = False
        if rc is None:
            slot.live.observe_os_state(os_stopped(proc.pid), now)
            reason = slot.live.verdict(now, scfg)
            if reason is None:
                return True
            stopped = slot.live.stopped_since is not None
            self._say(f"warning: {slot.name} (pid {proc.pid}) {reason}; killing it")
            signal_tree(proc)
            rc = proc.wait()
            killed_for = reason if rc != 0 else None
        slot.exit_code = rc
        death = classify(
            rc,
            killed_for=killed_for,
            stopped=stopped,
            useful=slot.live.useful,
            healthy=slot.live.healthy(scfg),
        )
        if death.kind == ENDED:  # it ended on its own (actor.max_steps, a stop), perhaps as it was killed
            if slot.role != "learner":  # a learner that exited 0 has ended the run: _monitor stops the rest
                self._retire_ended(slot)
            return True
        decision = self.restart_policy.decide(slot.crashes, death, now)
        slot.end = death.kind
        if death.kind != KILLED:  # somebody else's kill says nothing its log could explain
            self._show_tail(slot)
        if decision.delay is None:
            slot.retired = True
            slot.end = "given up"
            self._say(given_up_line(slot, death, decision, self.run_dir, last_error_line(slot.log_path)))
            return False
        self._say(restart_line(slot, death, decision))
        slot.restart_at = now + decision.delay
        return True

    def _retire_ended(self, slot: Slot) -> None:
        """An actor or the evaluator exited 0: finished (actor.max_steps), or stopped as the
        learner's end or a stop asked it to. Retired either way: only a requested stop or its own
        end retires a role (a signal from outside exits 128 + N, and it is restarted)."""
        slot.retired = True
        slot.end = "finished" if slot.last is not None and slot.last.state == "finished" else "stopped"
        learner = self.slots.get("learner-0")
        last = learner.last if learner is not None else None
        # When the learner ended first, its own line comes first, then the summary; a role that left
        # on its end (heard on the weights channel before the supervisor hears it) adds nothing.
        reason = slot.last.info.get(STOP_REASON_INFO_KEY) if slot.last is not None else None
        left_with_learner = reason == LEARNER_FINISHED
        if (last is None or last.state not in ("finished", "stopped")) and not left_with_learner:
            self._say(f"{slot.name} {slot.end}")

    # ------------------------------------------------------------------ shutdown
    def _second_signal(self) -> None:
        for proc in self.procs.values():
            signal_tree(proc)

    def _shutdown(self) -> None:
        reason = "interrupted" if self._signal is not None else "run finished"
        started = self._clock()
        stop_in_order(
            self.procs,
            self.cfg.supervisor.stop_grace,
            broadcast_stop=lambda: self.beacon.stop(reason),
            pump=self._pump,
            say=self._say,
            clock=self._clock,
        )
        for slot in self.slots.values():
            proc = self.procs[slot.name]
            proc.wait()
            reap(proc)  # what is left of its process group
            if slot.exit_code is None:
                slot.exit_code = proc.returncode
            if slot.end is None or (slot.restart_at is None and not slot.retired):
                slot.end = _end_at_shutdown(slot, proc.returncode)
        self._pump(200)  # final heartbeats that arrived while we reaped
        self.shutdown_seconds = self._clock() - started

    def _show_tail(self, slot: Slot) -> None:
        lines = log_tail(slot.log_path, LOG_TAIL_LINES) if slot.log_path is not None else None
        if lines is None:
            return
        self._say(f"last lines of {slot.log_path}:")
        for line in lines:
            print(f"    {line}", file=self._out)


def _end_at_shutdown(slot: Slot, code: int) -> str:
    """How a process still running when the run stopped ended: stopped (it obeyed the stop),
    finished (its own end came first), or killed (it had to be signalled), in the summary's words."""
    if code == 0:
        return "finished" if slot.last is not None and slot.last.state == "finished" else "stopped"
    signum = ended_by_signal(code)
    if signum is not None:
        return "killed at shutdown"
    return f"failed (exit code {code})"


def _asks_os_for_port(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1] in ("0", "*")
