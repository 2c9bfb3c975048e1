"""How a supervisor judges one process from its heartbeats: dead, hung, healthy; and when to
restart it.

Three verdicts, kept apart on purpose (a busy learner must not look dead, a stopped actor must
not take a minute to notice):
- **dead**: no heartbeat for ``heartbeat_timeout`` (or none within ``startup_timeout`` of the
  start, or the OS says the process is stopped, for ``heartbeat_timeout``; after its final
  heartbeat, ``stop_grace`` to exit);
- **hung**: heartbeats arrive (the heartbeat thread lives) but ``progress`` (main-loop ticks)
  has not moved for ``progress_timeout`` (before the first tick, for at least ``startup_timeout``);
- **healthy**: it has made progress for ``healthy_seconds``. A healthy process's death is an
  occasional death, not a crash loop: its restart gets the base backoff and does not count
  towards ``max_restarts`` (as Kubernetes' CrashLoopBackOff and systemd reset theirs).
Pure bookkeeping with an injected clock; the supervisor owns the processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zmqrl.config import SupervisorConfig
from zmqrl.transport.wire import HeartbeatMsg

# A process that has made no progress yet (still starting) is hung only after this many times
# supervisor.progress_timeout.
STARTING_GRACE = 2.0


# States a role's last heartbeat (SupervisorLink.final) reports; it exits right after.
FINAL_STATES = ("finished", "stopped", "failed")


class RestartPolicy:
    """Exponential backoff over a slot's *unhealthy* deaths in a row, and a cap on them: a crash
    loop ends in one clear line, while a healthy process killed ten times is replaced ten times."""

    def __init__(self, max_restarts: int, window: float, backoff: float, backoff_max: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.backoff_max = backoff_max

    def delay(self, unhealthy_deaths: list[float], now: float) -> float | None:
        """Seconds to wait before the next restart, given the clock times of the slot's unhealthy
        deaths in a row (the latest included, if it was one); None once they exceed the cap."""
        recent = sum(1 for t in unhealthy_deaths if now - t < self.window)
        if recent > self.max_restarts:
            return None
        return min(self.backoff_max, self.backoff * 2.0 ** max(0, recent - 1))


@dataclass
class Liveness:
    """What the supervisor has heard from the process now in one slot."""

    started: float  # clock() when the process was started (or first heard, if not ours)
    pid: int | None = None
    last_seen: float | None = None  # clock() of its latest heartbeat
    last: HeartbeatMsg | None = None
    progress: float = -1.0
    progress_seen: float = 0.0  # clock() at which `progress` last changed (or the first heartbeat)
    ready_at: float | None = None  # clock() of its first progress (its main loop runs)
    stopped_since: float | None = None  # clock() since which the OS reports it stopped
    unhealthy_deaths: list[float] = field(default_factory=list)  # carried over between processes

    def heard(self, hb: HeartbeatMsg, now: float) -> None:
        """A heartbeat from this process. The first one starts the progress clock."""
        progress = float(hb.counters.get("progress", 0.0))
        if self.last_seen is None or progress != self.progress:
            self.progress_seen = now
        if progress > 0 and self.ready_at is None:
            self.ready_at = now
        self.progress = progress
        self.last = hb
        self.last_seen = now

    def observe_os_state(self, stopped: bool, now: float) -> None:
        if not stopped:
            self.stopped_since = None
        elif self.stopped_since is None:
            self.stopped_since = now

    def healthy(self, now: float, scfg: SupervisorConfig) -> bool:
        return self._progressed_for(scfg) and self.verdict(now, scfg) is None

    def _progressed_for(self, scfg: SupervisorConfig) -> bool:
        """Whether its main loop kept ticking for ``healthy_seconds``: measured up to its latest
        progress, not up to now, so a process that ticks once and then hangs (or is stopped) until
        it is killed is a crash loop, not a healthy run, however long it went on beating."""
        return self.ready_at is not None and self.progress_seen - self.ready_at >= scfg.healthy_seconds

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
        # Before its first progress a process is still starting (imports, allocating replay,
        # restoring a snapshot): that gets STARTING_GRACE times progress_timeout (on an overloaded
        # machine torch's import alone has taken a minute), and at least startup_timeout.
        limit = (
            scfg.progress_timeout
            if self.ready_at is not None
            else max(scfg.progress_timeout * STARTING_GRACE, scfg.startup_timeout)
        )
        if stuck > limit:
            state = self.last.state if self.last is not None else "?"
            return f"alive but no progress for {stuck:.1f} s (hung, state {state})"
        return None

    def died(self, now: float, scfg: SupervisorConfig) -> bool:
        """Record the process's death; returns whether it had been healthy (an occasional death)."""
        was_healthy = self._progressed_for(scfg)
        if was_healthy:
            self.unhealthy_deaths = []
        else:
            self.unhealthy_deaths = [*self.unhealthy_deaths, now]
        return was_healthy

    def renew(self, started: float, pid: int | None) -> Liveness:
        """The record for the replacement process: fresh liveness, the slot's crash history."""
        return Liveness(
            started=started, pid=pid, last=self.last, unhealthy_deaths=list(self.unhealthy_deaths)
        )


def os_stopped(pid: int) -> bool:
    """Whether the OS reports ``pid`` stopped (SIGSTOP / SIGTSTP / traced): state T or t in
    /proc. False where /proc is missing (not Linux) or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")
