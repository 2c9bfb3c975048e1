"""Every replay add is all-or-nothing, and the shared-frame pool never runs out.

Failures are injected in the middle of an add (a step runs, then raises); the buffer's whole
observable state (length, counters, snapshot, a seeded sample, sum tree, priorities, frame pool
references and free slots) must then be exactly what it was, and retrying the add must give
exactly what a twin buffer that never failed holds. Frames here are random noise, so no two
planes are alike: the pool's worst case, which game frames (sharing all but one plane per row)
never come near.
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
    frames,
)
from zmqrl.replay.frames import FramePool
from zmqrl.types import TransitionBatch

STACK, SIDE, CAP = 4, 5, 8
OBS_SHAPE = (STACK, SIDE, SIDE)
KINDS: dict[str, type[UniformReplay]] = {
    "uniform": UniformReplay,
    "prioritized": PrioritizedReplay,
    "shared": SharedFramesReplay,
    "shared_prioritized": SharedFramesPrioritizedReplay,
}


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


def make(kind: str, capacity: int = CAP) -> UniformReplay:
    return KINDS[kind](capacity, OBS_SHAPE, np.uint8, (), np.int64, seed=4)


def history(buf: UniformReplay) -> None:
    """Fill, wrap, and (prioritized) give rows varied priorities, the same way every time."""
    rng = np.random.default_rng(11)
    for rows in (5, 6, 7):
        if isinstance(buf, PrioritizedReplay):
            buf.add_with_priorities(noise(rng, rows), rng.exponential(2.0, rows))
            _, ids, _ = buf.sample_prioritized(6, beta=0.5)
            buf.update_priorities(ids, rng.exponential(2.0, ids.size))
        else:
            buf.add(noise(rng, rows))


def observe(buf: UniformReplay) -> dict[str, Any]:
    """Everything a user of the buffer could see, plus the frame pool's bookkeeping; draws with
    the buffer's RNG are undone so that observing changes nothing."""
    state = buf.rng_state()
    seen: dict[str, Any] = {"len": len(buf), "total_added": buf.total_added, "snapshot": buf.snapshot()}
    if len(buf):
        seen["sample"] = buf.sample(16)
        buf.set_rng_state(state)
    if isinstance(buf, PrioritizedReplay):
        ids = np.arange(max(0, buf.total_added - 3 * buf.capacity), buf.total_added + 3)
        seen |= {
            "total_priority": buf.total_priority,
            "priorities": buf.priorities_of(ids),
            "nodes": buf._tree._nodes.copy(),
            "ordinals": buf._ordinal.copy(),
            "max_priority": buf.max_priority,
            "clipped": buf.clipped_priorities,
        }
        if len(buf):
            seen["prioritized_sample"] = buf.sample_prioritized(16, beta=0.5)
            buf.set_rng_state(state)
    if isinstance(buf, SharedFramesReplay | SharedFramesPrioritizedReplay):
        pool = pool_of(buf)
        seen |= {
            "live": pool.live,
            "refs": pool._refs.copy(),
            "free": list(pool._free),
            "unused": pool._unused,
            "index": dict(pool._slot_of),
            "ids": (buf._columns[0].copy(), buf._columns[3].copy()),
        }
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
def fail_once_after(target: object, name: str, calls: int = 1) -> Callable[..., Any]:
    """A replacement for ``target.name`` that runs the original and then, on call number
    ``calls``, raises: the step has done all its work when the add has to be undone."""
    original = getattr(target, name)
    count = [0]

    def step(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            raise InjectedFault(name)
        return out

    return step


def pool_of(buf: UniformReplay) -> FramePool:
    assert isinstance(buf, SharedFramesReplay | SharedFramesPrioritizedReplay)
    return buf._pool


def hashes_fail_after(mp: pytest.MonkeyPatch, planes: int) -> None:
    """From now on, the digest of the ``planes + 1``-th plane raises (inside an ``intern``)."""
    real, calls = frames.hashlib.blake2b, [0]

    def blake2b(data: Any, digest_size: int) -> Any:
        calls[0] += 1
        if calls[0] > planes:
            raise InjectedFault("blake2b")
        return real(data, digest_size=digest_size)

    mp.setattr(frames.hashlib, "blake2b", blake2b)


def refuse(*_: Any) -> None:
    raise InjectedFault("release")


@contextmanager
def fault(buf: UniformReplay, where: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        if where == "write":  # every column written (for shared frames: after interning too)
            mp.setattr(buf, "_write_rows_locked", fail_once_after(buf, "_write_rows_locked"))
        elif where == "tree":
            assert isinstance(buf, PrioritizedReplay)
            mp.setattr(buf._tree, "update", fail_once_after(buf._tree, "update"))
        elif where == "second_intern":  # obs planes interned, next_obs planes interned, then fail
            pool = pool_of(buf)
            mp.setattr(pool, "intern", fail_once_after(pool, "intern", calls=2))
        elif where == "mid_first_intern":  # 12 obs planes stored, then the 13th fails
            hashes_fail_after(mp, 12)
        elif where == "mid_second_intern":  # obs interned; 3 next_obs planes stored, the 4th fails
            pool = pool_of(buf)
            intern, calls = pool.intern, [0]

            def intern_then_fail(planes: np.ndarray, journal: Any = None) -> Any:
                calls[0] += 1
                if calls[0] == 2:
                    hashes_fail_after(mp, 3)
                return intern(planes, journal)

            mp.setattr(pool, "intern", intern_then_fail)
        elif where == "release":  # the commit's release of the overwritten planes refuses
            mp.setattr(pool_of(buf), "release", refuse)
        else:
            raise AssertionError(where)
        yield


FAULTS = {
    "uniform": ["write"],
    "prioritized": ["write", "tree"],
    "shared": ["write", "second_intern", "mid_first_intern", "mid_second_intern", "release"],
    "shared_prioritized": [
        "write",
        "tree",
        "second_intern",
        "mid_first_intern",
        "mid_second_intern",
        "release",
    ],
}


def operations(kind: str) -> dict[str, Callable[[UniformReplay], None]]:
    """Each add path, with a batch that overwrites old rows (and one larger than the capacity)."""
    rng = np.random.default_rng(99)
    batch, big = noise(rng, 5), noise(rng, CAP + 3)
    ops: dict[str, Callable[[UniformReplay], None]] = {
        "add": lambda buf: buf.add(batch),
        "add_bigger_than_capacity": lambda buf: buf.add(big),
        "restore_into_non_empty": lambda buf: buf.restore(batch, total_added=1_000),
    }
    if "prioritized" in kind:
        pri = np.array([0.5, 3e38, 2.0, 1e30, 0.0])  # two above the bound: the clip count rolls back too
        ops["add_with_priorities"] = lambda buf: buf.add_with_priorities(batch, pri)  # type: ignore[attr-defined]
    return ops


CASES = [(kind, where, op) for kind in KINDS for where in FAULTS[kind] for op in operations(kind)]


@pytest.mark.parametrize(("kind", "where", "op"), CASES)
def test_a_failed_add_leaves_the_buffer_exactly_as_it_was(kind: str, where: str, op: str) -> None:
    buf, twin = make(kind), make(kind)
    history(buf)
    history(twin)
    before = observe(buf)
    assert_same(before, observe(twin))
    run = operations(kind)[op]
    with fault(buf, where), pytest.raises(InjectedFault):
        run(buf)
    assert_same(observe(buf), before)
    # Nothing half-done lingers: retried, the add gives exactly what the twin gets at once.
    run(buf)
    run(twin)
    assert_same(observe(buf), observe(twin))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_failed_restore_into_an_empty_buffer_leaves_it_empty(kind: str) -> None:
    """Restoring re-bases the ring (ordinals, counters) before writing: that is undone too."""
    buf, twin = make(kind), make(kind)
    before = observe(buf)
    snap = noise(np.random.default_rng(5), CAP - 2)
    with fault(buf, "write"), pytest.raises(InjectedFault):
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
    pool = pool_of(buf)
    assert pool._unused == pool.slots  # every slot was needed once ...
    assert pool.live == CAP * 2 * STACK  # ... and half are free again
    buf.add(noise(rng, 3 * CAP))  # larger than the capacity: only its newest CAP rows are stored
    assert pool.live == CAP * 2 * STACK
