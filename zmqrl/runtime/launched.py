"""When a run began, which every "seconds" a process reports counts from: the launch's start for a
process that ``zmqrl launch`` started (it passes it in the environment), this process's own start
for a role started by hand (read from the kernel, so imports count: a moment taken later made a
hand-started learner's start-up marks negative)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

# Set by `launch` to when it began (Unix seconds): every "seconds" a run reports counts from it.
LAUNCHED_ENV = "ZMQRL_LAUNCHED"


def launch_time(log: logging.Logger | None = None) -> float:
    """When the run began, in Unix seconds: the launch's start for a process it started, else (a
    role started by hand) this process's start, which is then said in the log."""
    try:
        return float(os.environ[LAUNCHED_ENV])
    except (KeyError, ValueError):
        if log is not None:
            log.info("started by hand: reported seconds count from this process's start")
        return process_started()


def process_started() -> float:
    """When this process started, in Unix seconds: its age from the kernel's clock-tick count since
    boot (``/proc/self/stat``) against the uptime, both on one clock; now where Linux's /proc is not
    there to read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(0.0, age)
