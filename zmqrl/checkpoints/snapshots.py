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

A write that fails for want of room (or any OSError a retry cannot outlast) becomes one
``CheckpointWriteError``: the learner exits 2 with its line instead of being restarted into the same
full disk; a transient one (an NFS hiccup) is retried first (zmqrl.checkpoints.files.WriteRetries).

A snapshot is read back as untrusted input: whole (every column decompressed, its CRC checked)
and checked against the run's spec and its checkpoint's record before anything is restored, so a
damaged one is refused with one reason instead of a traceback, and replay is never half-filled.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.checkpoints.files import (
    LEGACY_REPLAY,
    CheckpointStorageError,
    CheckpointWriteError,
    WriteRetries,
    atomic_write,
    periodic_name,
    replay_name,
    save_periodic,
)
from zmqrl.replay.memory import format_bytes
from zmqrl.replay.sequences import sequence_columns
from zmqrl.runtime.guard import start_guarded
from zmqrl.spec import SampleSpec
from zmqrl.transport.decoding import validate_content
from zmqrl.transport.messages import WireError
from zmqrl.transport.record_columns import SEPARATOR, split
from zmqrl.types import SEQUENCE_FIELDS, SequenceBatch, TransitionBatch, to_records

# What a snapshot holds: transitions, or R2D2's windows (a run whose spec has a sequence_length).
SnapshotRows = TransitionBatch | SequenceBatch

# How often a caller waiting for a write (write_now with tick) reports progress.
TICK_SECONDS = 0.5

log = logging.getLogger("zmqrl.learner")

# Checkpoint payload key: the paired replay snapshot's row count and total_added, or None when none
# was saved (absent: a checkpoint of earlier versions, whose one snapshot is LEGACY_REPLAY).
REPLAY_ENTRY = "replay_snapshot"

# What np.load raises reading a damaged .npz: found by truncating a real snapshot at every length
# and flipping its bits at random (BadZipFile for a bad CRC or directory, zlib.error, EOFError,
# KeyError for a lost member, ValueError, NotImplementedError / RuntimeError for a flipped flag
# byte), plus what reading a file can raise at all (OSError) and the conversions below (TypeError,
# OverflowError), and MemoryError for a header claiming a huge shape.
UNREADABLE = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    KeyError,
    ValueError,
    TypeError,
    RuntimeError,
    OverflowError,
    MemoryError,
)

# A step of one pair's write (zmqrl.checkpoints.files.save_periodic's signature): tests inject failures here.
SaveCheckpoint = Callable[[Path, int, dict[str, Any], int], Path]


