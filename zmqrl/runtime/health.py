"""A role's health as its supervisor and an orchestrator see it: the counters its heartbeats
carry, the limits they are judged by, and a small file its heartbeat thread rewrites.

The counters and limits are shared by the role (zmqrl/runtime/link.py, which beats, and its
watchdog) and the supervisor (zmqrl/supervisor/liveness.py, which judges the beats), so they live
here, below both.

Docker's and Kubernetes' health checks run a command inside the container; "the process exists"
says nothing about a hung main loop. So every role's heartbeat thread (and the supervisor's loop)
rewrites ``$ZMQRL_HEALTH_FILE`` on each beat with the time of the beat and of the last *progress*
(the main loop ticking), and ``zmqrl health`` judges the file exactly as the supervisor judges
heartbeats: no beat for ``heartbeat_timeout`` is dead, no progress for ``progress_timeout`` is
hung. Pure functions of the file and a clock, so they are tested without processes.

Why two clocks: the writer and the judge (``zmqrl health``, the container's init) are different
processes, and the wall clock they share can be stepped (NTP at a container's start, an operator's
``date -s``): a step forward by more than ``heartbeat_timeout`` made a healthy role look dead, and
the init killed it; a step back hid a dead one. So a beat also carries its moments on
:func:`health_clock` (CLOCK_MONOTONIC: one clock for every process of a boot, containers included,
never stepped) and the boot it belongs to, and the judge uses it whenever it runs in the same boot.
The wall times stay for people, and for a file of format 1 (without "format": an older zmqrl's)
or one from another boot (a file on a volume that outlived a reboot), judged by them as before.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.config import SupervisorConfig

# Environment variable naming the file; unset: no file is written.
HEALTH_FILE_ENV = "ZMQRL_HEALTH_FILE"
# The file's format, written as "format": 2 adds the monotonic moments and the boot (a file
# without the key is format 1: wall times only, judged by them).
HEALTH_FORMAT = 2
# Where Linux names the current boot: monotonic moments compare only within one.
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
# The file's permissions (less the umask): nothing in it is secret, and a probe may run as another
# user. Its temporary name is random and created exclusively (never through a link someone placed).
HEALTH_FILE_MODE = 0o644
# The heartbeat info key (and health-file info key) holding a random id made once per process
# start: pid and hostname do not change when a container restarts its role as pid 1.
START_INFO_KEY = "start"
# The learner's heartbeat info key holding why its newest dropped samples message was dropped.
BAD_LATEST_INFO_KEY = "bad_latest"
# The final heartbeat's info key saying why a role stopped (its link's stop reason, e.g. "learner
# finished"), so the supervisor can tell a role that left with the learner from one told to stop.
STOP_REASON_INFO_KEY = "stop_reason"
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


def health_clock() -> float:
    """Seconds on CLOCK_MONOTONIC: the same clock in every process of this boot (and container),
    which NTP slews but never steps. Not CLOCK_BOOTTIME: that one counts a suspended machine's sleep,
    and a role is not dead for the time its host slept (the init's own freeze check, on
    time.monotonic, does not count it either)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@functools.cache
def boot_id() -> str | None:
    """The kernel's id of this boot (None where there is none to read)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


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
    # `progress_time` on health_clock(), kept by the writer; with it judge() measures both ages on
    # that clock. None: judged by the wall times (a format-1 file, a writer that keeps none).
    progress_clock: float | None = None
    # `time` on health_clock(): a record is made at its beat, so by default the moment it is made.
    clock: float | None = field(default_factory=health_clock)
    boot: str | None = field(default_factory=boot_id)  # the boot whose monotonic clock that is


def health_path(environ: dict[str, str] | None = None) -> Path | None:
    value = (environ if environ is not None else os.environ).get(HEALTH_FILE_ENV, "")
    return Path(value) if value else None


def write_health(path: Path, record: HealthRecord) -> None:
    """Atomic replace, so a reader never sees half a file; errors are ignored (a full disk must not
    take the role down: its health check then fails on a stale file, which is the truth).

    The temporary file gets a random name and is created exclusively, never through a link: the
    file often lives in a shared directory (/tmp), where a predictable name let another user plant
    a symlink there and have the role overwrite whatever it pointed at. os.replace then swaps the
    name itself, not a link's target."""
    payload = json.dumps({"format": HEALTH_FORMAT, **asdict(record)}).encode()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, HEALTH_FILE_MODE)
        try:
            with open(fd, "wb") as out:
                out.write(payload)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def read_health(path: Path) -> HealthRecord:
    """The record in ``path``; raises ValueError (with a reason) if it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        info = data.get("info", {})  # absent in a file an older zmqrl wrote
        if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
            raise ValueError(f"info is not a map of strings: {info!r}")
        # Absent in format 1: judged by the wall times then.
        clock, progress_clock = _number_or_none(data, "clock"), _number_or_none(data, "progress_clock")
        boot = data.get("boot")
        if boot is not None and not isinstance(boot, str):
            raise ValueError(f"boot is not a string: {boot!r}")
        later = ("info", "clock", "progress_clock", "boot")
        fields = {k: data[k] for k in HealthRecord.__dataclass_fields__ if k not in later}
        return HealthRecord(**fields, info=info, clock=clock, progress_clock=progress_clock, boot=boot)
    except FileNotFoundError:
        raise ValueError(f"no health file at {path} (the role has not started its heartbeat)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable health file {path}: {exc}") from None


def _number_or_none(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{key} is not a number: {value!r}")
    return None if value is None else float(value)


def ages(
    record: HealthRecord, now: float | None = None, clock_now: float | None = None
) -> tuple[float, float]:
    """(seconds since the last beat, seconds since the last progress): on health_clock() when the
    record carries its moments there and comes from this boot, else on the wall clock. ``now``,
    ``clock_now``: the present on each (default: read them)."""
    if record.clock is not None and record.progress_clock is not None and record.boot == boot_id():
        at = health_clock() if clock_now is None else clock_now
        return at - record.clock, at - record.progress_clock
    at = time.time() if now is None else now
    return at - record.time, at - record.progress_time


def judge(record: HealthRecord, now: float | None = None, clock_now: float | None = None) -> tuple[bool, str]:
    """(healthy, one-line reason), by the supervisor's rules; ``now`` and ``clock_now`` as in
    :func:`ages`."""
    who = f"{record.role}-{record.id} (pid {record.pid})"
    if record.state in ("finished", "stopped"):
        return False, f"{who} has {record.state}"
    if record.state == "failed":
        return False, f"{who} failed"
    if record.state == "hung":
        return False, f"{who} hung: its watchdog ended it (exit 3; the stacks are in its log)"
    silent, stuck = ages(record, now, clock_now)
    if silent > record.heartbeat_timeout:
        return False, f"{who}: no heartbeat for {silent:.1f} s (dead or stopped)"
    if stuck > record.progress_timeout:
        return False, f"{who}: alive but no progress for {stuck:.1f} s (hung), state {record.state}"
    return True, f"{who} healthy: {record.state}, progress {record.progress}, beat {silent:.1f} s ago"
