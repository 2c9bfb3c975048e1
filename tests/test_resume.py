"""Learner resume: full-state checkpoints, kept history with fallback, versions that never go back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import zmq

from tests.conftest import tiny_config
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.actor.main import Actor
from zmqrl.checkpoints.files import LATEST, load_resumable, save_periodic
from zmqrl.learner import versions as versions_module
from zmqrl.learner.main import Learner
from zmqrl.learner.versions import PublishedVersions


def test_only_the_newest_periodic_checkpoints_are_kept_and_latest_points_at_the_newest(
    tmp_path: Path,
) -> None:
    for updates in (100, 200, 300, 400):
        save_periodic(tmp_path, updates, {"n": torch.tensor(updates)}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000300", "ckpt-0000000400", LATEST]
    path, payload = load_resumable(tmp_path)
    assert path.name == LATEST and int(payload["n"]) == 400


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path) -> None:
    for updates in (100, 200, 300):
        save_periodic(tmp_path, updates, {"n": torch.tensor(updates)}, keep=3)
    (tmp_path / LATEST).write_bytes(b"torn")  # latest shares its file with ckpt-300: both are torn
    path, payload = load_resumable(tmp_path)
    assert path.name == "ckpt-0000000200" and int(payload["n"]) == 200


def test_no_readable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / LATEST).write_bytes(b"junk")
    with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
        load_resumable(tmp_path)


def test_a_learner_restarted_after_its_process_died_numbers_right_after_the_last_version_published(
    tmp_path: Path,
) -> None:
    versions = PublishedVersions(tmp_path / "weights-version")
    assert versions.highest == 0
    for v in (1, 5, 3):
        versions.reserve(v)
    versions.close()  # no fsync of the last publishes: the page cache holds them for the restart
    assert PublishedVersions(tmp_path / "weights-version").highest == 5


class MachineCrash:
    """What a file holds after the machine crashes: its content at its last fsync (writes since
    then are lost), and no file at all if neither it nor its directory was ever synced. The
    machine then boots again: another boot id."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.monkeypatch = monkeypatch
        self.path = path
        self.durable: bytes | None = None
        self.fsyncs = 0
        real = os.fsync

        def fsync(fd: int) -> None:
            real(fd)
            self.fsyncs += 1
            if path.exists():  # the file's or its directory's sync: what it holds now survives
                self.durable = path.read_bytes()

        monkeypatch.setattr(os, "fsync", fsync)

    def happen(self) -> None:
        if self.durable is None:
            self.path.unlink(missing_ok=True)
        else:
            self.path.write_bytes(self.durable)
        self.monkeypatch.setattr(versions_module, "boot_id", lambda: "the-next-boot")


def test_a_learner_restarted_after_a_machine_crash_numbers_above_every_version_it_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "weights-version"
    crash = MachineCrash(monkeypatch, path)
    versions = PublishedVersions(path, block=100)
    published = list(range(1, 251))  # as a learner publishes: each reserved before it is sent
    for version in published:
        versions.reserve(version)
    versions.close()
    assert crash.fsyncs <= 4, "one fsync per block of versions (and one for the new file), not per publish"
    crash.happen()
    assert PublishedVersions(path, block=100).highest >= max(published)


def run_learner(learner: Learner) -> dict[str, object]:
    thread = start(learner.run)
    thread.join(timeout=120)
    assert not thread.is_alive()
    return learner.stats


def test_a_resumed_learner_continues_counters_versions_and_replay(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(
        tiny_config(
            tmp_path,
            learner__max_updates=300,
            learner__checkpoint_interval=100,
            checkpoint__replay=True,
            learner__min_replay_size=500,
        ),
        **sup.endpoints(),
    )
    first = Learner(cfg, ctx=ctx)
    thread = start(first.run)
    assert first.ready.wait(30)
    actor = Actor(with_transport(cfg, **first.endpoints), 0, ctx=ctx)
    actor_thread = start(actor.run)
    thread.join(timeout=120)
    actor_thread.join(timeout=30)
    assert first.stats["updates"] == 300 and "resumed_from" not in first.stats
    _, saved = load_resumable(tmp_path / "t" / "checkpoints")
    stored = len(first.replay)

    # Resume with more updates and no actor at all: only a restored replay lets it train.
    more = with_transport(
        tiny_config(
            tmp_path,
            learner__max_updates=400,
            checkpoint__replay=True,
            learner__min_replay_size=min(stored, 500),
        ),
        **sup.endpoints(),
    )
    second = Learner(more, ctx=ctx, resume=True)
    stats = run_learner(second)
    sup.close()
    assert stats["state"] == "finished" and stats["updates"] == 400
    assert stats["samples"] == saved["counters"]["samples"], "counters continue from the checkpoint"
    assert len(second.replay) == min(saved["counters"]["samples"], 5000)  # the snapshot, capacity-bound
    assert stats["weights_version"] > first.stats["weights_version"], "versions never go back"
    assert second.agent.updates == 400  # the agent's own counter (target-network schedule) continued too
    resumed = dict(stats["resumed_from"])  # the final stats say where it resumed from
    assert 0 < resumed.pop("weights_version") <= first.stats["weights_version"]
    assert resumed == {
        "path": str(tmp_path / "t" / "checkpoints" / "latest"),
        "updates": 300,
        "samples": saved["counters"]["samples"],
        "replay_rows": len(second.replay),
        "replay_file": "replay-0000000300.npz",
    }


def test_resuming_without_a_checkpoint_starts_fresh(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(
        tiny_config(tmp_path, learner__max_updates=1, learner__min_replay_size=1), **sup.endpoints()
    )
    learner = Learner(cfg, ctx=ctx, resume=True)
    thread = start(learner.run)
    assert learner.ready.wait(30)
    assert learner.updates == 0
    learner.request_stop()
    thread.join(timeout=30)
    sup.close()
    assert "resumed_from" not in learner.stats, "nothing was resumed"
