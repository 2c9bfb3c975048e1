"""The tally of dropped messages that every receiver keeps: counted, logged rate-limited, never lost.

Receivers never raise on bad input: a malformed, oversized, foreign or unauthenticated message is
counted in a :class:`BadMessages` tally, logged (at most a line per interval, saying how many were
suppressed) and dropped, so nothing a peer sends can crash a process or reach the replay buffer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

# At most one log line per this many seconds per channel about dropped messages.
BAD_MESSAGE_LOG_SECONDS = 5.0

Clock = Callable[[], float]


class BadMessages:
    """Tally of dropped messages for one channel, with rate-limited logging that loses no count.

    At most one line per ``interval``; each line says how many messages were dropped since the
    previous line (the suppressed ones included) and the total. Drops that arrive inside an
    interval are reported by the next line: the next ``record`` once the interval has passed, a
    ``maybe_flush`` from a housekeeping loop (so a burst that stops is still reported), or
    ``flush`` at shutdown. Thread-safe: the learner records on its ingest thread and flushes on
    its main thread.
    """

    def __init__(
        self,
        channel: str,
        logger: logging.Logger | None = None,
        interval: float = BAD_MESSAGE_LOG_SECONDS,
        clock: Clock = time.monotonic,
    ) -> None:
        self.channel = channel
        self.count = 0
        self._log = logger or logging.getLogger("zmqrl.transport")
        self._interval = interval
        self._clock = clock
        self._last_log = -float("inf")
        self._pending = 0  # dropped since the last line
        self._latest = ""  # reason of the newest drop
        self._lock = threading.Lock()

    @property
    def latest(self) -> str:
        """Why the newest drop was dropped ("" before any), as its log line says it."""
        return self._latest

    @property
    def pending(self) -> int:
        """Drops not yet reported in a log line."""
        return self._pending

    def record(self, error: Exception) -> None:
        with self._lock:
            self.count += 1
            self._pending += 1
            self._latest = str(error)[:160]
            self._report_if_due()

    def maybe_flush(self) -> bool:
        """Report pending drops if ``interval`` has passed since the last line; returns whether a
        line was logged. Call it from a housekeeping loop."""
        with self._lock:
            return self._report_if_due()

    def flush(self) -> bool:
        """Report pending drops now, whatever the interval (call at shutdown); whether it logged."""
        with self._lock:
            if not self._pending:
                return False
            self._report(self._clock())
            return True

    def _report_if_due(self) -> bool:
        now = self._clock()
        if not self._pending or now - self._last_log < self._interval:
            return False
        self._report(now)
        return True

    def _report(self, now: float) -> None:
        self._log.warning(
            "%s: dropped %d malformed message(s) since the last report (total %d); latest: %s",
            self.channel,
            self._pending,
            self.count,
            self._latest,
        )
        self._last_log = now
        self._pending = 0
