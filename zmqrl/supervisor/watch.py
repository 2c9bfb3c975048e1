"""The watch-only supervisor behind ``zmqrl supervise``: starts nothing, hears everything.

Under docker compose, Kubernetes or by hand, something else starts the learner, the actors and
the evaluator and restarts them when they die (compose ``restart:``, a Deployment). This
supervisor gives such a run what ``launch`` gives its own: the table and progress lines, the
dead / hung verdicts (which it reports, since it cannot restart what it did not start), the stop
broadcast when the learner finishes or on Ctrl-C / SIGTERM, and the final summary. With
``learner.stop_at_target`` and an evaluator, it passes the evaluator's "target held" on to the
learner in its control heartbeats, as ``launch`` does (``Reporter.end_request``).

Processes announce themselves by heartbeat; a slot (role, id) whose heartbeats come from a new pid
is a restarted process rejoining, and counts as a restart. The slots the config expects (the
learner, ``actor.num_actors`` actors, the evaluator if enabled) are always kept; beyond them at
most ``supervisor.extra_slots`` more (scaled replicas with ids past ``num_actors``), so heartbeats
under random ids cannot grow the table without bound: the rest are dropped and counted.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from zmqrl.config import Config
from zmqrl.supervisor.liveness import FINAL_STATES
from zmqrl.supervisor.oversight import EXIT_OK, STOP_REPEAT_SECONDS, Oversight
from zmqrl.supervisor.summary import Slot
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.wire import HeartbeatMsg, WireError

# Seconds between "still waiting for the learner" lines.
WAITING_LINE_SECONDS = 10.0

log = logging.getLogger("zmqrl.supervisor")


class Watcher(Oversight):
    """Tracks the processes that heartbeat to it; restarts none of them."""

    command = "supervise"

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self._reported: dict[str, str] = {}  # slot name -> the verdict last reported for it
        self._expected = {"learner-0", *(f"actor-{i}" for i in range(cfg.actor.num_actors))}
        if cfg.evaluator.enabled:
            self._expected.add("evaluator-0")
        # Heartbeats from senders past the slot bound: counted, logged at a limited rate, dropped.
        self.unknown_senders = BadMessages("supervisor slots", log)

    def _run(self) -> int:
        t = self.cfg.transport
        self._say(
            f"watching run {self.run_dir}: heartbeats on {t.heartbeat}, control on {t.control}; "
            "this supervisor starts and restarts nothing (leave restarts to compose, Kubernetes or systemd)"
        )
        scfg = self.cfg.supervisor
        next_progress = self._clock() + scfg.progress_seconds
        next_waiting = self._clock() + WAITING_LINE_SECONDS
        while self._signal is None:
            self._pump(100)
            if self.reporter.end_request is not None:  # learner.stop_at_target, the evaluator held it
                self.beacon.request_end(self.reporter.end_request)
            now = self._clock()
            learner = self.slots.get("learner-0")
            if learner is not None:
                self.phase = "running"
            elif now >= next_waiting:
                next_waiting = now + WAITING_LINE_SECONDS
                self._say(f"no heartbeat from a learner yet (roles connect to {t.heartbeat})")
            if learner is not None and learner.last is not None and learner.last.state == "finished":
                self._say("learner finished; stopping actors")
                self._let_evaluator_finish()
                return EXIT_OK
            for slot in self.slots.values():
                self._judge(slot, now)
            if now >= next_progress:
                next_progress = now + scfg.progress_seconds
                self._progress(self._actors_alive(now))
        return EXIT_OK

    def _slot_for(self, hb: HeartbeatMsg, now: float) -> Slot | None:
        if hb.role not in ("learner", "actor", "evaluator"):
            return None
        name = f"{hb.role}-{hb.id}"
        slot = self.slots.get(name)
        if slot is None:
            extra = sum(1 for n in self.slots if n not in self._expected)
            if name not in self._expected and extra >= self.cfg.supervisor.extra_slots:
                self.unknown_senders.record(
                    WireError(
                        f"heartbeat from {name} (pid {hb.pid}) dropped: {extra} processes beyond the "
                        "config's roles are tracked already (supervisor.extra_slots)"
                    )
                )
                return None
            slot = self._new_slot(hb.role, hb.id, now, pid=hb.pid)
            self._say(f"{name} joined (pid {hb.pid}, state {hb.state})")
        elif slot.live.pid != hb.pid:
            slot.live = slot.live.renew(now, hb.pid)
            slot.restart_times.append(now)
            self._reported.pop(name, None)
            self._say(f"{name} rejoined as a new process (pid {hb.pid}): restarted by its orchestrator")
        return slot

    def _judge(self, slot: Slot, now: float) -> None:
        """Report (once per verdict) a slot that went silent, hung or left; and its recovery."""
        last = slot.last
        if last is not None and last.state in FINAL_STATES:
            verdict = f"left ({last.state})"
        else:
            verdict = slot.live.verdict(now, self.cfg.supervisor) or ""
        kind = re.sub(r"\d+(\.\d+)?", "#", verdict)  # the verdict, not its growing number of seconds
        if kind == self._reported.get(slot.name, ""):
            return
        self._reported[slot.name] = kind
        if not verdict:
            self._say(f"{slot.name} (pid {slot.live.pid}) is healthy again")
        elif verdict.startswith("left"):
            self._say(f"{slot.name} (pid {slot.live.pid}) {verdict}")
        else:
            self._say(
                f"warning: {slot.name} (pid {slot.live.pid}) {verdict}; this supervisor did not start it "
                "and cannot restart it: its orchestrator's health check (`zmqrl health`) should"
            )

    def _own_counts(self) -> dict[str, int]:
        return {"dropped_heartbeats": self.unknown_senders.count}

    def _actors_alive(self, now: float) -> int:
        return sum(1 for s in self._live_slots(now) if s.role == "actor")

    def _let_evaluator_finish(self) -> None:
        """The evaluator scores the learner's final weights before it leaves: wait up to stop_grace."""
        evaluator = self.slots.get("evaluator-0")
        if evaluator is None:
            return
        deadline = self._clock() + self.cfg.supervisor.stop_grace
        while self._clock() < deadline and self._signal is None:
            if evaluator.last is not None and evaluator.last.state in FINAL_STATES:
                return
            self._pump(100)

    def _live_slots(self, now: float) -> list[Slot]:
        return [
            s
            for s in self.slots.values()
            if not (s.last is not None and s.last.state in FINAL_STATES)
            and s.live.verdict(now, self.cfg.supervisor) is None
        ]

    def _shutdown(self) -> None:
        """Broadcast stop until every process still heartbeating has said goodbye, or stop_grace."""
        reason = "interrupted" if self._signal is not None else "run finished"
        started = self._clock()
        deadline = started + self.cfg.supervisor.stop_grace
        next_stop = 0.0
        while self._live_slots(self._clock()) and self._clock() < deadline:
            now = self._clock()
            if now >= next_stop:
                self.beacon.stop(reason)
                next_stop = now + STOP_REPEAT_SECONDS
            self._pump(50)
        left = self._live_slots(self._clock())
        if left:
            names = ", ".join(s.name for s in left)
            self._say(
                f"warning: {names} did not confirm the stop within {self.cfg.supervisor.stop_grace:.0f} s"
            )
        self.beacon.stop(reason)
        self.unknown_senders.flush()
        self.shutdown_seconds = self._clock() - started
