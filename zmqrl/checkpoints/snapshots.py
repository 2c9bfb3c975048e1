"""The learner's checkpoints written off its training thread, each with its own replay snapshot.

Compressing a replay snapshot takes seconds per hundred MB; done on the training thread it stops
training (and, before heartbeats had a thread of their own, made a busy learner look dead). The
learner takes copies under its lock (agent state cloned, replay rows gathered: both fast), and a
guarded background thread writes the pair: ``replay-<updates>.npz`` first, ``ckpt-<updates>``
second, ``latest`` last (zmqrl.checkpoints.files). A crash anywhere in between leaves the previous pair
whole, and a resume that falls back to an older checkpoint finds that checkpoint's own snapshot.
One write in flight at a time: a checkpoint that comes due while one is still being written is
taken at the first update after that write ends (zmqrl.learner.checkpointing), and the final one
waits.

A write that fails for want of room (or any OSError) becomes one ``CheckpointWriteError``: the
learner exits 2 with its line instead of being restarted into the same full disk.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.checkpoints.files import (
    CheckpointWriteError,
    atomic_write,
    periodic_name,
    replay_name,
    save_periodic,
    write_failure,
)
from zmqrl.replay.memory import format_bytes
from zmqrl.runtime.guard import start_guarded
from zmqrl.types import TransitionBatch

# How often a caller waiting for a write (write_now with tick) reports progress.
TICK_SECONDS = 0.5

log = logging.getLogger("zmqrl.learner")

# A step of one pair's write (zmqrl.checkpoints.files.save_periodic's signature): tests inject failures here.
SaveCheckpoint = Callable[[Path, int, dict[str, Any], int], Path]


def detached(payload: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a checkpoint payload: the agent's state_dict holds the live tensors, which
    training goes on changing while the copy is written."""
    return copy.deepcopy(payload)


def write_replay_snapshot(path: Path, snap: TransitionBatch, updates: int, total_added: int) -> None:
    """Atomic (temp file, fsync, rename); stamped inside with the checkpoint's ``updates``."""
    atomic_write(
        path,
        lambda f: np.savez_compressed(
            f, updates=np.int64(updates), total_added=np.int64(total_added), **snap._asdict()
        ),
    )


def read_replay_snapshot(path: Path, updates: int) -> tuple[TransitionBatch, int] | None:
    """The snapshot and its ``total_added`` if it belongs to the checkpoint at ``updates``; None if
    it is from another checkpoint. Raises OSError / ValueError / KeyError when unreadable."""
    with np.load(path, allow_pickle=False) as data:
        if int(data["updates"]) != updates:
            return None
        batch = TransitionBatch(*(data[name] for name in TransitionBatch._fields))
        return batch, int(data["total_added"])


def payload_bytes(payload: Any) -> int:
    """Roughly what a payload takes on disk: the bytes of its tensors (for a full disk's message)."""
    if isinstance(payload, dict):
        return sum(payload_bytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(v) for v in payload)
    if hasattr(payload, "element_size") and hasattr(payload, "numel"):
        return int(payload.element_size() * payload.numel())
    return 0


class CheckpointWriter:
    """Writes (replay snapshot, checkpoint) pairs in a background thread, one at a time."""

    def __init__(
        self,
        directory: Path,
        keep: int,
        on_crash: Callable[[BaseException], None],
        before_write: Callable[[], None] | None = None,
        save: SaveCheckpoint = save_periodic,
        between: Callable[[int], None] | None = None,
    ) -> None:
        self.directory = directory
        self.keep = keep
        self._on_crash = on_crash
        self._before_write = before_write  # a test hook: make writes slow
        self.save = save  # the checkpoint half of a pair (a seam: tests inject failures)
        self.between = between  # runs after the snapshot, before the checkpoint (a test seam)
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
            try:
                self._write(updates, payload, snap, total_added)
            except CheckpointWriteError as exc:  # the operator's to fix, not a bug: no traceback
                self._on_crash(exc)

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
        self.wait_ticking(tick)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                self._write(updates, payload, snap, total_added)
            except BaseException as exc:  # re-raised on the caller's thread below
                failed.append(exc)

        self._thread = threading.Thread(target=write, name="checkpoint-final", daemon=True)
        self._thread.start()
        self.wait_ticking(tick)
        if failed:
            raise failed[0]

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_ticking(self, tick: Callable[[], None]) -> None:
        """Wait for the write in flight, calling ``tick`` every TICK_SECONDS meanwhile."""
        while self.busy:
            tick()
            self.wait(TICK_SECONDS)

    def _write(
        self, updates: int, payload: dict[str, Any], snap: TransitionBatch | None, total_added: int
    ) -> None:
        """The pair, snapshot first; any OSError becomes a CheckpointWriteError naming the file."""
        if self._before_write is not None:
            self._before_write()
        started = time.monotonic()
        target, needed, size = self.directory / periodic_name(updates), None, 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if snap is not None:
                target = self.directory / replay_name(updates)
                needed = sum(column.nbytes for column in snap)  # an upper bound: it is compressed
                write_replay_snapshot(target, snap, updates, total_added)
                size = target.stat().st_size
            if self.between is not None:
                self.between(updates)
            target, needed = self.directory / periodic_name(updates), payload_bytes(payload)
            self.save(self.directory, updates, payload, self.keep)
        except OSError as exc:
            raise write_failure(target, exc, self.directory.parent, needed) from exc
        self.written += 1
        if snap is not None:
            log.info(
                "checkpoint %s written with its replay snapshot (%d rows, %s) in %.2f s",
                periodic_name(updates),
                snap.size,
                format_bytes(size),
                time.monotonic() - started,
            )
