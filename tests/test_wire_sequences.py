"""The "sequences" wire kind (R2D2's windows): round trip, and every refusal a learner counts and
drops (bad shapes, non-finite values, an out-of-bounds core state, actions out of range, broken
masks and terminations, the wrong kind for the run) before anything reaches replay."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from zmqrl.learner import intake_wire
from zmqrl.replay.sequences import SequenceReplay
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.messages import SampleGroup
from zmqrl.types import EpisodeStat, SequenceBatch, TransitionBatch

T, B, H, A = 4, 2, 3, 2
L = T + B


def spec(**extra: object) -> SampleSpec:
    values: dict[str, object] = dict(
        num_actions=A,
        obs_low=-5.0,
        obs_high=5.0,
        sequence_length=L,
        burn_in=B,
        core_size=H,
        max_abs_core_cell=50.0,
    )
    values.update(extra)
    return SampleSpec((2,), "float32", (), "int64", **values)  # type: ignore[arg-type]


def windows(rows: int = 3, seed: int = 0) -> SequenceBatch:
    """Valid windows: row 0 an episode's first (front padding), row 1 a middle one, row 2 ending
    the episode with a termination."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, size=(rows, L + 1, 2)).astype(np.float32)
    mask = np.zeros((rows, L), np.uint8)
    mask[:, :B], mask[:, B:] = 1, 2
    terminated = np.zeros((rows, L), bool)
    mask[0, :B] = 0
    if rows > 2:
        mask[2, B + 2 :] = 0
        terminated[2, B + 1] = True
    action = rng.integers(A, size=(rows, L)) * (mask > 0)
    reward = (np.ones((rows, L)) * (mask > 0)).astype(np.float32)
    state = rng.uniform(-0.5, 0.5, size=(rows, 2, H)).astype(np.float32)
    return SequenceBatch(obs, action.astype(np.int64), reward, terminated, mask, state)


def message(batch: SequenceBatch) -> wire.SamplesMsg:
    return wire.SamplesMsg(3, 7, 1, batch, [EpisodeStat(20.0, 20)])


def test_a_sequences_message_round_trips() -> None:
    batch = windows()
    frames = wire.dump(message(batch))
    assert len(frames) == 7
    back = wire.load_samples(frames, spec())
    assert isinstance(back.batch, SequenceBatch) and back.priorities is None
    for got, want in zip(back.batch, batch, strict=True):
        np.testing.assert_array_equal(got, want)
    assert back.batch.size == int((batch.mask == 2).sum())
    assert isinstance(wire.load(frames), wire.SamplesMsg)


def _set(name: str, index: tuple[object, ...], value: object) -> Callable[[SequenceBatch], SequenceBatch]:
    def change(batch: SequenceBatch) -> SequenceBatch:
        column = getattr(batch, name).copy()
        column[index] = value
        return batch._replace(**{name: column})

    return change


BAD: dict[str, Callable[[SequenceBatch], SequenceBatch]] = {
    "NaN reward": _set("reward", (1, 3), np.nan),
    "huge reward": _set("reward", (1, 3), 3e38),
    "obs out of bounds": _set("obs", (1, 2, 0), 7.0),
    "NaN obs on padding": _set("obs", (0, 0, 1), np.nan),
    "action out of range": _set("action", (1, 4), A),
    "negative action": _set("action", (1, 4), -1),
    "core state h beyond 1": _set("core_state", (1, 0, 0), 1.5),
    "core state c beyond the episode limit": _set("core_state", (1, 1, 2), 51.0),
    "NaN core state": _set("core_state", (2, 1, 0), np.nan),
    "mask 2 in the burn-in": _set("mask", (1, 0), 2),
    "mask 1 after the burn-in": _set("mask", (1, B + 1), 1),
    "mask 3": _set("mask", (1, B + 1), 3),
    "a hole in a window": _set("mask", (1, B + 1), 0),
    "no learned step": lambda b: b._replace(mask=np.where(b.mask == 2, 0, b.mask).astype(np.uint8)),
    "terminated mid-window": _set("terminated", (1, B), True),
    "terminated on padding": _set("terminated", (2, L - 1), True),
    "terminated byte 2": lambda b: b._replace(terminated=_bytes(b.terminated, (1, L - 1), 2)),
}


def _bytes(column: np.ndarray, index: tuple[int, int], value: int) -> np.ndarray:
    raw = column.view(np.uint8).copy()
    raw[index] = value
    return raw.view(bool)


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_values_are_refused(what: str) -> None:
    frames = wire.dump(message(BAD[what](windows())))
    with pytest.raises(wire.WireError):
        wire.load_samples(frames, spec())


