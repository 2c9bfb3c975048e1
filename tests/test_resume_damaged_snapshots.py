"""A damaged replay snapshot never makes a resume crash (issue 37, item 3).

A truncated, bit-flipped or empty ``replay-*.npz``, or one whose columns do not fit the run, is
skipped with one warning line naming it and why, and the resume takes the newest pair whose
snapshot reads whole; with none, the newest checkpoint with an empty replay, said in one line.
Nothing is restored from a snapshot before all of it was read and checked.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import tiny_config
from tests.test_checkpoint_pairs import checkpoint_at, names, trainer
from zmqrl.checkpoints.files import LATEST

NEWER = "replay-0000000200.npz"
OLDER = "replay-0000000100.npz"


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_bit(path: Path) -> None:
    """One bit flipped in the middle of the reward column's compressed bytes, as a bad block would."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        member = archive.getinfo("reward.npy")
    header = member.header_offset  # a local file header: 30 bytes, then the name and the extra field
    name_length, extra_length = struct.unpack("<HH", data[header + 26 : header + 30])
    start = header + 30 + name_length + extra_length
    data[start + member.compress_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def empty(path: Path) -> None:
    path.write_bytes(b"")


def rewritten(**columns: Any) -> Callable[[Path], None]:
    """A snapshot written whole, with its stamp, but with ``columns`` in place of the saved ones."""

    def damage(path: Path) -> None:
        with np.load(path) as data:
            saved = {name: data[name] for name in data.files}
        np.savez_compressed(path, **{**saved, **columns})

    return damage


def two_pairs(tmp_path: Path) -> Path:
    """Pairs at 100 updates (30 rows) and 200 updates (50 rows: 30 + 20); the checkpoint directory."""
    t = trainer(tiny_config(tmp_path))
    checkpoint_at(t, 100, rows=30)
    checkpoint_at(t, 200, rows=20)
    t.close()
    return t.checkpoints.directory


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (truncate, "is unreadable (BadZipFile"),
        (flip_a_bit, "is unreadable ("),
        (empty, "is unreadable (EOFError"),
    ],
    ids=["truncated", "bit-flipped", "empty"],
)
def test_a_damaged_newest_snapshot_resumes_from_the_older_whole_pair_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None], why: str
) -> None:
    directory = two_pairs(tmp_path)
    damage(directory / NEWER)
    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100
    assert len(resumed.replay) == 30 and resumed.replay.snapshot().reward.max() == 129.0, "100's own rows"
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 1, skipped  # `latest` and ckpt-200 are one pair: said once
    assert f"its replay snapshot {NEWER} {why}" in skipped[0] and "\n" not in skipped[0]
    assert f"replay: 30 rows from {OLDER}" in caplog.text
    assert resumed.checkpoints.resumed_from is not None
    assert resumed.checkpoints.resumed_from["replay_file"] == OLDER
    resumed.close()


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (rewritten(obs=np.zeros((50, 3), np.float32)), "obs is float32 (50, 3), this run's replay holds"),
        (rewritten(action=np.zeros(50, np.float64)), "action is float64 (50,)"),
        (rewritten(discount=np.full(49, 0.99, np.float32)), "discount is float32 (49,)"),
        (rewritten(reward=np.full(50, np.nan, np.float32)), "reward outside"),
        (rewritten(action=np.full(50, 7, np.int64)), "action"),
        (rewritten(total_added=np.int64(7)), "its checkpoint says 50 and 50"),
        (rewritten(updates=np.int64(300)), "belongs to the checkpoint at 300 updates"),
        (rewritten(updates=np.arange(3)), "is unreadable (TypeError"),
    ],
    ids=["obs-shape", "action-dtype", "lengths", "nan", "action-range", "record", "stamp", "stamp-type"],
)
def test_a_snapshot_that_does_not_fit_the_run_or_its_checkpoint_is_skipped_the_same_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None], why: str
) -> None:
    directory = two_pairs(tmp_path)
    damage(directory / NEWER)
    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 1 and why in skipped[0], skipped
    resumed.close()


def test_when_no_snapshot_reads_whole_the_newest_checkpoint_resumes_with_an_empty_replay_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = two_pairs(tmp_path)
    truncate(directory / NEWER)
    (directory / OLDER).unlink()  # a missing snapshot is no more whole than a torn one
    caplog.set_level("INFO", logger="zmqrl.learner")
    resumed = trainer(tiny_config(tmp_path), resume=True)
    assert resumed.counters.updates == 200 and len(resumed.replay) == 0
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 2 and f"{OLDER} is missing" in skipped[1], skipped
    lines = [r.getMessage() for r in caplog.records if "no checkpoint in" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(f"resuming from {directory / LATEST} with an empty replay")
    resumed.close()


def test_the_pair_a_resume_fell_back_past_is_dropped_at_the_next_write_not_kept_among_the_newest(
    tmp_path: Path,
) -> None:
    """With checkpoint.keep 1, the abandoned ckpt-300 would otherwise count as the newest pair and
    have the run's own new ckpt-200 (and its snapshot) pruned the moment it is written."""
    t = trainer(tiny_config(tmp_path, checkpoint__keep=2))
    checkpoint_at(t, 100, rows=30)
    checkpoint_at(t, 300, rows=20)
    t.close()
    directory = t.checkpoints.directory
    truncate(directory / "replay-0000000300.npz")

    cfg = tiny_config(tmp_path, checkpoint__keep=1)
    resumed = trainer(cfg, resume=True)
    assert resumed.counters.updates == 100 and len(resumed.replay) == 30
    checkpoint_at(resumed, 200, rows=5)
    resumed.close()
    assert names(directory) == ["ckpt-0000000200", LATEST, NEWER]
    again = trainer(cfg, resume=True)
    assert again.counters.updates == 200 and len(again.replay) == 35, "the new pair, whole"
    again.close()
