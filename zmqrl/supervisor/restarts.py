"""Why a supervised process died, and whether, and when, to start it again.

Every death is classified first (:func:`classify`), from its exit code and from what the
supervisor itself did:

- **finished / stopped**: exit 0 (the role reached its end, or was asked to stop): never restarted;
- **needs the operator**: exit 2 (a setting that cannot work, a refused resume, a full disk):
  restarting cannot help, so the slot is given up at once with the role's own one-line reason;
- **crashed**: exit 1 (an exception, a dead thread), any other code, or a signal the process
  brings on itself (SIGSEGV, SIGABRT, ...);
- **hung**: exit 3 (its own watchdog ended it), or killed by the supervisor because it went
  silent or stopped making progress while running;
- exit 4 (the process lost its supervisor: this one was silent too long) counts as crashed;
- **killed from outside**: a signal somebody else sent (SIGKILL, SIGTERM, ... as -N or 128+N),
  or stopped from outside (SIGSTOP) so that the supervisor killed it.

Then :class:`RestartPolicy` decides, after Kubernetes' CrashLoopBackOff: a death *counts* unless
the process had been healthy (``healthy_seconds`` of useful work: that resets the slot's record)
or was killed from outside after it had done useful work (an operator's or chaos test's kill of
a working process says nothing about the process: it is restarted at the base delay and the
backoff does not grow). Counted deaths double the delay (``restart_backoff`` up to
``restart_backoff_max``); more than ``max_restarts`` of them within ``restart_window`` give the
slot up, however long each run lasted. A process killed before it ever did useful work counts,
whoever killed it, so an OOM kill at every start is still a crash loop.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from zmqrl.config import SupervisorConfig
from zmqrl.runtime.exits import EXIT_HUNG, EXIT_LOST_SUPERVISOR, EXIT_OK, EXIT_OPERATOR, SIGNAL_EXIT_BASE

# What each kind of death is called on the console.
CRASHED = "crashed"
HUNG = "hung"
KILLED = "killed from outside"
NEEDS_OPERATOR = "needs the operator"
ENDED = "ended"  # exit 0

# Signals a process brings on itself (a fault in native code, an abort): a crash, not a kill.
SELF_INFLICTED = frozenset(
    int(s)
    for s in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS)
)


def ended_by_signal(code: int) -> int | None:
    """The signal number an exit code says ended the process (-N from Popen, 128+N from a
    shell or a role that stopped itself on the signal), else None."""
    if code < 0:
        return -code
    if SIGNAL_EXIT_BASE < code < SIGNAL_EXIT_BASE + 65:
        return code - SIGNAL_EXIT_BASE
    return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class Death:
    """One process's end as the restart policy sees it."""

    kind: str  # CRASHED, HUNG, KILLED, NEEDS_OPERATOR or ENDED
    code: int  # the exit code as Popen reported it
    why: str  # for the console: "exited with code 1", "killed by SIGKILL from outside", ...
    useful: bool  # it had done useful work (liveness.Liveness.useful)
    healthy: bool  # ... for supervisor.healthy_seconds (liveness.Liveness.healthy)


def classify(code: int, *, killed_for: str | None, stopped: bool, useful: bool, healthy: bool) -> Death:
    """The death of a process that exited with ``code``. ``killed_for``: the verdict for which the
    supervisor killed it (None if it did not); ``stopped``: the OS reported it stopped (SIGSTOP)
    when it was killed."""
    if killed_for is not None:
        if stopped:  # stopped from outside, then killed by us: somebody else's doing
            return Death(KILLED, code, f"stopped from outside ({killed_for}) and killed", useful, healthy)
        return Death(HUNG, code, f"killed by the supervisor ({killed_for})", useful, healthy)
    if code == EXIT_OK:
        return Death(ENDED, code, "exited with code 0", useful, healthy)
    if code == EXIT_OPERATOR:
        return Death(NEEDS_OPERATOR, code, f"exited with code {code}", useful, healthy)
    if code == EXIT_HUNG:
        return Death(HUNG, code, f"exited with code {code} (hung: its watchdog ended it)", useful, healthy)
    if code == EXIT_LOST_SUPERVISOR:  # this supervisor was silent too long (stopped, starved)
        return Death(CRASHED, code, f"exited with code {code} (lost its supervisor)", useful, healthy)
    signum = ended_by_signal(code)
    if signum is not None and signum not in SELF_INFLICTED:
        return Death(KILLED, code, f"killed by {signal_name(signum)} from outside", useful, healthy)
    if signum is not None:
        return Death(CRASHED, code, f"crashed with {signal_name(signum)}", useful, healthy)
    return Death(CRASHED, code, f"exited with code {code}", useful, healthy)


@dataclass
class CrashRecord:
    """A slot's deaths that counted since its last healthy run (clock times); carried from each
    process to its replacement."""

    counted: list[float] = field(default_factory=list)

    @property
    def streak(self) -> int:
        return len(self.counted)


@dataclass(frozen=True)
class Decision:
    delay: float | None  # seconds before the restart; None: the slot is given up
    counted: bool  # whether this death counted towards the cap
    why: str  # the rule that applied, for the console


class RestartPolicy:
    """CrashLoopBackOff with a cap: see the module docstring."""

    def __init__(self, max_restarts: int, window: float, backoff: float, backoff_max: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.backoff_max = backoff_max

    @classmethod
    def from_config(cls, scfg: SupervisorConfig) -> RestartPolicy:
        return cls(scfg.max_restarts, scfg.restart_window, scfg.restart_backoff, scfg.restart_backoff_max)

    def decide(self, record: CrashRecord, death: Death, now: float) -> Decision:
        """What to do after ``death`` (not an exit 0); updates ``record``."""
        if death.kind == NEEDS_OPERATOR:
            return Decision(None, False, "it needs the operator: restarting cannot help")
        if death.healthy:
            record.counted.clear()
            return Decision(self.backoff, False, "after a healthy run")
        if death.kind == KILLED and death.useful:
            return Decision(self.backoff, False, "after useful work")
        record.counted.append(now)
        recent = sum(1 for t in record.counted if now - t < self.window)
        if recent > self.max_restarts:
            return Decision(None, True, f"{recent} failures within {self.window:.0f} s")
        delay = min(self.backoff_max, self.backoff * 2.0 ** (record.streak - 1))
        what = "before doing useful work" if not death.useful else "before running healthily"
        return Decision(delay, True, f"{what}: restart {recent} of {self.max_restarts}")