@pytest.mark.parametrize(
    "batch",
    [
        windows()._replace(core_state=np.zeros((3, 2, H + 1), np.float32)),  # another core size
        windows()._replace(mask=windows().mask.astype(np.int64)),  # mask's dtype
        SequenceBatch(
            *(np.asarray(c)[:, : L - 1] if i in (1, 2, 3, 4) else c for i, c in enumerate(windows()))
        ),
    ],
    ids=["core size", "mask dtype", "window length"],
)
def test_bad_shapes_are_refused(batch: SequenceBatch) -> None:
    with pytest.raises(wire.WireError):
        wire.load_samples(wire.dump(message(batch)), spec())


def test_each_run_refuses_the_kinds_it_does_not_train_on() -> None:
    transitions = TransitionBatch(
        np.zeros((2, 2), np.float32),
        np.zeros(2, np.int64),
        np.zeros(2, np.float32),
        np.zeros((2, 2), np.float32),
        np.ones(2, np.float32),
    )
    with pytest.raises(wire.WireError, match="sequences"):
        wire.load_samples(wire.dump(message(transitions)), spec())  # type: ignore[arg-type]
    plain = SampleSpec((2,), "float32", (), "int64", num_actions=A)
    with pytest.raises(wire.WireError, match="sequences refused"):
        wire.load_samples(wire.dump(message(windows())), plain)
    with pytest.raises(wire.WireError):  # sequences carry no priorities
        msg = message(windows())
        msg.priorities = np.ones(3, np.float32)
        wire.dump(msg)


def test_refused_messages_are_counted_and_never_reach_replay() -> None:
    """What a learner's receiver does with each message: decode and check it, count a refusal,
    add what passed to replay as one group."""
    run = spec()
    replay = SequenceReplay(100, run, seed=0, prioritized=True)
    bad = BadMessages("samples")
    good = []
    for what in sorted(BAD):
        try:
            good.append(wire.load_samples(wire.dump(message(BAD[what](windows()))), run))
        except wire.WireError as exc:
            bad.record(exc)
    good.append(wire.load_samples(wire.dump(message(windows(seed=1))), run))
    group = SampleGroup.of(good)
    replay.add(group.batch, group.priorities)
    assert bad.count == len(BAD)
    assert replay.windows == 3 and len(replay) == replay.total_added == windows().size
    # A group split again (by policy lag, in the learner) gives each message its own windows.
    assert [m.batch.rows for m in group.messages] == [3]


# --------------------------------------------------------------------------------------------
# The sequence replay
# --------------------------------------------------------------------------------------------


def test_the_replay_adds_samples_reprioritises_and_snapshots_windows() -> None:
    run = spec()
    replay = SequenceReplay(5, run, seed=0, prioritized=True)
    first, second = windows(seed=1), windows(seed=2)
    replay.add(first)
    replay.add(second)  # 6 windows into 5: the oldest is overwritten
    assert replay.windows == 5 and replay.total_added == first.size + second.size
    overwritten = int((first.mask[0] == 2).sum())  # the oldest window's learned steps
    assert len(replay) == replay.total_added - overwritten
    drawn = replay.sample(64, updates=0)
    assert isinstance(drawn.batch, SequenceBatch) and drawn.batch.rows == 64
    assert drawn.ids is not None and drawn.importance is not None
    assert set(drawn.ids.tolist()) <= set(range(1, 6))
    # A priority much larger than the rest makes its window drawn most.
    priorities = np.full(64, 0.01)
    priorities[drawn.ids == 5] = 100.0
    replay.update_priorities(drawn.ids, priorities)
    again = replay.sample(256)
    assert again.ids is not None and (again.ids == 5).mean() > 0.5
    # Windows overwritten since they were drawn are skipped.
    replay.add(windows(seed=3))
    replay.update_priorities(np.array([1, 2]), np.array([1.0, 1.0]))
    assert replay.stats()["stale_priority_updates"] == 2
    snap = replay.snapshot()
    restored = SequenceReplay(5, run, seed=0, prioritized=False)
    restored.restore(snap, replay.total_added)
    assert restored.windows == 5 and len(restored) == len(replay)
    assert restored.total_added == replay.total_added
    for got, want in zip(restored.snapshot(), snap, strict=True):
        np.testing.assert_array_equal(got, want)


