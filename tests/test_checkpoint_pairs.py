"""Each checkpoint keeps its own replay snapshot: written before it, kept, pruned and restored with
it; interrupted writes leave nothing behind; a full disk is one clear error (issue 23, item 10).

A real Trainer writes and restores the pairs (serial-mode checkpoints: written before
``save_latest`` returns); failures are injected through the writer's steps (``between``, ``save``)
or at the file write itself.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
import torch
import zmq

from tests.conftest import tiny_config
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.checkpoints.files import LATEST, CheckpointWriteError, load_checkpoint
from zmqrl.config import Config
from zmqrl.learner.checkpointing import REPLAY_ENTRY
from zmqrl.learner.main import Learner
from zmqrl.learner.nonfinite import NonFiniteTraining
from zmqrl.learner.trainer import Trainer, UpdateReport
from zmqrl.types import TransitionBatch


class Crash(BaseException):
    """The process dying at this point (nothing catches a BaseException that is not an OSError)."""


def trainer(cfg: Config, resume: bool = False) -> Trainer:
    return Trainer(cfg, cfg.run_dir, resume=resume, background_checkpoints=False)


def transitions(t: Trainer, rows: int, first: float) -> TransitionBatch:
    """``rows`` CartPole-shaped transitions whose rewards count up from ``first`` (to tell them apart)."""
    obs = np.zeros((rows, *t.spec.obs_shape), np.float32)
    return TransitionBatch(
        obs=obs,
        action=np.zeros(rows, np.int64),
        reward=np.arange(first, first + rows, dtype=np.float32),
        next_obs=obs,
        discount=np.full(rows, 0.99, np.float32),
    )


def checkpoint_at(t: Trainer, updates: int, rows: int) -> None:
    """Add ``rows`` transitions (rewards from ``updates``), then checkpoint at ``updates``."""
    t.replay.add(transitions(t, rows, float(updates)))
    t.counters.updates = updates
    t.checkpoints.save_latest()


def held_until(gate: threading.Event) -> Callable[[], None]:
    """A writer hook: each write waits for ``gate`` (a write that takes its time)."""

    def hold() -> None:
        gate.wait(30)

    return hold


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_each_checkpoint_is_written_after_its_own_replay_snapshot_and_they_are_pruned_together(
    tmp_path: Path,
) -> None:
    t = trainer(tiny_config(tmp_path, checkpoint__keep=2))
    for updates in (100, 200, 300, 400):
        checkpoint_at(t, updates, rows=10)
    directory = t.checkpoints.directory
    assert names(directory) == [
        "ckpt-0000000300",
        "ckpt-0000000400",
        LATEST,
        "replay-0000000300.npz",
        "replay-0000000400.npz",
    ]
    assert load_checkpoint(directory / LATEST)[REPLAY_ENTRY] == {"rows": 40, "total_added": 40}
    t.close()


def test_the_default_config_saves_replay_with_every_checkpoint(tmp_path: Path) -> None:
    t = trainer(tiny_config(tmp_path))  # checkpoint.replay is not set: its default
    checkpoint_at(t, 100, rows=25)
    t.close()
    again = trainer(tiny_config(tmp_path), resume=True)
    assert len(again.replay) == 25
    again.close()


def test_falling_back_to_an_older_checkpoint_restores_that_checkpoints_own_replay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = trainer(tiny_config(tmp_path))
    checkpoint_at(t, 100, rows=30)
    checkpoint_at(t, 200, rows=20)
    t.close()
    # `latest` is a hard link to ckpt-200: tearing it tears both, as a bad disk block would.
    (t.checkpoints.directory / LATEST).write_bytes(b"torn")
    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100
    assert len(resumed.replay) == 30, "the replay as it was at 100 updates, not empty, not 200's"
    assert resumed.replay.snapshot().reward.max() == 129.0
    assert "replay: 30 rows from replay-0000000100.npz" in caplog.text
    resumed.close()


def test_a_crash_between_a_snapshot_and_its_checkpoint_leaves_the_previous_pair_to_resume_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = trainer(tiny_config(tmp_path))
    checkpoint_at(t, 100, rows=30)

    def crash(updates: int) -> None:
        raise Crash

    t.checkpoints.writer.between = crash
    with pytest.raises(Crash):
        checkpoint_at(t, 200, rows=20)
    t.close()
    directory = t.checkpoints.directory
    assert (directory / "replay-0000000200.npz").is_file() and not (directory / "ckpt-0000000200").exists()

    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30
    assert "replay: 30 rows from replay-0000000100.npz" in caplog.text
    assert not (directory / "replay-0000000200.npz").exists(), "a snapshot without its checkpoint is removed"
    resumed.close()


def test_temp_files_left_by_killed_writes_are_removed_at_start(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, evaluator__enabled=True)
    directory = cfg.run_dir / "checkpoints"
    directory.mkdir(parents=True)
    stale = [".ckpt-0000000100.tmp-4242", ".replay-0000000100.npz.tmp-4242", ".latest.link-4242"]
    kept = [".best.tmp-4243", "notes.txt"]  # the evaluator's `best` (maybe being written now), not ours
    for name in stale + kept:
        (directory / name).write_bytes(b"x" * 1000)
    t = trainer(cfg)
    assert names(directory) == sorted(kept)
    t.close()


def no_space_after(written: int) -> Any:
    """A torch.save that writes ``written`` bytes and then finds the disk full."""

    def save(obj: object, f: IO[bytes]) -> None:
        f.write(b"\0" * written)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return save


def test_a_full_disk_is_one_clear_error_that_leaves_no_temp_file_and_the_previous_pair_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trainer(tiny_config(tmp_path))
    checkpoint_at(t, 100, rows=30)
    monkeypatch.setattr(torch, "save", no_space_after(4096))
    with pytest.raises(CheckpointWriteError) as failed:
        checkpoint_at(t, 200, rows=20)
    monkeypatch.undo()
    t.close()
    message = str(failed.value)
    directory = t.checkpoints.directory
    assert "\n" not in message
    assert f"cannot write ckpt-0000000200 in {directory}" in message
    assert "No space left on device [ENOSPC]" in message and "free there" in message
    assert "needs about" in message  # the payload's tensors
    assert "checkpoint.keep" in message and f"zmqrl launch --resume {t.run_dir}" in message
    assert not [name for name in names(directory) if name.startswith(".")], "no temp file left behind"

    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30
    assert not (directory / "replay-0000000200.npz").exists()
    resumed.close()


def test_a_replay_larger_than_replay_max_mb_saves_its_newest_rows_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="zmqrl.learner")
    # A CartPole row is 48 bytes before compression: 1 MiB holds 21,845 of replay.capacity 50,000.
    cfg = tiny_config(tmp_path, replay__capacity=50_000, checkpoint__replay_max_mb=1)
    t = trainer(cfg)
    assert caplog.text.count("only the newest 21845 of replay.capacity 50000") == 1
    checkpoint_at(t, 100, rows=25_000)
    t.close()
    resumed = trainer(cfg, resume=True)
    restored = resumed.replay.snapshot()
    assert len(restored.reward) == 21_845 and restored.reward[-1] == 100 + 24_999, "the newest rows"
    resumed.close()


def test_with_replay_snapshots_off_the_resume_line_says_why_replay_is_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = trainer(tiny_config(tmp_path, checkpoint__replay=False))
    checkpoint_at(t, 100, rows=30)
    t.close()
    assert names(t.checkpoints.directory) == ["ckpt-0000000100", LATEST]
    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert len(resumed.replay) == 0
    why = "this checkpoint was saved without replay: checkpoint.replay was false"
    assert f"replay: empty ({why})" in caplog.text
    resumed.close()


def test_a_full_disk_in_the_background_writer_ends_the_learner_with_that_error_not_a_dead_thread(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The periodic checkpoint is written on the writer's thread: its full disk must still reach the
    learner's main thread as the CheckpointWriteError that the CLI turns into exit 2."""
    cfg = tiny_config(
        tmp_path, learner__max_updates=100_000, learner__checkpoint_interval=50, learner__eval_interval=0
    )
    t = trainer(cfg)
    checkpoint_at(t, 100, rows=500)  # a replay to train from: no actor needed
    t.close()
    sup = FakeSupervisor(ctx)
    learner = Learner(with_transport(cfg, **sup.endpoints()), ctx=ctx, resume=True)
    monkeypatch.setattr(torch, "save", no_space_after(100))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            learner.run()
        except BaseException as exc:
            failed.append(exc)

    thread = start(run)
    thread.join(timeout=120)
    sup.close()
    assert not thread.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], CheckpointWriteError), failed
    assert "cannot write ckpt-0000000150" in str(failed[0])
    assert learner.stats["state"] == "failed"
    assert "thread 'checkpoint-writer' died" not in caplog.text, "an operator's error, not a traceback"
    assert not [p for p in (cfg.run_dir / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_checkpoint_due_while_the_previous_is_still_being_written_is_taken_right_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Skipping it left the newest checkpoint a whole interval behind: a learner failing soon after
    (a run of non-finite updates) resumed from further back than it had to (the CI of stop 30)."""
    cfg = tiny_config(tmp_path, learner__checkpoint_interval=100, learner__eval_interval=0)
    caplog.set_level(logging.INFO, "zmqrl")
    t = Trainer(cfg, cfg.run_dir, background_checkpoints=True)
    gate = threading.Event()
    t.checkpoints.writer._before_write = held_until(gate)  # the write at 100 takes its time
    t.replay.add(transitions(t, 10, 0.0))
    for updates in (100, 200, 201):
        t.counters.updates = updates
        t.follow_up(UpdateReport(updates))
    assert "checkpoint at 200 updates deferred" in caplog.text and t.checkpoints.deferred == 1
    gate.set()
    t.checkpoints.writer.wait(30)
    assert load_checkpoint(t.checkpoints.directory / LATEST)["counters"]["updates"] == 100
    t.counters.updates = 202  # the first update after the write ended takes the deferred one
    t.follow_up(UpdateReport(202))
    t.checkpoints.writer.wait(30)
    assert load_checkpoint(t.checkpoints.directory / LATEST)["counters"]["updates"] == 202
    t.counters.updates = 203  # owed no more: nothing until the next interval
    t.follow_up(UpdateReport(203))
    assert not t.checkpoints.writer.busy and t.checkpoints.deferred == 1
    t.close()


def test_a_learner_giving_up_on_nonfinite_updates_first_writes_the_checkpoint_it_still_owed(
    tmp_path: Path,
) -> None:
    """Its state is the last finite one (skipped updates change nothing): the write in flight is
    finished, and the one deferred behind it taken, before the learner exits 1."""
    cfg = tiny_config(
        tmp_path, learner__checkpoint_interval=100, learner__eval_interval=0, learner__max_nonfinite_updates=2
    )
    gate = threading.Event()
    t = Trainer(cfg, cfg.run_dir, background_checkpoints=True, progress=gate.set)  # waiting ticks open it
    t.checkpoints.writer._before_write = held_until(gate)
    t.replay.add(transitions(t, 10, 0.0))
    for updates in (100, 200):
        t.counters.updates = updates
        t.follow_up(UpdateReport(updates))
    assert t.checkpoints.owed and t.checkpoints.writer.busy
    t.counters.updates = 201
    t._count_skipped(True, 201)
    t.counters.updates = 202
    with pytest.raises(NonFiniteTraining, match="gave up after 2 updates"):
        t._count_skipped(True, 202)
    assert load_checkpoint(t.checkpoints.directory / LATEST)["counters"]["updates"] == 202
    assert not t.checkpoints.writer.busy
    t.close()
