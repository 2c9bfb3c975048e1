"""Every replay add is all-or-nothing, and the shared-frame pool never runs out.

Each kind checks everything that can fail before its first write (zmqrl/replay/storage.py), so a
failed add must leave the buffer's whole observable state (length, counters, snapshot, a seeded
sample, sum tree, priorities, frame pool references and free slots) exactly as it was, and
retrying it must give exactly what a twin buffer that never failed holds. Failures come from
batches that fail a check late (the last column, the last priority: a buffer that wrote as it
checked would have changed), and from faults injected where the design says the last failure can
happen: inside the frame pool's staging (a digest that raises part-way, a refused release) and
just before the first write. Frames here are random noise, so no two planes are alike: the pool's
worst case, which game frames (sharing all but one plane per row) never come near.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from zmqrl.replay import (
    PrioritizedReplay,
    SharedFramesPrioritizedReplay,
    SharedFramesReplay,
    UniformReplay,
    frame_pool,
)
from zmqrl.types import RolloutBatch, TransitionBatch

STACK, SIDE, CAP = 4, 5, 8
OBS_SHAPE = (STACK, SIDE, SIDE)
KINDS: dict[str, type[UniformReplay | PrioritizedReplay]] = {
    "uniform": UniformReplay,
    "prioritized": PrioritizedReplay,
    "shared": SharedFramesReplay,
    "shared_prioritized": SharedFramesPrioritizedReplay,
}
Buffer = UniformReplay | PrioritizedReplay


class InjectedFault(RuntimeError):
    """Raised by a patched step; nothing else raises it."""


def noise(rng: np.random.Generator, rows: int) -> TransitionBatch:
    """Transitions of random noise frames: every plane distinct from every other."""
    return TransitionBatch(
        obs=rng.integers(0, 256, (rows, *OBS_SHAPE), dtype=np.uint8),
        action=rng.integers(0, 6, rows),
        reward=rng.normal(size=rows).astype(np.float32),
        next_obs=rng.integers(0, 256, (rows, *OBS_SHAPE), dtype=np.uint8),
        discount=np.full(rows, 0.97, np.float32),
    )


def make(kind: str, capacity: int = CAP) -> Buffer:
    return KINDS[kind](capacity, OBS_SHAPE, np.uint8, (), np.int64, seed=4)


def history(buf: Buffer) -> None:
    """Fill, wrap, and (prioritized) give rows varied priorities, the same way every time."""
    rng = np.random.default_rng(11)
    for updates, rows in enumerate((5, 6, 7)):
        buf.add(noise(rng, rows), rng.exponential(2.0, rows))  # a uniform buffer ignores them
        drawn = buf.sample(6, updates)
        buf.update_priorities(drawn.ids, rng.exponential(2.0, 6))


def observe(buf: Buffer) -> dict[str, Any]:
    """Everything a user of the buffer could see, plus the frame pool's bookkeeping; draws with
    the buffer's RNG are undone so that observing changes nothing."""
    state = buf.rng_state()
    seen: dict[str, Any] = {
        "len": len(buf),
        "total_added": buf.total_added,
        "snapshot": buf.snapshot(),
        "stats": buf.stats(),
        "nbytes": buf.nbytes,
    }
    if len(buf):
        seen["sample"] = buf.sample(16, 7)
        buf.set_rng_state(state)
    if isinstance(buf, PrioritizedReplay):
        ids = np.arange(max(0, buf.total_added - 3 * buf.capacity), buf.total_added + 3)
        seen |= {
            "total_priority": buf.total_priority,
            "priorities": buf.priorities_of(ids),
            "nodes": buf._priorities.tree._nodes.copy(),
            "ordinals": buf._ordinal.copy(),
            "max_priority": buf.max_priority,
            "clipped": buf.clipped_priorities,
        }
    if isinstance(buf, SharedFramesReplay | SharedFramesPrioritizedReplay):
        pool = buf.pool
        seen |= {
            "live": pool.live,
            "refs": pool._refs.copy(),
            "free": list(pool._free),
            "unused": pool._unused,
            "index": dict(pool._slot_of),
        }
    seen["columns"] = tuple(c.copy() for c in buf._rows.columns)  # ids, for shared frames
    seen["rng"] = buf.rng_state()
    return seen


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, tuple | list) and a and isinstance(a[0], np.ndarray | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)  # NaN equals NaN here
    else:
        assert a == b, where


