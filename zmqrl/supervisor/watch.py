"""The watch-only supervisor behind ``zmqrl supervise``: starts nothing, hears everything.

Under docker compose, Kubernetes or by hand, something else starts the learner, the actors and
the evaluator and restarts them when they die (compose ``restart:``, a Deployment). This
supervisor gives such a run what ``launch`` gives its own: the table and progress lines, the
dead / hung verdicts (which it reports, since it cannot restart what it did not start), the stop
broadcast when the learner finishes or on Ctrl-C / SIGTERM, and the final summary. With
``learner.stop_at_target`` and an evaluator, it passes the evaluator's "target held" on to the
learner in its control heartbeats, as ``launch`` does (``Reporter.end_request``).

Processes announce themselves by heartbeat. Each process start carries an id of its own in every
heartbeat's info (``zmqrl.runtime.health.START_INFO_KEY``): a slot (role, id) whose heartbeats come
with a new start id is a restarted process rejoining, and counts as a restart, however short the
gap and whatever its pid (in a container every role is pid 1 on the same hostname, so pids cannot
tell). Late heartbeats of a start already replaced are dropped. A heartbeat without a start id (a
role from before it was added) falls back to the pid: a new pid is a restart.

A supervisor that died (SIGKILL, a container's restart) and is started again takes the running
roles back: they keep beating through its absence (the rejoin grace, zmqrl/runtime/
supervisor_watch.py), and this supervisor's heartbeat starts before anything slow. The run's
record (``RUN_DIR/supervisor.json``) keeps each slot's restart count and last start id, so the new
supervisor carries the counts on (also across ``docker compose stop`` and ``up``) and tells a role
it takes back (the same start id) from one restarted while nobody watched.

The slots the config expects (the learner, ``actor.num_actors`` actors, the evaluator if enabled)
are always kept; beyond them at most ``supervisor.extra_slots`` more (scaled replicas with ids past
``num_actors``), so heartbeats under random ids cannot grow the table without bound: the rest are
dropped and counted.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from pathlib import Path
from typing import Any

from zmqrl.config import Config
from zmqrl.supervisor.liveness import FINAL_STATES, start_of
from zmqrl.supervisor.oversight import EXIT_OK, STOP_REPEAT_SECONDS, Oversight
from zmqrl.supervisor.status import StatusError, StatusRecord
from zmqrl.supervisor.summary import Slot
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.wire import HeartbeatMsg, WireError

# Seconds between "still waiting for the learner" lines.
WAITING_LINE_SECONDS = 10.0
# What the operator can do about a role that is down or hung (the watcher restarts nothing).
REPLACE_IT_HINT = (
    "whatever started it must replace it: under docker compose the image's init ends a role that "
    "stopped beating (after 2 x heartbeat_timeout) and a hung one's watchdog ends itself, and the "
    "engine restarts the container, so wait (a `docker pause`d one waits for `docker unpause`); "
    "Kubernetes restarts it when its `zmqrl health` probe fails; one started by hand, restart yourself"
)
# Replaced start ids remembered per slot, to drop their late heartbeats (a bound, not a policy).
SUPERSEDED_STARTS_KEPT = 16

log = logging.getLogger("zmqrl.supervisor")


class Watcher(Oversight):
    """Tracks the processes that heartbeat to it; restarts none of them."""

    command = "supervise"
    # `docker compose stop`, a pod's termination, `systemctl stop`: a requested, clean end.
    sigterm_exit = EXIT_OK

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self._reported: dict[str, str] = {}  # slot name -> the verdict last reported for it
        self._expected = {"learner-0", *(f"actor-{i}" for i in range(cfg.actor.num_actors))}
        if cfg.evaluator.enabled:
            self._expected.add("evaluator-0")
        # Heartbeats from senders past the slot bound: counted, logged at a limited rate, dropped.
        self.unknown_senders = BadMessages("supervisor slots", log)
        self._superseded: dict[str, deque[str]] = {}  # slot name -> start ids replaced in it
        # A supervisor restarted on a run carries on from the record its predecessor kept: each
        # slot's restarts, and the start id it last heard (the same one: the process it watched).
        self._carried, self._predecessor_died = carried_slots(self.run_dir)
        self.monitor.carried = dict(self._carried)

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
        start = start_of(hb)
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
            slot.live.start = start
            self._say(self._joined(slot, hb, start, now))
            self.monitor.record_slots()
            return slot
        live = slot.live
        if start is not None and start == live.start:
            return slot
        if start is None and live.start is None and hb.pid == live.pid:
            return slot  # a role without start ids: the same pid is the same process
        superseded = self._superseded.setdefault(name, deque(maxlen=SUPERSEDED_STARTS_KEPT))
        if start is not None and start in superseded:
            return None  # the last words of a process already replaced
        self._restarted(slot, hb, start, now)
        if live.start is not None:
            superseded.append(live.start)
        return slot

    def _joined(self, slot: Slot, hb: HeartbeatMsg, start: str | None, now: float) -> str:
        """The line for a slot first heard by this supervisor, with what its predecessor counted:
        the same start id is the process it watched (taken back, no restart); another one, after a
        predecessor that died, is a restart nobody watched; after one that ended cleanly (the run
        was stopped, then started again) a new start only carries the count on."""
        what = f"(pid {hb.pid}{f', start {start}' if start else ''}, state {hb.state})"
        mark = self._carried.pop(slot.name, None)
        self.monitor.carried.pop(slot.name, None)
        if mark is None:
            return f"{slot.name} joined {what}"
        slot.carried_restarts = int(mark["restarts"])
        so_far = f"{slot.restarts} restart(s) of {slot.name} so far"
        if start is not None and start == mark["start"]:
            return f"{slot.name} rejoined {what}: the process the previous supervisor watched; {so_far}"
        if self._predecessor_died and start is not None and mark["start"] is not None:
            slot.restart_times.append(now)
            return (
                f"{slot.name} restarted by its orchestrator while no supervisor watched {what}; "
                f"{slot.restarts} restart(s) of {slot.name} so far"
            )
        return f"{slot.name} joined {what}; {so_far}"

    def _restarted(self, slot: Slot, hb: HeartbeatMsg, start: str | None, now: float) -> None:
        """A new process in ``slot``: counted as a restart (its orchestrator's), and said in one line
        with how long the slot went unheard (the gap between the two processes' heartbeats)."""
        live = slot.live
        gap = f", was down {now - live.last_seen:.1f} s" if live.last_seen is not None else ""
        what = f"new start {start}" if start is not None else "new process"
        pid = f"pid {hb.pid} as before" if hb.pid == live.pid else f"pid {hb.pid}, was {live.pid}"
        slot.live = live.renew(now, hb.pid, start)
        slot.restart_times.append(now)
        self._reported.pop(slot.name, None)
        self._say(
            f"{slot.name} restarted by its orchestrator ({what}, {pid}{gap}); "
            f"{slot.restarts} restart(s) of {slot.name} so far"
        )
        self.monitor.record_slots()

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
                f"and cannot restart it: {REPLACE_IT_HINT}"
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
        now = self._clock()
        for slot in self.slots.values():
            slot.end = slot.end or _end_heard(slot, slot in left, now, self.cfg)
        self.shutdown_seconds = now - started


def carried_slots(run_dir: Path) -> tuple[dict[str, dict[str, Any]], bool]:
    """What a previous ``supervise`` of the run recorded per slot (restarts, start id), and whether
    it died (its record never said it ended). Nothing from a ``launch`` (its roles died with it) or
    from a record that cannot be read (said, then ignored: the counts start over)."""
    try:
        previous = StatusRecord.read(run_dir)
    except StatusError as exc:
        log.warning("%s; restart counts start from 0", exc)
        return {}, False
    if previous is None or previous.command != Watcher.command:
        return {}, False
    return dict(previous.slots), previous.state != "finished"


def _end_heard(slot: Slot, unconfirmed: bool, now: float, cfg: Config) -> str:
    """How a watched process ended, in the summary's words, from what its heartbeats said (the
    watcher sees no exit codes): its final state, "silent" when it went quiet without one, or
    "running" when it beat on through the stop."""
    last = slot.last
    if last is not None and last.state in FINAL_STATES:
        return last.state
    if unconfirmed:
        return "running (did not confirm the stop)"
    return "silent" if slot.live.verdict(now, cfg.supervisor) is not None else "unknown"
