"""A role's health as its supervisor and an orchestrator see it: the counters its heartbeats
carry, the limits they are judged by, and a small file its heartbeat thread rewrites.

The counters and limits are shared by the role (zmqrl/runtime/link.py, which beats, and its
watchdog) and the supervisor (zmqrl/supervisor/liveness.py, which judges the beats), so they live
here, below both.

Docker's and Kubernetes' health checks run a command inside the container; "the process exists"
says nothing about a hung main loop. So every role's heartbeat thread (and the supervisor's loop)
rewrites ``$ZMQRL_HEALTH_FILE`` on each beat with the wall time of the beat and of the last
*progress* (the main loop ticking), and ``zmqrl health`` judges the file exactly as the supervisor
judges heartbeats: no beat for ``heartbeat_timeout`` is dead, no progress for ``progress_timeout``
is hung. Pure functions of the file and a clock, so they are tested without processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zmqrl.config import SupervisorConfig

# Environment variable naming the file; unset: no file is written.
HEALTH_FILE_ENV = "ZMQRL_HEALTH_FILE"
# The heartbeat info key (and health-file info key) holding a random id made once per process
# start: pid and hostname do not change when a container restarts its role as pid 1.
START_INFO_KEY = "start"
# Heartbeat counters: main-loop rounds (any: waiting counts), and rounds that did useful work.
PROGRESS_COUNTER = "progress"
WORK_COUNTER = "work"
# A process that has made no progress yet (still starting: imports, allocating replay, restoring
# a snapshot) is hung only after this many times supervisor.progress_timeout, and at least
# supervisor.startup_timeout (on an overloaded machine torch's import alone has taken a minute).
STARTING_GRACE = 2.0


def hung_timeout(scfg: SupervisorConfig, role: str) -> float:
    """Seconds without main-loop progress after which a running ``role`` is hung: an actor's loop
    turns every few env steps, so it gets its own short limit; the learner and the evaluator may
    spend longer in one step (a big batch, a checkpoint's copy, an evaluation episode)."""
    return scfg.actor_progress_timeout if role == "actor" else scfg.progress_timeout


def startup_timeout(scfg: SupervisorConfig) -> float:
    """Seconds a process may take from its start to its main loop's first tick."""
    return max(scfg.progress_timeout * STARTING_GRACE, scfg.startup_timeout)


@dataclass
class HealthRecord:
    """What one beat says about the process that wrote it."""

    role: str
    id: int
    pid: int
    state: str  # starting | running | waiting | blocked | evaluating | ... | finished | failed | hung
    time: float  # wall time of this beat
    progress: int  # main-loop ticks so far
    progress_time: float  # wall time at which `progress` last changed (the process start before any)
    heartbeat_timeout: float  # seconds without a beat after which the process counts as dead
    progress_timeout: float  # seconds without progress after which it counts as hung
    # What its heartbeats say besides counters: the host, and for the learner the endpoints it
    # really bound (port 0 resolved), so a script or test that starts a role by hand finds them.
    info: dict[str, str] = field(default_factory=dict)


def health_path(environ: dict[str, str] | None = None) -> Path | None:
    value = (environ if environ is not None else os.environ).get(HEALTH_FILE_ENV, "")
    return Path(value) if value else None


def write_health(path: Path, record: HealthRecord) -> None:
    """Atomic replace, so a reader never sees half a file; errors are ignored (a full disk must not
    take the role down: its health check then fails on a stale file, which is the truth)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(asdict(record)))
        os.replace(tmp, path)


def read_health(path: Path) -> HealthRecord:
    """The record in ``path``; raises ValueError (with a reason) if it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        info = data.get("info", {})  # absent in a file an older zmqrl wrote
        if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
            raise ValueError(f"info is not a map of strings: {info!r}")
        fields = [k for k in HealthRecord.__dataclass_fields__ if k != "info"]
        return HealthRecord(**{k: data[k] for k in fields}, info=info)
    except FileNotFoundError:
        raise ValueError(f"no health file at {path} (the role has not started its heartbeat)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable health file {path}: {exc}") from None


def judge(record: HealthRecord, now: float | None = None) -> tuple[bool, str]:
    """(healthy, one-line reason), by the supervisor's rules."""
    now = time.time() if now is None else now
    who = f"{record.role}-{record.id} (pid {record.pid})"
    if record.state in ("finished", "stopped"):
        return False, f"{who} has {record.state}"
    if record.state == "failed":
        return False, f"{who} failed"
    if record.state == "hung":
        return False, f"{who} hung: its watchdog ended it (exit 3; the stacks are in its log)"
    silent = now - record.time
    if silent > record.heartbeat_timeout:
        return False, f"{who}: no heartbeat for {silent:.1f} s (dead or stopped)"
    stuck = now - record.progress_time
    if stuck > record.progress_timeout:
        return False, f"{who}: alive but no progress for {stuck:.1f} s (hung), state {record.state}"
    return True, f"{who} healthy: {record.state}, progress {record.progress}, beat {silent:.1f} s ago"