# ------------------------------------------------------------------------------ injected faults
def hashes_fail_after(mp: pytest.MonkeyPatch, planes: int) -> None:
    """From now on, the digest of the ``planes + 1``-th plane raises (inside the pool's staging)."""
    real, calls = frame_pool.hashlib.blake2b, [0]

    def blake2b(data: Any, digest_size: int) -> Any:
        calls[0] += 1
        if calls[0] > planes:
            raise InjectedFault("blake2b")
        return real(data, digest_size=digest_size)

    mp.setattr(frame_pool.hashlib, "blake2b", blake2b)


def refuse(*_: Any) -> None:
    raise InjectedFault("refused")


@contextmanager
def fault(buf: Buffer, where: str, rows: int) -> Iterator[None]:
    """``where`` fails during an add that keeps ``rows`` rows."""
    with pytest.MonkeyPatch.context() as mp:
        if where == "before_write":  # every check passed, the weights computed: the last moment
            mp.setattr(buf._rows, "stage", refuse)  # dense rows stage nothing: nothing is undone here
        elif where == "mid_obs":  # 12 obs planes stored, then the 13th fails
            hashes_fail_after(mp, 12)
        elif where == "mid_next_obs":  # every obs plane and 3 next_obs planes stored, then a failure
            hashes_fail_after(mp, rows * STACK + 3)
        elif where == "release":  # every new plane stored; releasing the overwritten ones refuses
            mp.setattr(buf.pool, "check_release", refuse)  # type: ignore[union-attr]
        else:
            raise AssertionError(where)
        yield


FAULTS = {
    "uniform": ["before_write"],
    "prioritized": ["before_write"],
    "shared": ["mid_obs", "mid_next_obs", "release"],
    "shared_prioritized": ["mid_obs", "mid_next_obs", "release"],
}


def operations(kind: str) -> dict[str, tuple[Callable[[Buffer], None], int]]:
    """Each add path with the rows it keeps: a batch that overwrites old rows, one larger than
    the capacity, a restore, and (prioritized) priorities two of which a bound lowers."""
    rng = np.random.default_rng(99)
    batch, big = noise(rng, 5), noise(rng, CAP + 3)
    pri = np.array([0.5, 3e38, 2.0, 1e30, 0.0])  # two above the bound: the clip count must not move
    return {
        "add": (lambda buf: buf.add(batch), 5),
        "add_bigger_than_capacity": (lambda buf: buf.add(big), CAP),
        "restore_into_non_empty": (lambda buf: buf.restore(batch, total_added=1_000), 5),
        "add_with_priorities": (lambda buf: buf.add(batch, pri), 5),
    }


CASES = [(kind, where, op) for kind in KINDS for where in FAULTS[kind] for op in operations(kind)]


@pytest.mark.parametrize(("kind", "where", "op"), CASES)
def test_a_failed_add_leaves_the_buffer_exactly_as_it_was(kind: str, where: str, op: str) -> None:
    buf, twin = make(kind), make(kind)
    history(buf)
    history(twin)
    before = observe(buf)
    assert_same(before, observe(twin))
    run, rows = operations(kind)[op]
    with fault(buf, where, rows), pytest.raises(InjectedFault):
        run(buf)
    assert_same(observe(buf), before)
    # Nothing half-done lingers: retried, the add gives exactly what the twin gets at once.
    run(buf)
    run(twin)
    assert_same(observe(buf), observe(twin))


def bad_inputs(kind: str) -> dict[str, tuple[TransitionBatch | RolloutBatch, np.ndarray | None]]:
    """Adds each kind must refuse, each failing a check as late as it can: after the columns or
    priorities before it would already have been written by a buffer that wrote as it checked."""
    rng = np.random.default_rng(7)
    good = noise(rng, 5)
    bad: dict[str, tuple[Any, np.ndarray | None]] = {
        "next_obs_of_floats": (good._replace(next_obs=good.next_obs.astype(np.float64)), None),
        "discount_of_the_wrong_shape": (good._replace(discount=good.discount[:, None]), None),
        "one_row_short_discount": (good._replace(discount=good.discount[:4]), None),
        "reward_2d": (good._replace(reward=good.reward[:, None]), None),
        "rollouts": (RolloutBatch(*(np.zeros(1) for _ in RolloutBatch._fields)), None),
    }
    if "prioritized" in kind:
        bad |= {
            "last_priority_nan": (good, np.array([1.0, 2.0, 3.0, 4.0, np.nan])),
            "last_priority_negative": (good, np.array([1.0, 2.0, 3.0, 4.0, -1.0])),
            "priorities_one_short": (good, np.ones(4)),
            "priorities_infinite": (good, np.array([np.inf, 1.0, 1.0, 1.0, 1.0])),
        }
    return bad


