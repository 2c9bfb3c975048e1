"""pid 1 of a zmqrl container: runs the role as its child, passes stop signals on, reaps orphans,
and ends a role whose heartbeats have stopped, so that the engine's restart policy replaces it.

Why an init of our own: a role's watchdog (zmqrl/runtime/watchdog.py) ends a hung main loop with
exit 3, but it is a thread of the same process, so a process that is stopped whole (SIGSTOP, a
debugger, a wedged interpreter) stops its watchdog and its heartbeat thread with it. docker compose
then marks the container unhealthy and does nothing else: it does not act on health. This init is
outside the role and sees the same health file ``zmqrl health`` reads: once the role's last beat is
older than ``DEAD_FACTOR`` x its ``heartbeat_timeout`` (6 s with the defaults), it SIGKILLs the
role's process group and exits 3 (``EXIT_HUNG``), and ``restart: on-failure`` starts the container
again. Otherwise its exit code is the role's (128 + N for a role ended by signal N), so the restart
policy sees what it would see with the role as pid 1.

What it leaves alone: a role that has not written its health file yet (starting: the healthcheck's
``start_period`` covers it), one whose last state is final (finished, stopped, failed, hung: it is
on its way out), and any time the init itself was frozen (``docker pause`` freezes the whole
container: after it, the role gets a fresh ``DEAD_FACTOR`` x ``heartbeat_timeout`` to beat again).
Without ``$ZMQRL_HEALTH_FILE`` it only relays signals and reaps. A beat's age is measured on the
monotonic clock the role's beats carry (zmqrl/runtime/health.py), so a step of the wall clock (NTP
at a container's start) neither kills a healthy role nor hides a stopped one.

Usage (the image's entrypoint): ``python3 -m zmqrl.cli.container_init zmqrl learner CONFIG ...``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from zmqrl.runtime.exits import EXIT_HUNG, SIGNAL_EXIT_BASE
from zmqrl.runtime.health import ages, health_path, read_health

# The role's last beat older than this many heartbeat_timeouts: it is stopped or wedged, not slow.
# Twice the supervisor's own limit, because a replacement costs a restart, and a beat late under
# load is not a dead process.
DEAD_FACTOR = 2.0
# How often the health file is judged, and how often exited children are reaped (seconds).
CHECK_SECONDS = 1.0
POLL_SECONDS = 0.2
# A gap between two checks this much longer than CHECK_SECONDS: the init itself was frozen.
FROZEN_AFTER = 3.0
# States a role writes last: it is ending by itself.
FINAL_STATES = frozenset({"finished", "stopped", "failed", "hung"})
# Stop signals an engine or a terminal sends to pid 1, passed on to the role.
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The shell's code for a command that cannot be found or run.
EXIT_NOT_FOUND = 127

PREFIX = "zmqrl-init:"


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def stale_verdict(
    path: Path,
    pid: int,
    since_freeze: float = math.inf,
    now: float | None = None,
    clock_now: float | None = None,
) -> str | None:
    """Why the role ``pid`` must be ended, or None. ``since_freeze``: seconds since the end of the
    init's last freeze; no beat counts as older, so a pause of the whole container is not blamed on
    the role. ``now``, ``clock_now``: the present on the wall and monotonic clocks (default: read
    them), as zmqrl.runtime.health.ages takes them."""
    try:
        record = read_health(path)
    except ValueError:
        return None  # not written yet (starting) or mid-replace: nothing to judge
    if record.pid != pid or record.state in FINAL_STATES:
        return None
    limit = DEAD_FACTOR * record.heartbeat_timeout
    silent = min(ages(record, now, clock_now)[0], since_freeze)
    if silent <= limit:
        return None
    return (
        f"{record.role}-{record.id} (pid {pid}) has not beaten for {silent:.1f} s "
        f"(> {DEAD_FACTOR:g} x heartbeat_timeout {record.heartbeat_timeout:g} s), state {record.state}: "
        "stopped or wedged, so its watchdog cannot act"
    )


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return SIGNAL_EXIT_BASE - code if code < 0 else code


def spawn(argv: list[str]) -> int:
    """The role, in a process group of its own: a terminal's Ctrl-C reaches it once (relayed by
    this init), not twice (a second SIGINT interrupts a role at once)."""
    return os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0)


def supervise_child(pid: int, health: Path | None) -> int:
    """Wait for the role to exit and return the container's exit code; end it if it stops beating."""
    last_check = time.monotonic()
    thawed: float | None = None  # time.monotonic() at the end of the init's last freeze
    while True:
        # Reap every exited child: the role, and orphans the kernel re-parented to pid 1.
        while True:
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0
            if done == 0:
                break
            if done == pid:
                return exit_code(status)
        time.sleep(POLL_SECONDS)
        mono = time.monotonic()
        if health is None or mono - last_check < CHECK_SECONDS:
            continue
        if mono - last_check > FROZEN_AFTER * CHECK_SECONDS:
            thawed = mono  # we were frozen too: give the role a fresh limit to beat
        last_check = mono
        why = stale_verdict(health, pid, math.inf if thawed is None else mono - thawed)
        if why is not None:
            say(f"{why}; killing it and exiting {EXIT_HUNG} so the engine restarts the container")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return EXIT_HUNG


def main(argv: list[str]) -> int:
    if not argv:
        say("usage: python3 -m zmqrl.cli.container_init COMMAND [ARGS...]")
        return EXIT_NOT_FOUND
    health = health_path()
    if health is not None:
        # The previous start's file survives a container restart (/tmp is the container's own):
        # its beats are not this role's.
        with contextlib.suppress(OSError):
            health.unlink()
    child: list[int] = []  # the role's pid, once spawned

    def relay(signum: int, _frame: FrameType | None) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], signum)

    # Before the spawn: pid 1 of a container drops a signal it has no handler for.
    for sig in RELAYED:
        signal.signal(sig, relay)
    try:
        child.append(spawn(argv))
    except OSError as exc:
        say(f"cannot run {argv[0]}: {exc}")
        return EXIT_NOT_FOUND
    return supervise_child(child[0], health)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
