"""Checkpoint files: written atomically (temp file, fsync, rename), read without unpickling code,
kept in pairs with their replay snapshots, and what a failed write tells the operator.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers, so a checkpoint
from an untrusted place cannot run code when it is loaded.

A periodic checkpoint ``ckpt-<updates>`` and its replay snapshot ``replay-<updates>.npz`` are one
pair: the snapshot is written first, the checkpoint second, and ``latest`` moves last, so whatever
checkpoint a resume finds (``latest``, or an older one when ``latest`` is torn) has its own
snapshot beside it. Pairs are kept and pruned together.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from zmqrl.errors import ConfigError
from zmqrl.replay.memory import format_bytes

CHECKPOINT_FORMAT = 1  # bump when the payload layout changes

PERIODIC_PREFIX = "ckpt-"  # periodic checkpoints: ckpt-<updates, 10 digits>; the newest k are kept
LATEST = "latest"  # the newest checkpoint (a hard link to the newest periodic one when possible)
BEST = "best"  # the best-evaluated weights (written by the learner, or by the evaluator)
REPLAY_PREFIX = "replay-"  # replay snapshots: replay-<updates, 10 digits>.npz, one per ckpt-<updates>
REPLAY_SUFFIX = ".npz"
LEGACY_REPLAY = "replay.npz"  # the one snapshot of earlier versions (stamped inside with its updates)
# Temp files are ".<name><marker><pid>-<random hex>": a write in progress, or left by a process
# killed mid-write (earlier versions left ".<name><marker><pid>": removed just the same).
TEMP_MARKERS = (".tmp-", ".link-")
TEMP_RANDOM_BYTES = 8  # of the temp name's random part: no one can plant a file at it beforehand
TEMP_NAME_TRIES = 16  # names tried before giving up (each is taken only by a planted or leftover file)
# errno values that mean "no room" (said as such in the error; any other OSError is reported too).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# errno values a retry can outlast: an NFS server away for a moment (EIO, ETIMEDOUT), a file handle
# gone stale under a failover (ESTALE: the retry opens the path afresh), a busy or interrupted call.
# Anything else (ENOSPC, EDQUOT, EROFS, EACCES, ENOENT...) is for the operator: exit 2 at once.
TRANSIENT = frozenset(
    {errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOLCK}
)
WRITE_ATTEMPTS = 4  # tries of one checkpoint file's write while its errors are TRANSIENT
RETRY_FIRST_SECONDS = 0.5  # the wait after a first transient failure, doubled after each (0.5, 1, 2 s)

log = logging.getLogger("zmqrl.checkpoints")
T = TypeVar("T")


class CheckpointWriteError(ConfigError):
    """A checkpoint (or a file beside it) could not be written: a full disk, a quota, a read-only
    or vanished directory. In the ConfigError family for its exit: 2, with one line, as a restart
    cannot help; freeing space, lowering ``checkpoint.keep`` / ``checkpoint.replay_max_mb`` or
    moving ``run.dir`` does, then the run continues from its last complete checkpoint."""


class CheckpointStorageError(RuntimeError):
    """A checkpoint write kept failing with a transient errno (``TRANSIENT``) for all of its
    ``WRITE_ATTEMPTS``: not the operator's setting, so not exit 2, but a failure (exit 1) that a
    restarted process (a new mount's view, later) may not meet; the restart cap bounds it."""


def write_failure(what: Path, exc: OSError, run_dir: Path, needed: int | None = None) -> CheckpointWriteError:
    """The one-line error for an OSError writing ``what`` (a file of the run in ``run_dir``): the
    directory, the bytes it needed (when known), the room left there and what to do next."""
    directory = what.parent
    room = ""
    with contextlib.suppress(OSError):
        room = f"{format_bytes(shutil.disk_usage(directory).free)} free there"
    size = f"needs about {format_bytes(needed)}" if needed else ""
    detail = "; ".join(part for part in (size, room) if part)
    reason = exc.strerror or type(exc).__name__
    code = f" [{errno.errorcode.get(exc.errno, exc.errno)}]" if exc.errno else ""
    fix = (
        "free space there, or lower checkpoint.keep or checkpoint.replay_max_mb (checkpoint.replay=false "
        "saves no replay), or move run.dir"
        if exc.errno in NO_ROOM
        else "make it writable, or move run.dir"
    )
    return CheckpointWriteError(
        f"cannot write {what.name} in {directory}: {reason}{code}"
        + (f" ({detail})" if detail else "")
        + f"; {fix}; then continue the run from its last complete checkpoint: zmqrl launch --resume {run_dir}"
    )


@dataclass
class WriteRetries:
    """Runs one checkpoint file's write, again after a transient OSError (``TRANSIENT``), at most
    ``attempts`` times with doubling waits; says each retry in one warning line and counts them.
    Any other OSError becomes the one-line ``CheckpointWriteError`` (exit 2) at once; transient
    ones that last past the attempts, ``CheckpointStorageError`` (exit 1). Every writer of the run's
    checkpoints (the learner's pairs and ``best``, the evaluator's ``best``) goes through one."""

    # Read when one is made (not when this class is defined), so a test can shorten them for all.
    attempts: int = field(default_factory=lambda: WRITE_ATTEMPTS)
    first_wait: float = field(default_factory=lambda: RETRY_FIRST_SECONDS)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)  # tests pass a fake
    retried: int = 0  # retries made so far (each one logged)

    def run(self, write: Callable[[], T], what: Path, run_dir: Path, needed: int | None = None) -> T:
        """``write()``'s result; ``what`` (a file of the run in ``run_dir``, ``needed`` bytes)
        names the file in the log line and the error."""
        wait = self.first_wait
        for attempt in range(1, self.attempts + 1):
            try:
                return write()
            except OSError as exc:
                if exc.errno not in TRANSIENT:
                    raise write_failure(what, exc, run_dir, needed) from exc
                code = errno.errorcode.get(exc.errno or 0, exc.errno)
                said = f"{exc.strerror or type(exc).__name__} [{code}]"
                if attempt == self.attempts:
                    raise CheckpointStorageError(
                        f"cannot write {what.name} in {what.parent}: {said}, {self.attempts} times in a row; "
                        "the storage is failing: a restart continues from the last complete checkpoint "
                        "(check the file system, or its server, if it goes on)"
                    ) from exc
                self.retried += 1
                log.warning(
                    "writing %s failed (%s): retry %d of %d in %.1f s (%d checkpoint write retries so far)",
                    what,
                    said,
                    attempt,
                    self.attempts - 1,
                    wait,
                    self.retried,
                )
                self.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")


