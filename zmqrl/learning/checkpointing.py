"""The learner's checkpoints: what goes in one, writing `latest` and `best`, the version file, resuming."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zmqrl import testhooks
from zmqrl.checkpoint import load_resumable, save_checkpoint
from zmqrl.replay import replay_footprint
from zmqrl.snapshots import REPLAY_SNAPSHOT, CheckpointWriter, detached, read_replay_snapshot
from zmqrl.types import TransitionBatch

if TYPE_CHECKING:
    from zmqrl.learning.trainer import Trainer

# File in the run directory: the highest weights version published.
VERSION_FILE = "weights-version"

log = logging.getLogger("zmqrl.learner")


class PublishedVersions:
    """The highest weights version this run ever published, kept in a small file.

    One ``pwrite`` per publish (no fsync): it survives the learner process crashing, which is what
    a restarted learner must number above; a machine crash takes the actors down too."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.highest = int(os.pread(self._fd, 32, 0).decode().strip() or 0)
        except ValueError:
            self.highest = 0

    def record(self, version: int) -> None:
        if version > self.highest:
            self.highest = version
            os.pwrite(self._fd, f"{version:<20d}\n".encode(), 0)

    def close(self) -> None:
        os.close(self._fd)


class Checkpoints:
    """Writes the trainer's state: ``latest`` periodically (in the background when asked, from
    copies taken under the counters' lock) and at the end, ``best`` after an improved evaluation."""

    def __init__(self, trainer: Trainer, on_crash: Callable[[BaseException], None], background: bool) -> None:
        self.trainer = trainer
        self.directory = trainer.run_dir / "checkpoints"
        self.background = background  # serial mode writes each checkpoint before going on
        cfg = trainer.cfg.checkpoint
        self._replay = cfg.replay
        self._replay_rows = int(
            cfg.replay_max_mb * 2**20 / replay_footprint(1, trainer.spec, prioritized=False)
        )
        self.writer = CheckpointWriter(self.directory, cfg.keep, on_crash, _slow_checkpoint_hook)

    def payload(self) -> dict[str, Any]:
        """Everything a resumed learner needs; the caller holds the counters' lock, so that the
        counts agree with each other (and with a replay snapshot taken under the same lock)."""
        t = self.trainer
        return {
            "agent": t.agent.state_dict(),
            "counters": t.counters.to_checkpoint(),
            "eval": t.evals.state(),
            "replay_rng": t.replay.rng_state(),
            "config": t.cfg.to_dict(),
        }

    def save_latest(self, final: bool = False, tick: Callable[[], None] | None = None) -> None:
        """Checkpoint (and replay snapshot) from copies taken under the lock; the final one (and
        every one in serial mode) is on disk before this returns."""
        t = self.trainer
        snap: TransitionBatch | None = None
        with t.counters.lock:  # counters and replay snapshot from the same instant
            payload = detached(self.payload())
            if self._replay:
                snap = t.replay.snapshot(self._replay_rows)  # as saved: dense rows
            total_added = t.replay.total_added
        updates = t.counters.updates
        if final or not self.background:
            # The final write may take longer than supervisor.progress_timeout: ``tick`` keeps
            # reporting progress meanwhile, as this is not a hang.
            self.writer.write_now(updates, payload, snap, total_added, tick=tick if self.background else None)
        else:
            self.writer.submit(updates, payload, snap, total_added)

    def save_best(self) -> None:
        with self.trainer.counters.lock:
            payload = self.payload()
        save_checkpoint(self.directory / "best", payload)

    def restore(self) -> None:
        """Load the newest readable checkpoint (and its replay snapshot) into the trainer."""
        t = self.trainer
        try:
            path, payload = load_resumable(self.directory, log)
        except FileNotFoundError:
            log.warning(
                "asked to resume, but %s holds no readable checkpoint: starting fresh", self.directory
            )
            return
        t.agent.load_state_dict(payload["agent"])
        t.counters.restore(payload["counters"])
        t.evals.load_state(payload.get("eval", {}))
        if payload.get("replay_rng"):
            t.replay.set_rng_state(payload["replay_rng"])
        restored = 0
        snapshot = self.directory / REPLAY_SNAPSHOT
        if self._replay and snapshot.is_file():
            try:
                found = read_replay_snapshot(snapshot, t.counters.updates)
                if found is not None:
                    batch, total_added = found
                    t.replay.restore(batch, total_added)
                    restored = batch.size
                else:
                    log.warning("replay snapshot is from another checkpoint; starting with empty replay")
            except (OSError, ValueError, KeyError) as exc:
                log.warning("replay snapshot %s unreadable (%s); starting with empty replay", snapshot, exc)
        log.info(
            "resumed from %s: %d updates, %d samples, weights version %d, %d transitions in replay",
            path,
            t.counters.updates,
            t.counters.samples,
            t.agent.weights_version,
            restored,
        )


def _slow_checkpoint_hook() -> None:
    delay = testhooks.hook(testhooks.SLOW_CHECKPOINT)
    if delay:
        log.warning("test hook: checkpoint write sleeps %s s", delay)
        time.sleep(float(delay))
