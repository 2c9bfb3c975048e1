"""The compiled sum tree (zmqrl/replay/_sumtree.c) against the numpy reference (``SumTree``).

The compiled tree must be the reference made fast, nothing else: the same node array bit for bit
after any sequence of updates, the same leaves for the same targets and uniform draws, the same
errors for the same bad input, and nothing written when it refuses. So every check here runs the
same operations on both and compares, on random trees (hypothesis) with arbitrary float values,
zeros, duplicate indices and capacities that are not powers of two. Where the extension was not
built (no C compiler at install time) these tests skip, saying so; the selection tests still run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_replay import make_batch
from zmqrl.replay import PrioritizedReplay, sumtree
from zmqrl.replay.sumtree import CompiledSumTree, SumTree, make_sum_tree

compiled_only = pytest.mark.skipif(
    sumtree.IMPLEMENTATION != "compiled", reason=f"compiled sum tree not available: {sumtree._WHY}"
)


def pair(capacity: int) -> tuple[SumTree, SumTree]:
    """(reference, compiled), both empty."""
    return make_sum_tree(capacity, "numpy"), make_sum_tree(capacity, "compiled")


def assert_same_tree(ref: SumTree, fast: SumTree) -> None:
    """Identical node arrays, bit for bit (-0.0 and 0.0 told apart)."""
    np.testing.assert_array_equal(ref._nodes.view(np.int64), fast._nodes.view(np.int64))
    assert ref.total == fast.total


def assert_same_searches(ref: SumTree, fast: SumTree, rng: np.random.Generator) -> None:
    if ref.total == 0:
        return
    total = ref.total
    cum = np.cumsum(ref.get(np.arange(ref.capacity)))
    targets = np.concatenate(
        [rng.random(64) * total, cum, np.nextafter(cum, -np.inf), [0.0, -1.0, total, total * 2]]
    )
    np.testing.assert_array_equal(ref.find_prefix_sum(targets), fast.find_prefix_sum(targets))
    for n in (1, 7, 256):
        u = rng.random(n)
        u[: n // 7] = np.nextafter(1.0, 0.0)  # the top of every stratum
        (ref_leaves, ref_values), (leaves, values) = ref.sample_stratified(u), fast.sample_stratified(u)
        np.testing.assert_array_equal(ref_leaves, leaves)
        np.testing.assert_array_equal(ref_values, values)
        assert (values > 0).all()


def raised(fn: object, *args: object) -> str | None:
    """The ValueError/TypeError message a call raises, or None."""
    try:
        fn(*args)  # type: ignore[operator]
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


values_strategy = st.one_of(
    st.just(0.0),
    st.just(-0.0),
    st.floats(0, 1e6, allow_nan=False, allow_infinity=False),
    st.floats(1e-300, 1e-3),
)


# ------------------------------------------------------------------------------ equivalence
@compiled_only
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 300),
    ops=st.lists(
        st.lists(st.tuples(st.integers(0, 10_000), values_strategy), min_size=0, max_size=80),
        min_size=1,
        max_size=8,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_updates_give_identical_trees_and_draws(
    capacity: int, ops: list[list[tuple[int, float]]], seed: int
) -> None:
    ref, fast = pair(capacity)
    rng = np.random.default_rng(seed)
    for op in ops:
        idx = np.array([i % capacity for i, _ in op], dtype=np.int64)
        vals = np.array([v for _, v in op], dtype=np.float64)
        ref.update(idx, vals)
        fast.update(idx, vals)
        assert_same_tree(ref, fast)
        np.testing.assert_array_equal(ref.get(np.arange(capacity)), fast.get(np.arange(capacity)))
        assert_same_searches(ref, fast, rng)


@compiled_only
@pytest.mark.parametrize("capacity", [1, 3, 1000, 1024, 5000])
def test_bulk_updates_rebuild_to_the_same_tree(capacity: int) -> None:
    """Updates big enough to rebuild every internal node, and small ones that walk up."""
    rng = np.random.default_rng(capacity)
    ref, fast = pair(capacity)
    for n in (capacity, 2 * capacity, capacity // 3 + 1, 5, 1):
        idx = rng.integers(0, capacity, size=n)
        vals = rng.random(n) ** 6
        vals[rng.random(n) < 0.3] = 0.0
        ref.update(idx, vals)
        fast.update(idx, vals)
        assert_same_tree(ref, fast)
        assert_same_searches(ref, fast, rng)


@compiled_only
def test_duplicate_indices_keep_the_last_value() -> None:
    ref, fast = pair(10)
    for tree in (ref, fast):
        tree.update([3, 3, 7, 3, 7], [1.0, 2.0, 5.0, 4.0, 0.0])
        np.testing.assert_array_equal(tree.get([3, 7]), [4.0, 0.0])
    assert_same_tree(ref, fast)


@compiled_only
def test_inputs_of_other_dtypes_and_layouts_are_converted_alike() -> None:
    ref, fast = pair(50)
    idx = np.arange(40, dtype=np.int32)[::2]  # int32, strided
    vals = np.linspace(0, 3, 40, dtype=np.float32)[::2]
    for tree in (ref, fast):
        tree.update(idx, vals)
        tree.update([[1, 2], [3, 4]], [[0.5, 0.25], [0.0, 8.0]])  # nested lists, 2-D
        tree.update(np.uint8(9), 2.5)  # scalars
    assert_same_tree(ref, fast)
    targets = np.linspace(0, ref.total, 30, dtype=np.float32)[::3]
    np.testing.assert_array_equal(ref.find_prefix_sum(targets), fast.find_prefix_sum(targets))
    np.testing.assert_array_equal(ref.get(np.array([[1], [9]])), fast.get(np.array([[1], [9]])))


@compiled_only
@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 40),
    rows=st.integers(0, 120),
    updates=st.lists(st.tuples(st.integers(0, 150), values_strategy), min_size=0, max_size=40),
)
def test_update_current_skips_overwritten_ids_alike(
    capacity: int, rows: int, updates: list[tuple[int, float]]
) -> None:
    """``owners`` as a ring holding ids ``rows - capacity .. rows - 1``: older ids are stale."""
    owners = np.full(capacity, -1, dtype=np.int64)
    for row in range(rows):
        owners[row % capacity] = row
    ref, fast = pair(capacity)
    ids = np.array([i for i, _ in updates], dtype=np.int64)
    vals = np.array([v for _, v in updates], dtype=np.float64)
    ref_live, ref_n = ref.update_current(ids, vals, owners)
    live, n = fast.update_current(ids, vals, owners)
    np.testing.assert_array_equal(ref_live, live)
    assert ref_n == n == int(np.count_nonzero(live))
    assert_same_tree(ref, fast)


# ------------------------------------------------------------------------------ refusals
BAD_UPDATES = [
    ([0], [np.nan]),
    ([0], [np.inf]),
    ([1, 2], [1.0, -np.inf]),
    ([0, 1], [1.0, -1e-300]),
    ([4, 5], [1.0, 1.0]),  # out of range: the capacity is 5, not its power of two (8)
    ([0, -1], [1.0, 1.0]),
    ([0, 1], [1.0]),
    ([0.5], [1.0]),
    ([1, 2, 3], [1.0, 2.0, np.nan]),  # the bad value last: nothing before it may be written
]


@compiled_only
@pytest.mark.parametrize(("indices", "values"), BAD_UPDATES)
def test_bad_updates_are_refused_alike_and_change_nothing(indices: list[float], values: list[float]) -> None:
    ref, fast = pair(5)
    for tree in (ref, fast):
        tree.update(np.arange(5), [1.0, 0.0, 2.0, 0.5, 3.0])
    before = fast._nodes.copy()
    message = raised(ref.update, np.array(indices), np.array(values))
    assert message is not None
    assert raised(fast.update, np.array(indices), np.array(values)) == message
    np.testing.assert_array_equal(fast._nodes, before)
    assert_same_tree(ref, fast)


@compiled_only
def test_bad_update_current_is_refused_alike_and_changes_nothing() -> None:
    owners = np.arange(5, dtype=np.int64)
    ref, fast = pair(5)
    for ids, vals in (([1, -2], [1.0, 1.0]), ([1, 2], [1.0, np.nan]), ([1, 2], [1.0]), ([0.5], [1.0])):
        message = raised(ref.update_current, np.array(ids), np.array(vals), owners)
        assert message is not None
        assert raised(fast.update_current, np.array(ids), np.array(vals), owners) == message
        assert fast.total == 0.0
    # A bad value for a stale id is never written, so it is not an error (as for the reference).
    stale = np.array([7], dtype=np.int64)  # slot 2 holds id 2, not 7
    assert (
        ref.update_current(stale, [np.nan], owners)[1] == fast.update_current(stale, [np.nan], owners)[1] == 0
    )


@compiled_only
def test_searches_refuse_alike() -> None:
    ref, fast = pair(5)
    empty = "ValueError: cannot search a sum tree whose total is zero"
    for tree in (ref, fast):
        assert raised(tree.find_prefix_sum, [0.0]) == raised(tree.sample_stratified, [0.5]) == empty
        tree.update([2], [1.0])
    for bad in ([np.nan], [0.5, np.inf]):
        assert raised(fast.find_prefix_sum, bad) == raised(ref.find_prefix_sum, bad) is not None
        assert raised(fast.sample_stratified, bad) == raised(ref.sample_stratified, bad) is not None
    assert raised(fast.get, [5]) == raised(ref.get, [5]) is not None
    for tree in (ref, fast):
        leaves, values = tree.sample_stratified(np.zeros(0))
        assert leaves.shape == values.shape == (0,)


# ------------------------------------------------------------------------------ in the replay
@compiled_only
def test_prioritized_replay_behaves_the_same_on_either_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same seed, same calls: same batches, ids, weights, priorities and counters."""
    bufs = []
    for implementation in ("numpy", "compiled"):
        monkeypatch.setattr(sumtree, "IMPLEMENTATION", implementation)
        bufs.append(PrioritizedReplay(37, (3,), np.float32, (), np.int64, seed=5, alpha=0.7))
    ref, fast = bufs
    assert type(ref._priorities.tree) is SumTree and type(fast._priorities.tree) is CompiledSumTree
    rng = np.random.default_rng(0)
    added = 0
    for step in range(40):
        rows = int(rng.integers(1, 30))
        priorities = rng.exponential(2.0, rows) if step % 3 else None
        for buf in bufs:
            buf.add(make_batch(range(added, added + rows), obs_dim=3), priorities)
        added += rows
        batch_size = int(rng.integers(1, 70))
        (batch_a, ids_a, w_a), (batch_b, ids_b, w_b) = (
            buf.sample_prioritized(batch_size, 0.4) for buf in bufs
        )
        for col_a, col_b in zip(batch_a, batch_b, strict=True):
            np.testing.assert_array_equal(col_a, col_b)
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(w_a, w_b)
        stale = np.concatenate([ids_a, [max(0, added - 60)]])  # sometimes overwritten by now
        td = rng.exponential(1.0, stale.size)
        for buf in bufs:
            buf.update_priorities(stale, td)
        np.testing.assert_array_equal(ref._priorities.tree._nodes, fast._priorities.tree._nodes)
        assert ref.stats() == fast.stats()
        probe = np.arange(added + 2)
        np.testing.assert_array_equal(ref.priorities_of(probe), fast.priorities_of(probe))


