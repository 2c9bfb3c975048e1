"""Which lines of one package a process runs between two moments a driver chooses.

Loaded at interpreter start (``benchmarks/sample_path.py`` writes a ``sitecustomize`` that calls
:func:`install` and puts it on ``PYTHONPATH``, so every process of a launched run has it, the
processes those start included). Frames of files under the package directory are traced line by
line; every other frame (torch, numpy, the standard library) is not traced at all, so a run slows
down only in the package's own code. Lines are recorded only while armed: the driver creates
``arm`` in the output directory once the run is past its warm-up and ``disarm`` at the end of the
window; on ``disarm`` each process writes ``<pid>.json`` there (its argv and, per file, the lines
it ran in the window) and records nothing more.

Written for measurement, not for production: nothing in zmqrl imports it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

# Where the driver's arm/disarm files appear and the processes' results go.
OUT_ENV = "ZMQRL_LINE_TRACE_DIR"
# The directory whose files are traced (zmqrl's package directory).
PACKAGE_ENV = "ZMQRL_LINE_TRACE_PACKAGE"
# How often a process looks for the driver's files.
POLL_SECONDS = 0.02
# After disarming, how long a process waits for a line being recorded by another thread.
SETTLE_SECONDS = 0.1

_state = {"armed": False}
_lines: dict[str, set[int]] = {}


def install() -> None:
    """Trace this process (and every thread it starts) when the driver's variables say where."""
    out, package = os.environ.get(OUT_ENV), os.environ.get(PACKAGE_ENV)
    if not out or not package:
        return
    prefix = os.path.join(os.path.realpath(package), "")
    state, lines = _state, _lines

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and state["armed"]:
            filename = frame.f_code.co_filename
            seen = lines.get(filename)
            if seen is None:
                seen = lines[filename] = set()
            seen.add(frame.f_lineno)
        return local

    def first(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(prefix) else None

    sys.settrace(first)
    threading.settrace(first)
    watcher = threading.Thread(target=_watch, args=(out,), name="line-trace", daemon=True)
    watcher.start()


def _watch(out: str) -> None:
    """Arm on ``arm``, and on ``disarm`` stop recording and write this process's lines."""
    arm, disarm = os.path.join(out, "arm"), os.path.join(out, "disarm")
    while not os.path.exists(disarm):
        _state["armed"] = os.path.exists(arm)
        time.sleep(POLL_SECONDS)
    was_armed = _state["armed"]
    _state["armed"] = False
    time.sleep(SETTLE_SECONDS)
    if not was_armed:
        return  # started after the window, or never reached it: nothing to say
    record = {
        "argv": list(sys.argv),
        "pid": os.getpid(),
        "lines": {name: sorted(seen) for name, seen in list(_lines.items())},
    }
    path = os.path.join(out, f"{os.getpid()}.json")
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".part", path)
