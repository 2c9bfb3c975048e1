"""The learner's checkpoints written off its training thread, replay snapshot included.

Compressing a replay snapshot takes seconds per hundred MB; done on the training thread it stops
training (and, before heartbeats had a thread of their own, made a busy learner look dead). The
learner takes copies under its lock (agent state cloned, replay rows gathered: both fast), and a
guarded background thread writes the replay snapshot first and the checkpoint second, so a
checkpoint on disk always has its snapshot beside it (or an older one, which restore then
refuses by the ``updates`` stamp). One write in flight at a time: a checkpoint that comes due while
one is still being written is skipped (the next interval catches up), and the final one waits.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.checkpoint import save_periodic
from zmqrl.guard import start_guarded
from zmqrl.types import TransitionBatch

# The replay snapshot's file name in the checkpoints directory.
REPLAY_SNAPSHOT = "replay.npz"
# How often a caller waiting for a write (write_now with tick) reports progress.
TICK_SECONDS = 0.5

log = logging.getLogger("zmqrl.learner")


def detached(payload: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a checkpoint payload: the agent's state_dict holds the live tensors, which
    training goes on changing while the copy is written."""
    return copy.deepcopy(payload)


def write_replay_snapshot(path: Path, snap: TransitionBatch, updates: int, total_added: int) -> None:
    """Atomic: temp file, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, updates=np.int64(updates), total_added=np.int64(total_added), **snap._asdict())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_replay_snapshot(path: Path, updates: int) -> tuple[TransitionBatch, int] | None:
    """The snapshot and its ``total_added`` if it belongs to the checkpoint at ``updates``; None if
    it is from another checkpoint. Raises OSError / ValueError / KeyError when unreadable."""
    with np.load(path, allow_pickle=False) as data:
        if int(data["updates"]) != updates:
            return None
        batch = TransitionBatch(*(data[name] for name in TransitionBatch._fields))
        return batch, int(data["total_added"])


class CheckpointWriter:
    """Writes (replay snapshot, checkpoint) pairs in a background thread, one at a time."""

    def __init__(
        self,
        directory: Path,
        keep: int,
        on_crash: Callable[[BaseException], None],
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self.directory = directory
        self.keep = keep
        self._on_crash = on_crash
        self._before_write = before_write  # a test hook: make writes slow
        self._thread: threading.Thread | None = None
        self.written = 0
        self.skipped = 0

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, updates: int, payload: dict[str, Any], snap: TransitionBatch | None, total_added: int
    ) -> bool:
        """Start writing copies already taken by the caller; False (skipped) while one is in flight."""
        if self.busy:
            self.skipped += 1
            log.info("checkpoint at %d updates skipped: the previous one is still being written", updates)
            return False

        def write() -> None:
            self._write(updates, payload, snap, total_added)

        self._thread = start_guarded(write, "checkpoint-writer", self._on_crash)
        return True

    def write_now(
        self,
        updates: int,
        payload: dict[str, Any],
        snap: TransitionBatch | None,
        total_added: int,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Wait for any write in flight, then write this one before returning (the final
        checkpoint at a stop must be on disk before the process exits). With ``tick`` (the link's
        ``progress``), the caller's thread calls it every ``TICK_SECONDS`` while it waits: a
        final replay snapshot can take longer than ``supervisor.progress_timeout``, and a
        learner killed as hung there would be restarted to redo the end of its run, again and again."""
        if tick is None:
            self.wait()
            self._write(updates, payload, snap, total_added)
            return
        self._wait_ticking(tick)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                self._write(updates, payload, snap, total_added)
            except BaseException as exc:  # re-raised on the caller's thread below
                failed.append(exc)

        self._thread = threading.Thread(target=write, name="checkpoint-final", daemon=True)
        self._thread.start()
        self._wait_ticking(tick)
        if failed:
            raise failed[0]

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _wait_ticking(self, tick: Callable[[], None]) -> None:
        while self.busy:
            tick()
            self.wait(TICK_SECONDS)

    def _write(
        self, updates: int, payload: dict[str, Any], snap: TransitionBatch | None, total_added: int
    ) -> None:
        if self._before_write is not None:
            self._before_write()
        self.directory.mkdir(parents=True, exist_ok=True)
        if snap is not None:
            write_replay_snapshot(self.directory / REPLAY_SNAPSHOT, snap, updates, total_added)
        save_periodic(self.directory, updates, payload, self.keep)
        self.written += 1
