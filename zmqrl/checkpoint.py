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