def detached(payload: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a checkpoint payload: the agent's state_dict holds the live tensors, which
    training goes on changing while the copy is written."""
    return copy.deepcopy(payload)


def write_replay_snapshot(path: Path, snap: SnapshotRows, updates: int, total_added: int) -> None:
    """Atomic (temp file, fsync, rename); stamped inside with the checkpoint's ``updates``."""
    atomic_write(
        path,
        lambda f: np.savez_compressed(
            f,
            updates=np.int64(updates),
            total_added=np.int64(total_added),
            # Dict observations as one array per key (obs.image, ...), as the wire carries them.
            **{key: arr for name, col in snap._asdict().items() for key, arr in split(name, col)},
        ),
    )


class SnapshotUnfit(ValueError):
    """A replay snapshot that cannot be restored: unreadable, of another checkpoint, or not of
    this run's spec. Its message is the reason, a short phrase for the resume's warning line."""


def read_replay_snapshot(
    path: Path, updates: int, spec: SampleSpec, record: Mapping[str, Any] | None = None
) -> tuple[SnapshotRows, int]:
    """The snapshot of the checkpoint at ``updates`` and its ``total_added``, read whole and
    checked: against ``spec`` (shapes, dtypes, lengths, values) and the checkpoint's ``record``
    of it (its rows and total_added; None for the one snapshot of earlier versions). Raises
    ``SnapshotUnfit`` saying why not; nothing is restored before it returns."""
    try:
        with np.load(path, allow_pickle=False) as data:
            stamp = int(data["updates"])
            total_added = int(data["total_added"])
            names = TransitionBatch._fields if spec.sequence_length is None else SEQUENCE_FIELDS
            columns = [_column(data, name, spec) for name in names]  # read, CRC checked
    except UNREADABLE as exc:
        said = " ".join(str(exc).split())[:160]
        raise SnapshotUnfit(f"is unreadable ({type(exc).__name__}: {said})") from exc
    if stamp != updates:
        raise SnapshotUnfit(f"belongs to the checkpoint at {stamp} updates, not {updates}")
    batch: SnapshotRows = (
        TransitionBatch(*columns) if spec.sequence_length is None else SequenceBatch(*columns)
    )
    problem = snapshot_problem(batch, spec)
    if problem is None and record is not None:
        rows, total = record.get("rows"), record.get("total_added")
        if rows != batch.size or total != total_added:
            problem = f"{batch.size} rows, {total_added} added in all; its checkpoint says {rows} and {total}"
    if problem is not None:
        raise SnapshotUnfit(f"does not fit this run: {problem}")
    return batch, total_added


def _column(data: Any, name: str, spec: SampleSpec) -> np.ndarray:
    """Column ``name`` of a snapshot: as stored, or, for this run's Dict observations, its keys'
    arrays (``obs.<key>``) as records (a key the file lacks is a KeyError: unreadable)."""
    if not spec.obs_entries or name not in RECORD_COLUMNS:
        return np.asarray(data[name])
    parts = {e.key: np.asarray(data[f"{name}{SEPARATOR}{e.key}"]) for e in spec.obs_entries}
    return to_records(parts, spec.obs_np_dtype)


# The snapshot columns that hold observations (records in a Dict observation run).
RECORD_COLUMNS = ("obs", "next_obs")


@dataclass
class PairReplay:
    """What a checkpoint's replay snapshot brings back: rows read whole and checked (``batch``), or
    why none (``said``); ``whole``: the pair can be resumed (its snapshot read, or none was due)."""

    whole: bool
    said: str  # the resume line's replay part: "342 rows from replay-...npz", "empty (why)"
    name: str | None = None  # the snapshot's file name, when the checkpoint has one
    batch: SnapshotRows | None = None
    total_added: int = 0


def pair_replay(
    directory: Path, payload: Mapping[str, Any], spec: SampleSpec, refused: set[str]
) -> PairReplay:
    """The replay snapshot of the checkpoint ``payload`` (in ``directory``), read whole and checked,
    or why it has none; ``refused``: snapshots found unfit already (not read again). The one
    snapshot of earlier versions (no record in the checkpoint) belongs to one checkpoint only:
    without it that checkpoint still resumes, with an empty replay. Reads; restores nothing."""
    updates = int(payload["counters"]["updates"])
    entry = payload.get(REPLAY_ENTRY, ...)
    if entry is None:
        return PairReplay(
            True, "empty (this checkpoint was saved without replay: checkpoint.replay was false)"
        )
    legacy = not isinstance(entry, Mapping)
    name = LEGACY_REPLAY if legacy else replay_name(updates)
    snapshot = directory / name
    if name in refused:  # said already
        return PairReplay(False, f"its replay snapshot {name} does not read whole", name)
    if not snapshot.is_file():
        return PairReplay(
            legacy, f"empty ({name} is missing)" if legacy else f"its replay snapshot {name} is missing", name
        )
    try:
        batch, total_added = read_replay_snapshot(snapshot, updates, spec, None if legacy else entry)
    except SnapshotUnfit as exc:
        if legacy:
            log.warning("replay snapshot %s not restored: %s", snapshot, exc)
            return PairReplay(True, f"empty ({name} {exc})", name)
        return PairReplay(False, f"its replay snapshot {name} {exc}", name)
    return PairReplay(True, f"{batch.size} rows from {name}", name, batch, total_added)


def snapshot_problem(batch: SnapshotRows, spec: SampleSpec) -> str | None:
    """What makes a snapshot's columns unfit for this run's replay, or None: each column's shape
    and dtype as the spec (and replay) have them, one length for all, and values the run can mean
    (the checks received samples pass: a file is as untrusted as a peer)."""
    if isinstance(batch, SequenceBatch):
        return _windows_problem(batch, spec)
    if batch.reward.ndim != 1:
        return f"reward has shape {batch.reward.shape}, not (rows,)"
    n = batch.size
    want: dict[str, tuple[tuple[int, ...], Any]] = {
        "obs": ((n, *spec.obs_shape), spec.obs_np_dtype),
        "action": ((n, *spec.action_shape), spec.action_dtype),
        "reward": ((n,), "float32"),
        "next_obs": ((n, *spec.obs_shape), spec.obs_np_dtype),
        "discount": ((n,), "float32"),
    }
    for name, column in zip(TransitionBatch._fields, batch, strict=True):
        shape, dtype = want[name]
        if column.shape != shape or column.dtype != np.dtype(dtype):
            return f"{name} is {column.dtype} {column.shape}, this run's replay holds {dtype} {shape}"
    return _content_problem(batch, spec) if n else None


def _windows_problem(batch: SequenceBatch, spec: SampleSpec) -> str | None:
    """``snapshot_problem`` for R2D2's windows: the replay's row shapes, then the wire's checks."""
    rows = batch.reward.shape[0] if batch.reward.ndim == 2 else -1
    for (name, (shape, dtype)), column in zip(sequence_columns(spec).items(), batch, strict=True):
        if column.shape != (rows, *shape) or column.dtype != np.dtype(dtype):
            return f"{name} is {column.dtype} {column.shape}, this run's replay holds {dtype} (rows, {shape})"
    return _content_problem(batch, spec) if rows else None


def _content_problem(batch: TransitionBatch | SequenceBatch, spec: SampleSpec) -> str | None:
    """What the wire's value checks say about a snapshot's rows (as about a message's), or None."""
    try:
        validate_content(batch, None, spec)
    except WireError as exc:
        return str(exc)
    return None


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
        retries: WriteRetries | None = None,
    ) -> None:
        self.directory = directory
        self.keep = keep
        self._on_crash = on_crash
        self._before_write = before_write  # a test hook: make writes slow
        self.save = save  # the checkpoint half of a pair (a seam: tests inject failures)
        self.between = between  # runs after the snapshot, before the checkpoint (a test seam)
        self.retries = retries or WriteRetries()  # transient errors (NFS) tried again; counted there
        self._thread: threading.Thread | None = None
        self.written = 0
        self.skipped = 0

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, updates: int, payload: dict[str, Any], snap: SnapshotRows | None, total_added: int
    ) -> bool:
        """Start writing copies already taken by the caller; False (skipped) while one is in flight."""
        if self.busy:
            self.skipped += 1
            log.info("checkpoint at %d updates skipped: the previous one is still being written", updates)
            return False

        def write() -> None:
            try:
                self._write(updates, payload, snap, total_added)
            except (CheckpointWriteError, CheckpointStorageError) as exc:  # said in one line, no traceback
                self._on_crash(exc)

        self._thread = start_guarded(write, "checkpoint-writer", self._on_crash)
        return True

    def write_now(
        self,
        updates: int,
        payload: dict[str, Any],
        snap: SnapshotRows | None,
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
        self, updates: int, payload: dict[str, Any], snap: SnapshotRows | None, total_added: int
    ) -> None:
        """The pair, snapshot first, each file's write retried on a transient error; any other
        OSError becomes a CheckpointWriteError naming the file."""
        if self._before_write is not None:
            self._before_write()
        started = time.monotonic()
        run_dir, checkpoint, size = self.directory.parent, self.directory / periodic_name(updates), 0
        self.retries.run(lambda: self.directory.mkdir(parents=True, exist_ok=True), checkpoint, run_dir)
        if snap is not None:
            snapshot = self.directory / replay_name(updates)
            needed = sum(column.nbytes for column in snap)  # an upper bound: it is compressed

            def write_snapshot() -> int:
                write_replay_snapshot(snapshot, snap, updates, total_added)
                return snapshot.stat().st_size

            size = self.retries.run(write_snapshot, snapshot, run_dir, needed)
        if self.between is not None:
            self.between(updates)
        self.retries.run(
            lambda: self.save(self.directory, updates, payload, self.keep),
            checkpoint,
            run_dir,
            payload_bytes(payload),
        )
        self.written += 1
        if snap is not None:
            log.info(
                "checkpoint %s written with its replay snapshot (%d rows, %s) in %.2f s",
                periodic_name(updates),
                snap.size,
                format_bytes(size),
                time.monotonic() - started,
            )