@pytest.mark.parametrize(("kind", "bad"), [(kind, bad) for kind in KINDS for bad in bad_inputs(kind)])
def test_a_rejected_add_changes_nothing_observable(kind: str, bad: str) -> None:
    """Size, contents, counters, priorities and sum tree, frame pool, and the next sample drawn
    with the same seed: all exactly as before a refused add, in every kind."""
    buf, twin = make(kind), make(kind)
    history(buf)
    history(twin)
    batch, priorities = bad_inputs(kind)[bad]
    with pytest.raises((ValueError, TypeError)):
        buf.add(batch, priorities)  # type: ignore[arg-type]
    assert_same(observe(buf), observe(twin))
    buf.add(noise(np.random.default_rng(3), 4))
    twin.add(noise(np.random.default_rng(3), 4))
    assert_same(observe(buf), observe(twin))


@pytest.mark.parametrize("kind", list(KINDS))
def test_observe_sees_a_half_written_add(kind: str) -> None:
    """The checks above would catch a buffer that fails after writing: ``observe`` sees it."""
    buf, twin = make(kind), make(kind)
    history(buf)
    history(twin)
    rows = buf._rows
    real_write = rows.write

    def write_then_fail(*args: Any) -> None:
        real_write(*args)
        raise InjectedFault("after writing")

    with pytest.MonkeyPatch.context() as mp, pytest.raises(InjectedFault):
        mp.setattr(rows, "write", write_then_fail)
        buf.add(noise(np.random.default_rng(8), 3))
    with pytest.raises(AssertionError):
        assert_same(observe(buf), observe(twin))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_failed_restore_into_an_empty_buffer_leaves_it_empty(kind: str) -> None:
    """Restoring re-bases the ring (ordinals, counters): a refused restore re-bases nothing."""
    buf, twin = make(kind), make(kind)
    before = observe(buf)
    snap = noise(np.random.default_rng(5), CAP - 2)
    with pytest.raises(ValueError, match="dtype"):
        buf.restore(snap._replace(next_obs=snap.next_obs.astype(np.float32)), total_added=500)
    assert_same(observe(buf), before)
    where = FAULTS[kind][-1]
    with fault(buf, where, CAP - 2), pytest.raises(InjectedFault):
        buf.restore(snap, total_added=500)
    assert_same(observe(buf), before)
    buf.restore(snap, total_added=500)
    twin.restore(snap, total_added=500)
    assert_same(observe(buf), observe(twin))
    assert buf.total_added == 500 and len(buf) == CAP - 2


# ----------------------------------------------------------------------------- noise frames
@pytest.mark.parametrize("kind", ["shared", "shared_prioritized"])
def test_a_full_buffer_of_noise_takes_one_more_row(kind: str) -> None:
    """The case from the issue: distinct frames in every row, then one more row."""
    rng = np.random.default_rng(0)
    buf = make(kind)
    buf.add(noise(rng, CAP))
    buf.add(noise(rng, 1))
    assert len(buf) == CAP and buf.live_planes == CAP * 2 * STACK  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["shared", "shared_prioritized"])
def test_noise_frames_wrap_the_buffer_with_every_batch_size(kind: str) -> None:
    """Batches of 1 up to beyond the capacity, wrapping the buffer several times: the shared
    buffer never runs out, holds exactly 8 planes a row, and samples what a dense one does."""
    rng = np.random.default_rng(1)
    buf, dense = make(kind), make(kind.replace("shared_", "").replace("shared", "uniform"))
    sizes = [CAP, 1, 3, CAP - 1, CAP, CAP + 1, 2 * CAP + 3, 5, CAP, 1]
    for rows in sizes:
        batch = noise(rng, rows)
        buf.add(batch)
        dense.add(batch)
        assert buf.live_planes == len(buf) * 2 * STACK  # type: ignore[attr-defined]
        assert_same(observe(dense)["sample"], observe(buf)["sample"])
        assert_same(buf.snapshot(), dense.snapshot())
    assert buf.total_added == sum(sizes) > 5 * CAP


def test_the_pool_is_sized_for_exactly_the_worst_case() -> None:
    """A full buffer of noise receiving a capacity-sized batch of new noise uses every slot at
    its peak (old planes are released only after the new ones are stored), and no more."""
    rng = np.random.default_rng(2)
    buf = SharedFramesReplay(CAP, OBS_SHAPE, np.uint8, (), np.int64, seed=0)
    buf.add(noise(rng, CAP))
    buf.add(noise(rng, CAP))
    pool = buf.pool
    assert pool._unused == pool.slots  # every slot was needed once ...
    assert pool.live == CAP * 2 * STACK  # ... and half are free again
    buf.add(noise(rng, 3 * CAP))  # larger than the capacity: only its newest CAP rows are stored
    assert pool.live == CAP * 2 * STACK