# ------------------------------------------------------------------------------ selection
def test_make_sum_tree_builds_the_implementation_asked_for() -> None:
    assert type(make_sum_tree(4, "numpy")) is SumTree
    with pytest.raises(ValueError, match="implementation"):
        make_sum_tree(4, "fortran")
    expected = CompiledSumTree if sumtree.IMPLEMENTATION == "compiled" else SumTree
    assert type(make_sum_tree(4)) is expected
    if sumtree.IMPLEMENTATION == "compiled":
        assert type(make_sum_tree(4, "compiled")) is CompiledSumTree
    else:
        with pytest.raises(RuntimeError, match="unavailable"):
            make_sum_tree(4, "compiled")


def implementation_with(env_value: str) -> str:
    env = {**os.environ, sumtree.IMPLEMENTATION_ENV: env_value}
    code = "import zmqrl.replay.sumtree as s; print(s.IMPLEMENTATION, type(s.make_sum_tree(3)).__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_environment_variable_forces_the_numpy_reference() -> None:
    assert implementation_with("numpy") == "numpy SumTree"


@compiled_only
def test_the_compiled_tree_is_the_default_where_it_was_built() -> None:
    assert implementation_with("") == "compiled CompiledSumTree"
    assert sumtree.IMPLEMENTATION == "compiled"
