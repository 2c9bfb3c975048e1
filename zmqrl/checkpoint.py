"""Checkpoints written atomically (temp file, fsync, rename) and read without unpickling code.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers, so a checkpoint
from an untrusted place cannot run code when it is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = 1  # bump when the payload layout changes


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` so that a reader sees either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save({"format": CHECKPOINT_FORMAT, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The payload of a checkpoint; ``ValueError`` for a torn, corrupt or foreign file."""
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


PERIODIC_PREFIX = "ckpt-"  # periodic checkpoints: ckpt-<updates, 10 digits>; the newest k are kept
LATEST = "latest"  # the newest checkpoint (a hard link to the newest periodic one when possible)


def save_periodic(directory: Path, updates: int, payload: dict[str, Any], keep: int) -> Path:
    """Save ``ckpt-<updates>``, point ``latest`` at it (atomically) and keep only the newest ``keep``
    periodic files, so that a torn or corrupt newest file still leaves older ones to resume from."""
    path = directory / f"{PERIODIC_PREFIX}{updates:010d}"
    save_checkpoint(path, payload)
    tmp = directory / f".{LATEST}.link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
        os.replace(tmp, directory / LATEST)
    except OSError:  # no hard links here: write `latest` as a second copy
        tmp.unlink(missing_ok=True)
        save_checkpoint(directory / LATEST, payload)
    for old in sorted(directory.glob(f"{PERIODIC_PREFIX}*"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_resumable(directory: Path, log: Any = None) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that loads: ``latest`` first, then periodic ones newest first.
    Unreadable ones (torn by a crash mid-write on another file system, corrupted on disk) are
    skipped with a warning. FileNotFoundError when there is none."""
    candidates = [directory / LATEST, *sorted(directory.glob(f"{PERIODIC_PREFIX}*"), reverse=True)]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            return path, load_checkpoint(path)
        except (ValueError, OSError) as exc:
            if log is not None:
                log.warning("skipping checkpoint %s: %s", path, exc)
    raise FileNotFoundError(f"no readable checkpoint in {directory}")