def _temp_name(path: Path, marker: str) -> Path:
    """A temp name beside ``path`` that no one could have guessed before (see the module doc)."""
    return path.with_name(f".{path.name}{marker}{os.getpid()}-{secrets.token_hex(TEMP_RANDOM_BYTES)}")


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path``, opened for writing: created here (O_EXCL), never through a
    symlink (O_NOFOLLOW), with the mode a plain open gives (0666 less the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(TEMP_NAME_TRIES):
        tmp = _temp_name(path, TEMP_MARKERS[0])
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temp name beside {path} in {TEMP_NAME_TRIES} tries")


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file with ``write`` so that a reader sees either the old file or the new one. A failed
    write (a full disk) removes its temp file, so repeated failures do not fill the disk further."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make the renames and links in ``directory`` durable (its entries survive a machine crash)."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (an OSError propagates: see ``write_failure``)."""
    import torch  # here, not at the top: an evaluator of a numpy policy starts without torch

    atomic_write(path, lambda f: torch.save({"format": CHECKPOINT_FORMAT, **payload}, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The payload of a checkpoint; ``ValueError`` for a torn, corrupt or foreign file."""
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as exc:  # torch raises many different exception types for bad bytes
        raise ValueError(
            f"{path}: not a readable zmqrl checkpoint: corrupt, truncated or not written by zmqrl "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a zmqrl checkpoint (format {CHECKPOINT_FORMAT})")
    return payload


def checkpoint_weights_version(payload: Mapping[str, Any]) -> int:
    """The weights version a checkpoint's weights were published as (0: none): a learner's
    ``weights_version`` (an agent's state held it as ``version`` in earlier releases), an
    evaluator's weights-only ``version``."""
    for version in (payload.get("weights_version"), payload.get("version")):
        if version is not None:
            return int(version)
    agent = payload.get("agent")
    return int(agent.get("version", 0)) if isinstance(agent, Mapping) else 0


def periodic_name(updates: int) -> str:
    return f"{PERIODIC_PREFIX}{updates:010d}"


def replay_name(updates: int) -> str:
    """The replay snapshot paired with ``ckpt-<updates>``."""
    return f"{REPLAY_PREFIX}{updates:010d}{REPLAY_SUFFIX}"


def save_periodic(directory: Path, updates: int, payload: dict[str, Any], keep: int) -> Path:
    """Save ``ckpt-<updates>``, point ``latest`` at it (atomically), then keep only the newest
    ``keep`` periodic files and their replay snapshots, so that a torn or corrupt newest file still
    leaves older pairs to resume from. The caller wrote this checkpoint's snapshot before."""
    path = directory / periodic_name(updates)
    save_checkpoint(path, payload)
    tmp = _temp_name(directory / LATEST, TEMP_MARKERS[1])  # os.link never follows (nor replaces) a file there
    try:
        os.link(path, tmp)
        os.replace(tmp, directory / LATEST)
        sync_directory(directory)
    except OSError:  # no hard links here (or no room for the link): write `latest` as a second copy
        tmp.unlink(missing_ok=True)
        save_checkpoint(directory / LATEST, payload)
    prune(directory, keep, written=updates)
    return path


def _stamp(path: Path, prefix: str, suffix: str = "") -> int | None:
    digits = path.name[len(prefix) : len(path.name) - len(suffix)]
    return int(digits) if digits.isdigit() else None


def prune(directory: Path, keep: int | None, written: int | None = None) -> list[Path]:
    """Delete periodic checkpoints beyond the newest ``keep``, and every replay snapshot whose
    checkpoint is gone (pruned, or never written: a crash between the two files); after a write
    (``keep`` given) the one snapshot of earlier versions too. ``keep`` None (at start, before a
    resume) touches no checkpoint. ``written``: the checkpoint just written; any above it is one a
    resume fell back past (its snapshot was damaged), abandoned by this run: deleted, else it would
    count among the newest ``keep`` and push out the pairs written since. Returns what it deleted.
    Only the learner calls this, never while one of its writes is in flight."""
    periodic = sorted(directory.glob(f"{PERIODIC_PREFIX}*"))
    above: list[Path] = []
    if written is not None:
        above = [p for p in periodic if (_stamp(p, PERIODIC_PREFIX) or 0) > written]
        periodic = [p for p in periodic if p not in above]
    removed = [*above, *(periodic[:-keep] if keep is not None else [])]
    kept = {_stamp(p, PERIODIC_PREFIX) for p in periodic if p not in removed}
    for snapshot in directory.glob(f"{REPLAY_PREFIX}*{REPLAY_SUFFIX}"):
        if _stamp(snapshot, REPLAY_PREFIX, REPLAY_SUFFIX) not in kept:
            removed.append(snapshot)
    if keep is not None and (directory / LEGACY_REPLAY).is_file():
        removed.append(directory / LEGACY_REPLAY)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def remove_stale_temps(directory: Path, names: Iterable[str]) -> list[tuple[Path, int]]:
    """Delete temp files that writes of ``names`` (exact names, or prefixes ending in ``-``) left
    behind when their process was killed mid-write; returns each with its size. Call it before this
    process writes any of them: another process's temp files (the evaluator's ``best``) are only
    touched when ``names`` includes them."""
    wanted = tuple(names)
    found: list[tuple[Path, int]] = []
    if not directory.is_dir():
        return found
    for path in directory.iterdir():
        name = path.name
        marker = next((m for m in TEMP_MARKERS if m in name), None)
        if not name.startswith(".") or marker is None:
            continue
        target = name[1 : name.rindex(marker)]
        if not any(target == w or (w.endswith("-") and target.startswith(w)) for w in wanted):
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        found.append((path, size))
    return found


def resumable_checkpoints(directory: Path, log: Any = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The checkpoints that load, newest first: ``latest``, then periodic ones newest first, each
    file once (``latest`` is mostly a hard link to the newest periodic one). Unreadable ones (torn
    by a crash mid-write on another file system, corrupted on disk) are skipped with a warning."""
    candidates = [directory / LATEST, *sorted(directory.glob(f"{PERIODIC_PREFIX}*"), reverse=True)]
    seen: set[tuple[int, int]] = set()
    for path in candidates:
        try:
            stat = path.stat()
        except OSError:
            continue
        if not path.is_file() or (stat.st_dev, stat.st_ino) in seen:
            continue
        try:
            payload = load_checkpoint(path)
        except (ValueError, OSError) as exc:
            if log is not None:
                log.warning("skipping checkpoint %s: %s", path, exc)
            continue
        seen.add((stat.st_dev, stat.st_ino))
        yield path, payload


def load_resumable(directory: Path, log: Any = None) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that loads (see ``resumable_checkpoints``). FileNotFoundError when
    there is none."""
    for found in resumable_checkpoints(directory, log):
        return found
    raise FileNotFoundError(f"no readable checkpoint in {directory}")
