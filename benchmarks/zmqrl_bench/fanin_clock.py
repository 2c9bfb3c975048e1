"""When the learner publishes each weights version, seen from outside its process.

The wire carries no send time, and the fan-in benchmark must not change the wire or the learner.
But the learner writes every new version number to ``RUN_DIR/weights-version`` just before it
sends that version (zmqrl.learner.versions: on disk before any actor can hold it), and Linux
reports each write to a watcher at once (inotify). So :class:`PublishClock` watches the run
directory from a thread of the bench, and on each write to that file takes the monotonic time and
reads the version the file now holds. Publish to arrival at a subscriber is then measured from
that write: it includes the learner's encoding and send, ZeroMQ's fan-out to every subscriber, the
loopback and the subscriber's wake-up, plus the watcher's own wake-up here (the same order as a
subscriber's, on the same CPUs).

Where inotify is missing (not Linux) or the file is never written (a learner that keeps its
versions elsewhere), the clock holds nothing and the bench says so and measures arrival spread
(each arrival against the first arrival of the same version) instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import threading
import time
from pathlib import Path

# The learner's version file in the run directory (zmqrl.learner.versions.VERSION_FILE; read as a
# file name only, so this module does not import the learner).
VERSION_FILE = "weights-version"
# inotify's event for a write to a file in a watched directory, and its init flags.
IN_MODIFY = 0x00000002
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
# struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name.
EVENT_HEADER = struct.Struct("iIII")
# Bytes read per wake-up (events are 16 bytes plus a short name).
READ_BYTES = 64 * 1024
# How often the watching thread looks at its stop flag (milliseconds).
POLL_MS = 100


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1  # noqa: B018 - raises AttributeError where there is no inotify
    except (OSError, AttributeError):
        return None
    return libc


def read_version(path: Path) -> int | None:
    """The highest published version the file names (its first number); None if unreadable."""
    try:
        words = path.read_bytes()[:96].split()
        return int(words[0]) if words else None
    except (OSError, ValueError):
        return None


def event_names(buffer: bytes) -> list[str]:
    """The file names of the inotify events in ``buffer``."""
    names, offset = [], 0
    while offset + EVENT_HEADER.size <= len(buffer):
        _wd, _mask, _cookie, length = EVENT_HEADER.unpack_from(buffer, offset)
        start = offset + EVENT_HEADER.size
        names.append(buffer[start : start + length].rstrip(b"\0").decode(errors="replace"))
        offset = start + length
    return names


class PublishClock:
    """Monotonic times of the learner's publishes, by version (``times``), from a watching thread."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / VERSION_FILE
        self.times: dict[int, float] = {}
        self.available = False
        self._stop = threading.Event()
        self._fd = -1
        libc = _libc()
        if libc is None:
            return
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(run_dir), IN_MODIFY) < 0:
            os.close(fd)
            return
        self._fd = fd
        self.available = True
        self._thread = threading.Thread(target=self._run, name="bench-publish-clock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            now = time.monotonic()
            try:
                buffer = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                continue
            if VERSION_FILE in event_names(buffer):
                version = read_version(self.path)
                if version is not None and version not in self.times:
                    self.times[version] = now

    def close(self) -> None:
        if not self.available:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._fd)
