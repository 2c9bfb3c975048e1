"""The learner's checkpoints: what goes in one, writing `latest` and `best`, resuming (the version
file is zmqrl.learner.versions)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from zmqrl.checkpoints.files import (
    BEST,
    LATEST,
    LEGACY_REPLAY,
    PERIODIC_PREFIX,
    REPLAY_PREFIX,
    WriteRetries,
    checkpoint_weights_version,
    prune,
    remove_stale_temps,
    resumable_checkpoints,
    save_checkpoint,
)
from zmqrl.checkpoints.snapshots import REPLAY_ENTRY, CheckpointWriter, PairReplay, detached, pair_replay
from zmqrl.config import Config
from zmqrl.core import LearningAgent, Replay
from zmqrl.errors import ConfigError
from zmqrl.evaluator.greedy import EvalTracker
from zmqrl.learner.ingest import LearnerCounters
from zmqrl.learner.versions import VERSION_FILE as VERSION_FILE  # re-exported for the trainer
from zmqrl.learner.versions import PublishedVersions as PublishedVersions
from zmqrl.replay import replay_footprint
from zmqrl.replay.memory import format_bytes
from zmqrl.runtime.testhooks import Faults
from zmqrl.spec import SampleSpec
from zmqrl.transport.fingerprint import FingerprintMismatch, fingerprint_mismatch
from zmqrl.transport.weights_channel import WeightsNumbering
from zmqrl.transport.wire import Fingerprint
from zmqrl.types import SequenceBatch, TransitionBatch

# Fingerprint keys that are config settings (the others, obs.* and action.*, follow from env.*):
# the ones a resume compares with the checkpoint's stored config.
SETTING_SECTIONS = ("env", "agent")

log = logging.getLogger("zmqrl.learner")


class Checkpointed(Protocol):
    """What a checkpoint is made of and restored into: the trainer, as this module sees it (so
    that it needs no import of the trainer, which builds it)."""

    cfg: Config
    run_dir: Path
    spec: SampleSpec
    fingerprint: Fingerprint
    agent: LearningAgent
    counters: LearnerCounters
    evals: EvalTracker
    replay: Replay
    numbering: WeightsNumbering

    @property
    def evaluates(self) -> bool: ...


class Checkpoints:
    """Writes the trainer's state: ``latest`` periodically (in the background when asked, from
    copies taken under the counters' lock) and at the end, each with its replay snapshot, and
    ``best`` after an improved evaluation; restores the newest readable pair on resume."""

    def __init__(
        self,
        trainer: Checkpointed,
        on_crash: Callable[[BaseException], None],
        background: bool,
        faults: Faults | None = None,
    ) -> None:
        self.trainer = trainer
        self._faults = faults
        self.directory = trainer.run_dir / "checkpoints"
        self.background = background  # serial mode writes each checkpoint before going on
        cfg = trainer.cfg.checkpoint
        row_bytes = replay_footprint(1, trainer.spec, prioritized=False)
        self._replay_rows = int(cfg.replay_max_mb * 2**20 // row_bytes) if cfg.replay else 0
        self.retries = WriteRetries()  # transient write errors, retried: the pairs' and best's alike
        self.writer = CheckpointWriter(
            self.directory,
            cfg.keep,
            on_crash,
            faults.slow_checkpoint if faults is not None else None,
            between=self._torn_pair if faults is not None else None,
            retries=self.retries,
        )
        self.held_seconds = 0.0  # how long the last save_latest held the training thread (copies)
        self._owed = False  # a checkpoint came due while the previous one was still being written
        self.deferred = 0  # how many did (each written at the first update after the write ended)
        # What restore() brought back (None: a fresh start), for the final stats: a restarted
        # learner's stats say where it resumed from, so no one has to read it out of the log.
        self.resumed_from: dict[str, Any] | None = None
        self._replay_file: str | None = None  # the snapshot restore() refilled replay from
        self._clean_up()
        self._say_replay_plan(row_bytes)

    def _clean_up(self) -> None:
        """Remove what interrupted writes left: temp files (a learner killed mid-write, over and
        over on a full disk, would otherwise fill it) and snapshots whose checkpoint never came."""
        mine = [PERIODIC_PREFIX, REPLAY_PREFIX, LATEST, LEGACY_REPLAY]
        if self.trainer.evaluates:  # else `best` is the evaluator's, maybe being written right now
            mine.append(BEST)
        stale = remove_stale_temps(self.directory, mine)
        if stale:
            log.info(
                "removed %d temp file(s) (%s) left by interrupted checkpoint writes in %s",
                len(stale),
                format_bytes(sum(size for _, size in stale)),
                self.directory,
            )
        if self.directory.is_dir():
            for orphan in prune(self.directory, keep=None):
                log.info("removed %s: its checkpoint was never written", orphan)

    def _say_replay_plan(self, row_bytes: int) -> None:
        """One line at start: how much replay each checkpoint keeps, and what that costs on disk."""
        cfg = self.trainer.cfg
        if not cfg.checkpoint.replay:
            log.info("checkpoint.replay is false: checkpoints save no replay; a resumed learner starts empty")
            return
        if self._replay_rows == 0:
            log.warning(
                "one replay row (%s) is more than checkpoint.replay_max_mb %d: checkpoints save no replay",
                format_bytes(row_bytes),
                cfg.checkpoint.replay_max_mb,
            )
            return
        rows = min(cfg.replay.capacity, self._replay_rows)
        size = rows * row_bytes
        partial = (
            f" (only the newest {rows} of replay.capacity {cfg.replay.capacity}: "
            f"raise checkpoint.replay_max_mb {cfg.checkpoint.replay_max_mb} to save them all)"
            if rows < cfg.replay.capacity
            else ""
        )
        log.info(
            "each checkpoint saves up to %d replay rows%s, at most %s each before compression; "
            "checkpoint.keep %d pairs: at most %s of snapshots on disk, one more while a pair is written",
            rows,
            partial,
            format_bytes(size),
            cfg.checkpoint.keep,
            format_bytes(size * cfg.checkpoint.keep),
        )

    def payload(self) -> dict[str, Any]:
        """Everything a resumed learner needs; the caller holds the counters' lock, so that the
        counts agree with each other (and with a replay snapshot taken under the same lock)."""
        t = self.trainer
        return {
            "agent": t.agent.state_dict(),
            "weights_version": t.numbering.version,  # the last published (agents number nothing)
            "counters": t.counters.to_checkpoint(),
            "eval": t.evals.state(),
            "replay_rng": t.replay.rng_state(),
            "config": t.cfg.to_dict(),
        }

    def due(self, at_interval: bool) -> bool:
        """Whether to save ``latest`` after this update: ``at_interval`` (the count is a multiple
        of checkpoint.interval), or the first update after one that came due while the previous
        write was still going. Deferred, not skipped: a learner that dies soon after (a run of
        non-finite updates, a crash) then resumes from a checkpoint at most one write old, where
        skipping left it a whole interval further back. No copies are held while it waits."""
        if not (at_interval or self._owed):
            return False
        if self.background and self.writer.busy:
            if at_interval and not self._owed:
                self.deferred += 1
                log.info(
                    "checkpoint at %d updates deferred: the previous one is still being written",
                    self.trainer.counters.updates,
                )
            self._owed = True
            return False
        self._owed = False
        return True

    @property
    def owed(self) -> bool:
        """A checkpoint came due while the previous write was going, and is not taken yet."""
        return self._owed

    def finish_writing(self, tick: Callable[[], None]) -> None:
        """Wait for the write in flight (``tick`` reports progress meanwhile)."""
        self.writer.wait_ticking(tick)

    def settle(self) -> None:
        """Wait for the write in flight, whatever ended the run: a daemon thread still inside
        torch.save when the interpreter exits is killed mid C++ frame, and the process dies of
        SIGABRT ("terminate called without an active exception") instead of exiting with its
        code, so a failure (exit 1) would be reported as a crash. No progress is reported
        meanwhile: a write that never ends is the watchdog's to end (exit 3)."""
        if self.writer.busy:
            log.info("waiting for the checkpoint being written before the learner exits")
            self.writer.wait()

    def save_latest(self, final: bool = False, tick: Callable[[], None] | None = None) -> None:
        """Checkpoint and its replay snapshot from copies taken under the lock (the only time the
        training thread is held: ``held_seconds``); the final one (and every one in serial mode)
        is on disk before this returns."""
        t = self.trainer
        self._owed = False
        snap: TransitionBatch | SequenceBatch | None = None
        started = time.perf_counter()
        with t.counters.lock:  # counters and replay snapshot from the same instant
            payload = detached(self.payload())
            if self._replay_rows:
                snap = t.replay.snapshot(self._replay_rows)  # as saved: dense rows, the newest
            total_added = t.replay.total_added
        self.held_seconds = time.perf_counter() - started
        log.debug("checkpoint copies held the training thread %.1f ms", self.held_seconds * 1e3)
        payload[REPLAY_ENTRY] = None if snap is None else {"rows": snap.size, "total_added": total_added}
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
        path = self.directory / BEST
        self.retries.run(lambda: save_checkpoint(path, payload), path, self.trainer.run_dir)

    def restore(self) -> None:
        """Load the newest whole pair (a readable checkpoint and its own replay snapshot, read and
        checked before anything is restored) into the trainer, after checking that it is of this
        run's settings; one line says what was restored."""
        t = self.trainer
        chosen = self._newest_whole_pair()
        if chosen is None:
            log.warning(
                "asked to resume, but %s holds no readable checkpoint: starting fresh", self.directory
            )
            return
        path, payload, replay = chosen
        t.agent.load_state_dict(payload["agent"])
        t.numbering.continue_after(checkpoint_weights_version(payload))
        t.counters.restore(payload["counters"])
        t.evals.load_state(payload.get("eval", {}))
        if payload.get("replay_rng"):
            t.replay.set_rng_state(payload["replay_rng"])
        if replay.batch is not None:
            # A sequence replay takes its windows (what its snapshot held); the others transitions.
            t.replay.restore(cast(TransitionBatch, replay.batch), replay.total_added)
            self._replay_file = replay.name
        self.resumed_from = {
            "path": str(path),
            "updates": t.counters.updates,
            "samples": t.counters.samples,
            "weights_version": t.numbering.version,
            "replay_rows": len(t.replay),
            "replay_file": self._replay_file,
        }
        log.info(
            "resumed from %s: %d updates, %d samples, weights version %d; replay: %s",
            path,
            t.counters.updates,
            t.counters.samples,
            t.numbering.version,
            replay.said,
        )

    def _newest_whole_pair(self) -> tuple[Path, dict[str, Any], PairReplay] | None:
        """The newest checkpoint whose replay snapshot reads whole, newest first; a pair whose
        snapshot does not is skipped with one warning line naming it and why. If none does, the
        newest readable checkpoint with an empty replay, said in one line; None: no checkpoint.
        A checkpoint of other settings is refused (ConfigError) before its snapshot is read."""
        t = self.trainer
        newest: tuple[Path, dict[str, Any]] | None = None
        refused: set[str] = set()  # snapshots found unfit (a copied `latest` shares its pair's)
        for path, payload in resumable_checkpoints(self.directory, log):
            self._check_settings(path, payload.get("config"))
            newest = newest or (path, payload)
            replay = pair_replay(self.directory, payload, t.spec, refused)
            if replay.whole:
                return path, payload, replay
            if replay.name not in refused:
                refused.add(str(replay.name))
                log.warning("skipping %s: %s; trying the next older pair", path, replay.said)
        if newest is None:
            return None
        log.warning(
            "no checkpoint in %s has a whole replay snapshot: resuming from %s with an empty replay",
            self.directory,
            newest[0],
        )
        return newest[0], newest[1], PairReplay(True, "empty (no whole replay snapshot: see above)")

    def _check_settings(self, path: Path, stored: Any) -> None:
        """Refuse to resume a checkpoint whose run settings (the fingerprint's env and agent keys:
        env, network, n-step, gamma) differ from this config's, unless ``checkpoint.force_resume``.
        Compares stored values only: nothing in the checkpoint is built into code."""
        t = self.trainer
        keys = [key for key in t.fingerprint if key.split(".", 1)[0] in SETTING_SECTIONS]
        here = settings_at(t.cfg.to_dict(), keys)
        there = settings_at(stored if isinstance(stored, Mapping) else {}, keys)
        if not fingerprint_mismatch(here, there):
            return
        differ = FingerprintMismatch(here, there, there="the checkpoint")
        if t.cfg.checkpoint.force_resume:
            log.warning("%s (%s); resuming anyway, as checkpoint.force_resume asks", differ, path)
            return
        raise ConfigError(
            f"refusing to resume from {path}: {differ}; to resume anyway give --force "
            f"(checkpoint.force_resume=true), or start a new run (another run.name)"
        )

    def _torn_pair(self, updates: int) -> None:
        """The worst moment for a crash, in a test: the second pair's snapshot is on disk and its
        checkpoint is not; the writer stops there for good (the training thread goes on)."""
        if self._faults is not None and self.writer.written:
            self._faults.torn_pair(updates)


def settings_at(config: Mapping[str, Any], keys: list[str]) -> dict[str, Any]:
    """The values at dotted ``keys`` of a config mapping, as plain data (absent keys left out)."""
    out: dict[str, Any] = {}
    for key in keys:
        node: Any = config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            out[key] = _plain(node)
    return out


def _plain(value: Any) -> Any:
    """Plain data to compare: sequences as lists, and anything but a scalar, list or mapping as a
    short tag (a stored config is data; its values are compared, never called)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return f"<{type(value).__name__}>"
