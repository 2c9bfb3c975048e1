"""CPU time of the processes a benchmark starts: what a sample or an update costs, not only how
many per second.

Throughput alone hides cost: two actors at the same transitions/s may burn one core or two. A
process's CPU time is what the kernel charged it (user + system, every thread, counted in clock
ticks), read from ``/proc/<pid>/stat`` while it runs, because the bench's runs end with their
processes reaped by the supervisor, not by us (``getrusage(RUSAGE_CHILDREN)`` would lump every
role together, and only once they are gone). Where there is no ``/proc`` (macOS), the reads give
None and the cost rows are left out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

# Kernel clock ticks per second, the unit of utime and stime in /proc/<pid>/stat (100 on Linux).
TICKS_PER_S = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
# utime and stime are fields 14 and 15 of /proc/<pid>/stat; counted after the ")" that closes
# the command name (which may hold spaces), they are the 12th and 13th.
UTIME_AFTER_NAME, STIME_AFTER_NAME = 11, 12
# Costs are given per this many env steps or updates.
PER = 1_000


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used so far (all its threads); None when it
    cannot be read (gone, or no /proc on this system)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return (int(fields[UTIME_AFTER_NAME]) + int(fields[STIME_AFTER_NAME])) / TICKS_PER_S
    except (IndexError, ValueError):
        return None


def total_cpu_seconds(pids: Iterable[int]) -> float | None:
    """The processes' CPU seconds added up; None if any of them cannot be read."""
    total = 0.0
    for pid in pids:
        seconds = process_cpu_seconds(pid)
        if seconds is None:
            return None
        total += seconds
    return total


def per_thousand(cpu_seconds: float, count: float) -> float | None:
    """CPU seconds per 1,000 of ``count`` (env steps, updates); None when nothing was counted."""
    return cpu_seconds / count * PER if count > 0 else None
