"""A role's own watchdog: it ends its process, exit 3 with every thread's stack in the log, when the
main loop has made no progress for the role's hung timeout.

A supervisor can only kill a hung process it started; docker compose's ``restart: on-failure``
never acts on "unhealthy", and Kubernetes only after its probes fail for a while. A process that
ends itself, non-zero, is replaced by any of them. The check runs on the heartbeat thread
(zmqrl/runtime/link.py), which lives whatever the main thread does; "progress" is the same
counter the heartbeats carry, so a role that legitimately waits (for replay, for a full queue, in
a long checkpoint or evaluation) keeps it moving and is never taken for hung. Armed only in
process mains: in a test or a notebook the roles run in threads, and the exit would take the
whole interpreter with them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import time
from collections.abc import Callable

from zmqrl.runtime.exits import EXIT_HUNG

log = logging.getLogger("zmqrl.watchdog")


def end_hung_process(reason: str) -> None:
    """Log why, dump every thread's stack (the main thread's shows where it is stuck) and exit 3
    at once: a hung main thread cannot be asked to clean up."""
    log.critical("%s: exiting with code %d; the stack of every thread follows", reason, EXIT_HUNG)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file descriptor
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(EXIT_HUNG)


class Watchdog:
    """Tells, from the progress counter, when the main loop is past its limit.

    ``limit`` applies once the loop has ticked; before its first tick (imports, building the
    env, restoring a checkpoint) ``startup_limit`` does. ``check`` returns the reason once the
    limit is passed (the caller ends the process), else None.
    """

    def __init__(
        self,
        name: str,
        limit: float,
        startup_limit: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limit = limit
        self.startup_limit = startup_limit
        self._clock = clock
        self._progress = 0
        self._since = clock()

    def check(self, progress: int) -> str | None:
        now = self._clock()
        if progress != self._progress:
            self._progress, self._since = progress, now
            return None
        stuck = now - self._since
        if progress == 0 and stuck > self.startup_limit:
            return f"{self.name} hung: its main loop has not started {stuck:.1f} s after the process did"
        if progress > 0 and stuck > self.limit:
            return f"{self.name} hung: its main loop made no progress for {stuck:.1f} s"
        return None
