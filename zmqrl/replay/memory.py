"""How much memory a run may use: read once, before the learner allocates replay.

Replay arrays are allocated with ``np.zeros``, whose pages the OS commits only when written, so a
capacity too large for the machine would not fail at start but hours later, when the buffer fills
and the kernel's OOM killer picks the learner. Checking the whole footprint against the memory
actually available turns that into an error at start that says what to change.
"""

from __future__ import annotations

import os
from pathlib import Path

from zmqrl.errors import ConfigError

MEMINFO = Path("/proc/meminfo")


class ReplayMemoryError(ConfigError, RuntimeError):
    """The configured replay would not fit in this machine's available memory.

    A ConfigError (lower ``replay.capacity``: exit 2 with one line), and still the RuntimeError
    that callers from before zmqrl.errors catch."""


def available_memory_bytes() -> int | None:
    """Memory the kernel could give a new allocation without swapping (Linux ``MemAvailable``);
    elsewhere the physical memory size; None when neither can be read."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: sizes people read in logs and error messages."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