def test_every_replay_change_is_all_or_nothing() -> None:
    run = spec()
    replay = SequenceReplay(10, run, seed=0, prioritized=True)
    replay.add(windows())
    before = replay.snapshot(), len(replay), replay.total_added
    bad_shape = windows()._replace(core_state=np.zeros((3, 2, H + 1), np.float32))
    with pytest.raises(ValueError):
        replay.add(bad_shape)
    with pytest.raises(ValueError):
        replay.add(windows(), np.array([1.0, np.nan, 1.0]))
    with pytest.raises(TypeError):
        replay.add(TransitionBatch(*(np.zeros(1),) * 5))
    drawn = replay.sample(4)
    with pytest.raises(ValueError):
        replay.update_priorities(drawn.ids, np.array([1.0, -1.0, 1.0, 1.0]))
    after = replay.snapshot(), len(replay), replay.total_added
    for got, want in zip(after[0], before[0], strict=True):
        np.testing.assert_array_equal(got, want)
    assert after[1:] == before[1:]


def test_a_checkpoint_snapshot_of_windows_is_checked_like_a_message(tmp_path: object) -> None:
    from pathlib import Path

    from zmqrl.checkpoints.snapshots import SnapshotUnfit, read_replay_snapshot, write_replay_snapshot

    path = Path(str(tmp_path)) / "replay-1.npz"
    batch = windows()
    write_replay_snapshot(path, batch, 1, batch.size)
    read, total = read_replay_snapshot(path, 1, spec(), {"rows": batch.size, "total_added": batch.size})
    assert isinstance(read, SequenceBatch) and total == batch.size
    write_replay_snapshot(path, BAD["core state h beyond 1"](batch), 1, batch.size)
    with pytest.raises(SnapshotUnfit, match="core_state"):
        read_replay_snapshot(path, 1, spec(), None)


def test_a_group_of_windows_from_the_intake_splits_back_into_each_messages_windows() -> None:
    """A group that crossed from the intake process keeps no messages, only their spans (in
    learned steps); a stale message dropped there (learner.max_policy_lag) must take exactly its
    own windows out, however many learned steps each window has."""
    sent = [
        wire.SamplesMsg(1, seq, version, windows(rows, seed=seq), [EpisodeStat(float(seq), 9)])
        for seq, (rows, version) in enumerate([(3, 5), (1, 1), (2, 6), (3, 7)])
    ]
    group = SampleGroup.of(sent)
    crossed = intake_wire.load_group([bytes(memoryview(f)) for f in intake_wire.dump_group(group)])
    assert crossed.originals is None and crossed.infos == group.infos
    fresh = crossed.only([0, 2, 3])  # message 1 is stale
    assert fresh is not None
    assert [(m.seq, m.weights_version, m.episodes) for m in fresh.messages] == [
        (m.seq, m.weights_version, m.episodes) for m in (sent[0], sent[2], sent[3])
    ]
    for got, want in zip(fresh.batch, SampleGroup.of([sent[0], sent[2], sent[3]]).batch, strict=True):
        np.testing.assert_array_equal(got, want)
    assert fresh.size == sent[0].batch.size + sent[2].batch.size + sent[3].batch.size


def test_a_uniform_replay_draws_every_live_window_and_none_overwritten() -> None:
    """replay.prioritized: false for R2D2: windows drawn uniformly among the ``capacity`` newest,
    no importance weights or ids, and the learner's priorities are ignored."""
    replay = SequenceReplay(4, spec(), seed=0, prioritized=False)
    first, second = windows(3, seed=1), windows(3, seed=2)
    replay.add(first)
    replay.add(second)  # 6 windows into 4: the first two are overwritten
    live = [first.obs[2], *second.obs]
    drawn = replay.sample(400)
    assert drawn.ids is None and drawn.importance is None and drawn.metrics == {}
    seen = {next(i for i, w in enumerate(live) if np.array_equal(w, obs)) for obs in drawn.batch.obs}
    assert seen == {0, 1, 2, 3}  # StopIteration above: a window that is not live was drawn
    for name in ("core_state", "mask", "reward"):  # each drawn window's columns stay together
        rows = {i: getattr(first, name)[2] if i == 0 else getattr(second, name)[i - 1] for i in range(4)}
        for obs, got in zip(drawn.batch.obs, getattr(drawn.batch, name), strict=True):
            index = next(i for i, w in enumerate(live) if np.array_equal(w, obs))
            np.testing.assert_array_equal(got, rows[index])
    before = replay.snapshot()
    replay.update_priorities(None, np.ones(400))  # what the learner sends after a uniform draw
    for got, want in zip(replay.snapshot(), before, strict=True):
        np.testing.assert_array_equal(got, want)
