"""How a supervisor judges one process from its heartbeats: dead, hung, useful; pure bookkeeping.

Three verdicts, kept apart on purpose (a busy learner must not look dead, a stopped actor must
not take a minute to notice):
- **dead**: no heartbeat for ``heartbeat_timeout`` (or none within ``startup_timeout`` of the
  start, or the OS says the process is stopped, for ``heartbeat_timeout``; after its final
  heartbeat, ``stop_grace`` to exit);
- **hung**: heartbeats arrive (the heartbeat thread lives) but ``progress`` (main-loop ticks)
  has not moved for the role's hung timeout plus ``heartbeat_timeout`` (the role's own watchdog,
  zmqrl/runtime/watchdog.py, ends it at the hung timeout itself with its stack in the log:
  this verdict is the backstop). Before the first tick, the start-up limit applies;
- **useful**: its ``work`` counter moved (an update, env steps, an evaluation: not a round spent
  waiting for replay or held back by a full queue). A process that kept working for
  ``healthy_seconds`` is *healthy*, which is what resets the restart policy
  (zmqrl/supervisor/restarts.py).
Pure bookkeeping with an injected clock; the supervisor owns the processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zmqrl.config import SupervisorConfig
from zmqrl.runtime.health import (
    PROGRESS_COUNTER,
    START_INFO_KEY,
    WORK_COUNTER,
    hung_timeout,
    startup_timeout,
)
from zmqrl.transport.wire import HeartbeatMsg

# States a role's last heartbeat (SupervisorLink.final) reports; it exits right after.
FINAL_STATES = ("finished", "stopped", "failed")
# The longest start id taken from a heartbeat (the roles send 16 hex digits).
START_ID_MAX_CHARS = 64


@dataclass
class Liveness:
    """What the supervisor has heard from the process now in one slot."""

    started: float  # clock() when the process was started (or first heard, if not ours)
    pid: int | None = None
    start: str | None = None  # the process's per-start id from its heartbeats' info, once heard
    role: str = ""  # which hung timeout applies (hung_timeout)
    last_seen: float | None = None  # clock() of its latest heartbeat
    last: HeartbeatMsg | None = None
    progress: float = -1.0
    progress_seen: float = 0.0  # clock() at which `progress` last changed (or the first heartbeat)
    ready_at: float | None = None  # clock() of its first progress (its main loop runs)
    work: float = 0.0
    useful_at: float | None = None  # clock() at which its work counter first moved
    work_seen: float | None = None  # clock() at which its work counter last moved
    stopped_since: float | None = None  # clock() since which the OS reports it stopped

    def heard(self, hb: HeartbeatMsg, now: float) -> None:
        """A heartbeat from this process. The first one starts the progress clock."""
        progress = float(hb.counters.get(PROGRESS_COUNTER, 0.0))
        if self.last_seen is None or progress != self.progress:
            self.progress_seen = now
        if progress > 0 and self.ready_at is None:
            self.ready_at = now
        self.progress = progress
        work = float(hb.counters.get(WORK_COUNTER, 0.0))
        if work > self.work:
            self.work_seen = now
            if self.useful_at is None:
                self.useful_at = now
        self.work = work
        self.last = hb
        self.last_seen = now
        if self.start is None:  # launch's children: known by pid, their start id shown too
            self.start = start_of(hb)

    def observe_os_state(self, stopped: bool, now: float) -> None:
        if not stopped:
            self.stopped_since = None
        elif self.stopped_since is None:
            self.stopped_since = now

    def unheard(self, seconds: float) -> None:
        """The supervisor could not listen for ``seconds`` (its own loop was blocked, e.g. writing
        to a paused terminal): that time is nobody's silence, so every clock moves on by it."""
        self.started += seconds
        self.progress_seen += seconds
        if self.last_seen is not None:
            self.last_seen += seconds
        if self.stopped_since is not None:
            self.stopped_since += seconds

    @property
    def useful(self) -> bool:
        """Whether it has done useful work at all (not only started, waited or been held back)."""
        return self.useful_at is not None

    def healthy(self, scfg: SupervisorConfig) -> bool:
        """Whether it kept doing useful work for ``healthy_seconds``: measured up to its latest
        work, not up to now, so a process that works once and then hangs, waits or is stopped
        until it dies is no healthy run, however long it went on beating."""
        if self.useful_at is None or self.work_seen is None:
            return False
        return self.work_seen - self.useful_at >= scfg.healthy_seconds

    def verdict(self, now: float, scfg: SupervisorConfig) -> str | None:
        """Why this live process must be killed and replaced, or None while it is fine."""
        if self.stopped_since is not None and now - self.stopped_since > scfg.heartbeat_timeout:
            return f"stopped by a signal for {now - self.stopped_since:.1f} s"
        if self.last_seen is None:
            waited = now - self.started
            if waited > scfg.startup_timeout:
                return f"no first heartbeat within {waited:.1f} s of its start"
            return None
        silent = now - self.last_seen
        # After its final heartbeat (finished, stopped, failed) a process is exiting and beats no
        # more; closing sockets and the interpreter's teardown may take longer than a beat.
        final = self.last.state if self.last is not None and self.last.state in FINAL_STATES else None
        if silent > (max(scfg.heartbeat_timeout, scfg.stop_grace) if final else scfg.heartbeat_timeout):
            return f"no heartbeat for {silent:.1f} s" + (f" after it {final}" if final else "")
        stuck = now - self.progress_seen
        # The role's own watchdog ends it at its hung timeout; this is the backstop, a heartbeat
        # timeout later, for a watchdog that could not act.
        limit = (
            hung_timeout(scfg, self.role) + scfg.heartbeat_timeout
            if self.ready_at is not None
            else startup_timeout(scfg)
        )
        if stuck > limit:
            state = self.last.state if self.last is not None else "?"
            return f"alive but no progress for {stuck:.1f} s (hung, state {state})"
        return None

    def renew(self, started: float, pid: int | None, start: str | None = None) -> Liveness:
        """The record for the replacement process: fresh liveness, the last heartbeat kept (the
        summary shows the slot's last known counters until the replacement reports)."""
        return Liveness(started=started, pid=pid, start=start, role=self.role, last=self.last)


def os_stopped(pid: int) -> bool:
    """Whether the OS reports ``pid`` stopped (SIGSTOP / SIGTSTP / traced): state T or t in
    /proc. False where /proc is missing (not Linux) or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")


def start_of(hb: HeartbeatMsg) -> str | None:
    """The per-start id a heartbeat carries, or None (a role from before start ids, or a value that
    is no id: not a string, empty or too long)."""
    start = hb.info.get(START_INFO_KEY)
    if not isinstance(start, str) or not 0 < len(start) <= START_ID_MAX_CHARS:
        return None
    return start
