"""Tests for zmqrl.replay.sumtree.SumTree and zmqrl.replay.PrioritizedReplay.

The sum tree is checked against a brute-force cumsum/searchsorted reference with exactly
representable values (small multiples of 1/8), so tree and reference agree bit for bit even on
segment boundaries. Sampling proportions are checked with a chi-square statistic: stratified
sampling has *lower* variance than the multinomial the bound assumes, so the bound is conservative.
Rows are added with ``reward == insertion ordinal`` wherever possible, which lets a test check that
the ids sampling returns really name the rows it returned.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_replay import OBS_DIM, make_batch
from zmqrl.config import ReplayConfig
from zmqrl.core import Replay
from zmqrl.replay import (
    DEFAULT_MAX_INITIAL_PRIORITY_RATIO,
    INITIAL_MAX_PRIORITY,
    PrioritizedReplay,
    make_replay,
    sumtree,
)
from zmqrl.replay.sumtree import SumTree, make_sum_tree
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

# chi-square critical values at p = 0.001 for the degrees of freedom used below.
CHI2_999 = {7: 24.32, 9: 27.88, 15: 37.70}

# The sum-tree tests run on both implementations (tests/test_sumtree_compiled.py compares them).
TREES = [
    "numpy",
    pytest.param(
        "compiled",
        marks=pytest.mark.skipif(sumtree.IMPLEMENTATION != "compiled", reason="compiled sum tree not built"),
    ),
]


# ---------------------------------------------------------------------------------------- helpers
# Bounds so loose they never bind: for the tests of sampling's arithmetic (proportionality,
# importance weights), whose priorities span more than the production bounds allow.
LOOSE_BOUNDS = {"max_priority": 1e30, "max_draw_ratio": 1e30}


def make_per(
    capacity: int,
    alpha: float = 0.6,
    eps: float = 1e-6,
    seed: int | None = 0,
    obs_dim: int = OBS_DIM,
    bounds: dict[str, float] | None = None,
) -> PrioritizedReplay:
    """A prioritized buffer; ``bounds`` None: LOOSE_BOUNDS, {}: the production defaults."""
    return PrioritizedReplay(
        capacity,
        (obs_dim,),
        np.float32,
        (),
        np.int64,
        seed=seed,
        alpha=alpha,
        priority_eps=eps,
        **(LOOSE_BOUNDS if bounds is None else bounds),
    )


def add_measured(buf: PrioritizedReplay, ids: range, raw: np.ndarray) -> None:
    """Add rows and give them priorities as the learner does (``update_priorities``), which are
    not bounded the way actor-sent ones are."""
    buf.add(make_batch(ids))
    buf.update_priorities(np.asarray(ids, dtype=np.int64), raw)


def assert_rows_consistent(batch: TransitionBatch) -> None:
    """Every sampled row must be one row as it was added (no mixing of columns or rows)."""
    ids = batch.reward.astype(np.int64)
    np.testing.assert_array_equal(batch.obs, np.repeat(ids[:, None], batch.obs.shape[1], axis=1))
    np.testing.assert_array_equal(batch.next_obs, batch.obs + 0.5)
    np.testing.assert_array_equal(batch.action, ids % 2)


def reference_find(values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Brute force: first leaf whose inclusive prefix sum exceeds the target (clipped below total)."""
    cum = np.cumsum(values)
    last_nonzero = int(np.flatnonzero(values)[-1])
    idx = np.searchsorted(cum, np.clip(targets, 0, None), side="right")
    return np.minimum(idx, last_nonzero)  # targets >= total land on the last non-zero leaf


def assert_tree_consistent(tree: SumTree) -> None:
    """Every internal node equals the sum of its children (peeks at storage: test-only)."""
    nodes = tree._nodes
    p = len(nodes) // 2
    k = np.arange(1, p)
    np.testing.assert_allclose(nodes[k], nodes[2 * k] + nodes[2 * k + 1], rtol=1e-12, atol=0)


def exact_values(rng: np.random.Generator, n: int, zero_frac: float = 0.3) -> np.ndarray:
    """Values that are multiples of 1/8 below 64 (exact in float64 sums), some of them zero."""
    v = rng.integers(0, 512, size=n) / 8.0
    v[rng.random(n) < zero_frac] = 0.0
    return v


# ---------------------------------------------------------------------------------------- sum tree
@pytest.mark.parametrize("impl", TREES)
@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 31, 32, 33, 64, 1000, 1024, 1025, 40_000])
def test_sumtree_matches_bruteforce(capacity: int, impl: str) -> None:
    rng = np.random.default_rng(capacity)
    tree = make_sum_tree(capacity, impl)
    ref = np.zeros(capacity)
    for _ in range(20):
        n = int(rng.integers(1, 2 * capacity + 2))
        idx = rng.integers(0, capacity, size=n)  # with replacement: duplicates are common
        vals = exact_values(rng, n)
        tree.update(idx, vals)
        for i, v in zip(idx.tolist(), vals.tolist(), strict=True):  # sequential: last write wins
            ref[i] = v
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
        assert tree.total == ref.sum()
        assert_tree_consistent(tree)
        if ref.sum() > 0:
            cum = np.cumsum(ref)
            # Random targets, every boundary exactly, just below each boundary, total and beyond.
            targets = np.concatenate(
                [rng.random(50) * ref.sum(), cum, np.maximum(cum - 0.0625, 0), [ref.sum(), ref.sum() * 2]]
            )
            found = tree.find_prefix_sum(targets)
            np.testing.assert_array_equal(found, reference_find(ref, targets))
            assert (ref[found] > 0).all()


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 70),
    ops=st.lists(
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 40)), min_size=1, max_size=30),
        min_size=1,
        max_size=6,
    ),
)
def test_sumtree_property_last_write_wins(capacity: int, ops: list[list[tuple[int, int]]]) -> None:
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for op in ops:
        idx = np.array([i % capacity for i, _ in op])
        vals = np.array([v / 4.0 for _, v in op])
        tree.update(idx, vals)
        for i, v in zip(idx.tolist(), vals.tolist(), strict=True):
            ref[i] = v
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
    assert tree.total == ref.sum()
    assert_tree_consistent(tree)
    if ref.sum() > 0:
        targets = np.concatenate([np.cumsum(ref), np.linspace(0, ref.sum() * 1.1, 17)])
        found = tree.find_prefix_sum(targets)
        np.testing.assert_array_equal(found, reference_find(ref, targets))


@pytest.mark.parametrize("impl", TREES)
def test_sumtree_float_drift_never_returns_zero_leaf(impl: str) -> None:
    """Arbitrary float values: sums are inexact, yet no target may land on a zero-valued leaf."""
    rng = np.random.default_rng(1)
    cap = 5000
    tree = make_sum_tree(cap, impl)
    vals = rng.random(cap) ** 8  # wide dynamic range
    vals[rng.random(cap) < 0.5] = 0.0
    vals[-100:] = 0.0  # trailing zeros: a target at/above total must not fall into them
    tree.update(np.arange(cap), vals)
    total = tree.total
    targets = np.concatenate(
        [
            rng.random(2000) * total,
            total * (1 - rng.random(200) * 1e-12),
            [total, np.nextafter(total, np.inf), total * 10, 0.0, -1.0],
        ]
    )
    found = tree.find_prefix_sum(targets)
    assert ((found >= 0) & (found < cap)).all()
    assert (vals[found] > 0).all()
    # Away from boundaries, the tree agrees with the reference despite different summation order.
    inner = targets[:2000]
    np.testing.assert_array_equal(found[:2000], reference_find(vals, inner))


@pytest.mark.parametrize("impl", TREES)
def test_sumtree_incremental_matches_rebuild(impl: str) -> None:
    """Small updates walk parents; big ones rebuild everything; both must give the same tree."""
    rng = np.random.default_rng(2)
    cap = 300
    a, b = make_sum_tree(cap, impl), make_sum_tree(cap, impl)
    v = exact_values(rng, cap)
    a.update(np.arange(cap), v)  # rebuild path
    for chunk in np.array_split(np.arange(cap), 60):  # incremental path, 5 leaves at a time
        b.update(chunk, v[chunk])
    np.testing.assert_array_equal(a._nodes, b._nodes)


@pytest.mark.parametrize("impl", TREES)
def test_sumtree_rejects_bad_input(impl: str) -> None:
    tree = make_sum_tree(5, impl)
    with pytest.raises(ValueError, match="total is zero"):
        tree.find_prefix_sum(np.array([0.0]))
    with pytest.raises(ValueError, match="range"):
        tree.update(np.array([5]), np.array([1.0]))
    with pytest.raises(ValueError, match="range"):
        tree.update(np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match=">= 0"):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="values"):
        tree.update(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="integers"):
        tree.update(np.array([0.5]), np.array([1.0]))
    assert tree.total == 0.0
    with pytest.raises(ValueError):
        SumTree(0)


# ---------------------------------------------------------------------------------------- replay
def test_the_factorys_prioritized_buffer_satisfies_the_replay_contract() -> None:
    spec = SampleSpec((OBS_DIM,), "float32", (), "int64", num_actions=2)
    buf = make_replay(ReplayConfig(capacity=4, prioritized=True), spec, seed=0)
    assert isinstance(buf, Replay)
    assert type(buf) is PrioritizedReplay


def chi2_of(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def test_sampling_proportional_to_priority_power_alpha() -> None:
    alpha, eps = 0.6, 0.01
    raw = np.array([0.0, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
    buf = make_per(len(raw), alpha=alpha, eps=eps, seed=11)
    add_measured(buf, range(len(raw)), raw)
    counts = np.zeros(len(raw))
    for _ in range(100):
        batch, ids, _ = buf.sample_prioritized(1000, beta=0.4)
        np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
        counts += np.bincount(ids, minlength=len(raw))
    probs = (raw + eps) ** alpha / ((raw + eps) ** alpha).sum()
    assert chi2_of(counts, probs) < CHI2_999[9]
    # Per item: within 4 binomial standard deviations (stratification only tightens this).
    n = counts.sum()
    assert (np.abs(counts - n * probs) < 4 * np.sqrt(n * probs * (1 - probs)) + 1).all()


def test_plain_sample_is_prioritized_too() -> None:
    raw = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 93.0])
    buf = make_per(8, alpha=1.0, eps=0.0, seed=3)
    add_measured(buf, range(8), raw)
    counts = np.bincount(buf.sample(50_000).batch.reward.astype(int), minlength=8)
    assert chi2_of(counts, raw / raw.sum()) < CHI2_999[7]


def test_alpha_zero_is_uniform() -> None:
    k = 16
    buf = make_per(k, alpha=0.0, eps=0.0, seed=5)
    buf.add(make_batch(range(k)), np.geomspace(1e-3, 1e3, k))
    counts = np.zeros(k)
    for _ in range(20):
        counts += np.bincount(buf.sample_prioritized(1000, beta=1.0)[1], minlength=k)
    assert chi2_of(counts, np.full(k, 1 / k)) < CHI2_999[15]
    _, _, weights = buf.sample_prioritized(64, beta=1.0)
    np.testing.assert_array_equal(weights, np.ones(64, np.float32))  # N * P(i) == 1 for all


def test_importance_weights_hand_computed() -> None:
    """Priorities 1..4 with alpha 1: P = (.1, .2, .3, .4), N = 4, so N*P = (.4, .8, 1.2, 1.6)."""
    buf = make_per(4, alpha=1.0, eps=0.0, seed=0)
    buf.add(make_batch(range(4)), np.array([1.0, 2.0, 3.0, 4.0]))
    n_p = np.array([0.4, 0.8, 1.2, 1.6])
    for beta in (0.0, 0.5, 1.0):
        for _ in range(20):
            _, ids, w = buf.sample_prioritized(3, beta)
            assert w.dtype == np.float32 and w.shape == (3,)
            raw_w = n_p[ids] ** -beta
            np.testing.assert_allclose(w, raw_w / raw_w.max(), rtol=1e-6)
            assert w.max() == 1.0
    # A batch that surely holds row 0 (the rarest): weights relative to it are exactly N*P ratios.
    _, ids, w = buf.sample_prioritized(4, 1.0)  # stratified: segment [0, 2.5) always hits row 0 or 1
    assert {0, 1} & set(ids.tolist())
    expected = {0: 1.0, 1: 0.5, 2: 1 / 3, 3: 0.25}  # (0.4 / (N*P_i)) when row 0 is in the batch
    if 0 in ids:
        np.testing.assert_allclose(w, [expected[i] for i in ids.tolist()], rtol=1e-6)


def test_new_rows_get_the_largest_priority_the_learner_has_given() -> None:
    alpha, eps = 0.5, 1e-6
    buf = make_per(16, alpha=alpha, eps=eps)
    assert buf.max_priority == INITIAL_MAX_PRIORITY
    buf.add(make_batch([0, 1]))
    np.testing.assert_allclose(buf.priorities_of(np.array([0, 1])), (1.0 + eps) ** alpha)
    # An actor's priorities are stored (within the bound) but do not move the running max.
    buf.add(make_batch([2, 3]), np.array([5.0, 2.0]))
    np.testing.assert_allclose(buf.priorities_of(np.array([2, 3])), (np.array([5.0, 2.0]) + eps) ** alpha)
    assert buf.max_priority == INITIAL_MAX_PRIORITY
    buf.add(make_batch([4]))
    np.testing.assert_allclose(buf.priorities_of(np.array([4])), (1.0 + eps) ** alpha)
    buf.update_priorities(np.array([0]), np.array([9.0]))
    buf.add(make_batch([5]))
    np.testing.assert_allclose(buf.priorities_of(np.array([0, 5])), (9.0 + eps) ** alpha)
    # Lower priorities never lower the running max.
    buf.update_priorities(np.array([0, 5]), np.array([0.1, 0.1]))
    assert buf.max_priority == 9.0


def test_update_priorities_skips_overwritten_rows() -> None:
    alpha, eps = 1.0, 0.0
    buf = make_per(4, alpha=alpha, eps=eps)
    buf.add(make_batch(range(4)), np.ones(4))
    _, ids, _ = buf.sample_prioritized(64, beta=0.4)  # ids among 0..3
    buf.add(make_batch(range(4, 7)), np.full(3, 2.0))  # overwrites ordinals 0..2
    before = buf.total_priority
    buf.update_priorities(ids, np.full(ids.size, 1000.0))
    n_stale = int(np.count_nonzero(ids < 3))
    assert buf.stale_priority_updates == n_stale
    # Only ordinal 3 (still stored) changed; the rows now in slots 0..2 kept priority 2.
    np.testing.assert_array_equal(buf.priorities_of(np.array([4, 5, 6])), [2.0, 2.0, 2.0])
    expected_3 = 1000.0 if 3 in ids else 1.0
    assert buf.total_priority == pytest.approx(before - 1.0 + expected_3)
    assert np.isnan(buf.priorities_of(np.array([0, 1, 2]))).all()
    # Ids never issued (future ordinals) are skipped as well.
    buf.update_priorities(np.array([7, 11]), np.array([5.0, 5.0]))
    assert buf.stale_priority_updates == n_stale + 2


def test_update_priorities_duplicate_ids_last_wins() -> None:
    buf = make_per(8, alpha=1.0, eps=0.0)
    buf.add(make_batch(range(8)))
    buf.update_priorities(np.array([3, 5, 3, 3]), np.array([7.0, 2.0, 9.0, 4.0]))
    np.testing.assert_array_equal(buf.priorities_of(np.array([3, 5])), [4.0, 2.0])
    assert buf.max_priority == 9.0  # every priority given counts towards the running max


def test_batch_larger_than_capacity_keeps_newest_with_their_priorities() -> None:
    buf = make_per(4, alpha=1.0, eps=0.0)
    buf.add(make_batch([0]))
    buf.add(make_batch(range(1, 11)), np.arange(1, 11, dtype=np.float64))
    assert len(buf) == 4 and buf.total_added == 11
    np.testing.assert_array_equal(buf.snapshot().reward, [7, 8, 9, 10])  # oldest first
    np.testing.assert_array_equal(buf.priorities_of(np.arange(7, 11)), [7, 8, 9, 10])
    assert buf.total_priority == 34.0
    batch, ids, _ = buf.sample_prioritized(200, beta=0.5)
    np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))  # id == insertion ordinal
    assert set(ids.tolist()) <= {7, 8, 9, 10}
    assert_rows_consistent(batch)
    assert buf.max_priority == INITIAL_MAX_PRIORITY  # actor-sent priorities never raise it
    assert buf.clipped_priorities == 0  # 10 is exactly the bound (ratio 10 x max 1), not above it
    # FIFO continues: the next row overwrites the oldest survivor (7).
    buf.add(make_batch([11]))
    np.testing.assert_array_equal(buf.snapshot().reward, [8, 9, 10, 11])


def test_sample_before_full_uses_only_filled_rows() -> None:
    buf = make_per(100)
    buf.add(make_batch([0, 1, 2]))
    batch, ids, w = buf.sample_prioritized(300, beta=1.0)
    assert set(ids.tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
    np.testing.assert_allclose(w, 1.0)


def test_zero_priority_rows_never_sampled() -> None:
    buf = make_per(8, alpha=1.0, eps=0.0)
    buf.add(make_batch(range(8)), np.array([0, 0, 3, 0, 0, 0, 1, 0], np.float64))
    assert set(buf.sample_prioritized(1000, 0.5)[1].tolist()) <= {2, 6}
    buf.update_priorities(np.array([2, 6]), np.zeros(2))
    with pytest.raises(ValueError, match="zero"):
        buf.sample(1)


def test_invalid_priorities_raise_and_change_nothing() -> None:
    buf = make_per(8)
    buf.add(make_batch(range(4)))
    total, snap = buf.total_priority, buf.snapshot()
    bad_values = [np.nan, np.inf, -0.5]
    for bad in bad_values:
        with pytest.raises(ValueError, match="finite"):
            buf.update_priorities(np.array([0, 1]), np.array([1.0, bad]))
        with pytest.raises(ValueError, match="finite"):
            buf.add(make_batch([4, 5]), np.array([bad, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        buf.add(make_batch([4, 5]), np.array([1.0]))
    with pytest.raises(ValueError, match="shape"):
        buf.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        buf.update_priorities(np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match="integers"):
        buf.update_priorities(np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="beta"):
        buf.sample_prioritized(4, beta=float("nan"))
    assert buf.total_priority == total and len(buf) == 4 and buf.max_priority == INITIAL_MAX_PRIORITY
    np.testing.assert_array_equal(buf.snapshot().reward, snap.reward)
    with pytest.raises(ValueError, match="alpha"):
        make_per(4, alpha=-1.0)
    with pytest.raises(ValueError, match="priority_eps"):
        make_per(4, eps=float("nan"))


def test_sample_on_empty_and_bad_batch_size_raise() -> None:
    buf = make_per(4)
    with pytest.raises(ValueError, match="empty"):
        buf.sample_prioritized(1, beta=0.4)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    buf.add(make_batch([0]))
    with pytest.raises(ValueError):
        buf.sample_prioritized(0, beta=0.4)


def test_snapshot_restore_round_trip() -> None:
    src = make_per(8, alpha=1.0, eps=0.0, seed=4)
    src.add(make_batch(range(13)), np.arange(13, dtype=np.float64))  # keeps 5..12
    snap = src.snapshot()
    dst = make_per(8, alpha=1.0, eps=0.0, seed=99)
    dst.restore(snap, total_added=src.total_added)
    assert len(dst) == 8 and dst.total_added == 13
    for a, b in zip(snap, dst.snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)
    # Restored rows keep the ordinals they had in the saving run and all get max priority (1.0).
    batch, ids, w = dst.sample_prioritized(100, beta=1.0)
    np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
    np.testing.assert_array_equal(dst.priorities_of(np.arange(5, 13)), np.ones(8))
    np.testing.assert_allclose(w, 1.0)
    # The restored buffer carries on exactly like the original would.
    dst.add(make_batch([13]))
    assert dst.total_added == 14
    np.testing.assert_array_equal(dst.snapshot().reward, np.arange(6, 14))
    dst.update_priorities(np.array([13, 6]), np.array([3.0, 2.0]))
    np.testing.assert_array_equal(dst.priorities_of(np.array([13, 6, 5])), [3.0, 2.0, np.nan])
    # RNG state round trip: identical draws afterwards.
    state = dst.rng_state()
    first = dst.sample_prioritized(16, beta=0.5)[1]
    dst.set_rng_state(state)
    np.testing.assert_array_equal(dst.sample_prioritized(16, beta=0.5)[1], first)


def test_restore_partial_and_into_non_empty_buffer() -> None:
    src = make_per(16)
    src.add(make_batch(range(10)))
    dst = make_per(16)
    dst.restore(src.snapshot(max_rows=4), total_added=10)
    np.testing.assert_array_equal(dst.snapshot().reward, [6, 7, 8, 9])
    batch, ids, _ = dst.sample_prioritized(50, beta=0.5)
    np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
    # Into a non-empty buffer: appended with the next ordinals; the counter is only raised.
    other = make_per(16)
    other.add(make_batch([0]))
    other.restore(make_batch([1, 2]), total_added=50)
    assert other.total_added == 50 and len(other) == 3
    batch, ids, _ = other.sample_prioritized(50, beta=0.5)
    np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
    other.restore(make_batch([]))  # empty restore is a no-op
    assert len(other) == 3


@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(1, 12),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 20), st.booleans()),
            st.tuples(st.just("update"), st.lists(st.integers(0, 60), max_size=10), st.booleans()),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_model_based_priorities(capacity: int, ops: list[tuple[str, object, bool]]) -> None:
    """Random adds/updates against a dict model {live ordinal: raw priority}. Actor priorities
    (up to 40, above the bound of 10 x the running max at first) are clipped to the bound; only
    updates (the learner's priorities) raise the running max."""
    alpha, eps, ratio = 0.5, 0.25, DEFAULT_MAX_INITIAL_PRIORITY_RATIO
    buf = make_per(capacity, alpha=alpha, eps=eps)
    model: dict[int, float] = {}
    running_max, next_id, clipped, rng = 1.0, 0, 0, np.random.default_rng(0)
    for kind, arg, flag in ops:
        if kind == "add":
            n = int(arg)  # type: ignore[call-overload]
            pri = rng.integers(0, 41, size=n).astype(np.float64) if flag else None
            buf.add(make_batch(range(next_id, next_id + n)), pri)
            vals = [running_max] * n if pri is None else np.minimum(pri, ratio * running_max).tolist()
            if pri is not None:
                clipped += int(np.count_nonzero(pri[max(0, n - capacity) :] > ratio * running_max))
            model.update(zip(range(next_id, next_id + n), vals, strict=True))
            next_id += n
            model = {k: v for k, v in model.items() if k >= next_id - capacity}
        else:
            ids = np.array(arg, dtype=np.int64)
            pri = rng.integers(0, 8, size=ids.size).astype(np.float64)
            buf.update_priorities(ids, pri)
            for i, p in zip(ids.tolist(), pri.tolist(), strict=True):
                if i in model:
                    model[i] = p
                    running_max = max(running_max, p)
    assert len(buf) == len(model) and buf.total_added == next_id
    assert buf.max_priority == running_max and buf.clipped_priorities == clipped
    if model:
        keys = np.array(sorted(model))
        expected = (np.array([model[k] for k in keys]) + eps) ** alpha
        np.testing.assert_allclose(buf.priorities_of(keys), expected, rtol=1e-12)
        assert buf.total_priority == pytest.approx(expected.sum(), rel=1e-12)
        np.testing.assert_array_equal(buf.snapshot().reward, keys)
        batch, ids, _ = buf.sample_prioritized(16, beta=0.5)
        np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
    assert_tree_consistent(buf._priorities.tree)


def test_concurrent_add_sample_update() -> None:
    """Ingest thread adds (with and without priorities) while the trainer samples and updates.

    Afterwards the tree must still be internally consistent and hold exactly one positive leaf per
    stored row, and every sampled row must have matched its id (no torn rows, no stale ids).
    """
    obs_dim, cap, rounds = 128, 256, 300
    buf = make_per(cap, alpha=0.7, eps=1e-3, obs_dim=obs_dim, seed=8)
    buf.add(make_batch(range(cap), obs_dim=obs_dim))
    errors: list[BaseException] = []
    stop = threading.Event()
    n_samples = [0]

    sampled = threading.Condition()

    def trainer_moved_on(since: int) -> None:
        """Wait until the trainer sampled again: the two really overlap, whatever the scheduler
        does (a loaded machine could otherwise run the whole writer before the trainer's first draw)."""
        with sampled:
            if not sampled.wait_for(lambda: n_samples[0] > since or stop.is_set(), timeout=20):
                raise AssertionError(f"the trainer did not sample for 20 s (stuck at {since})")

    def writer() -> None:
        try:
            rng = np.random.default_rng(1)
            for r in range(rounds):
                if r % 30 == 0:
                    trainer_moved_on(n_samples[0] if r else 0)
                ids = range(cap + r * 40, cap + (r + 1) * 40)
                pri = rng.random(40) * 3 if r % 2 else None
                buf.add(make_batch(ids, obs_dim=obs_dim), pri)
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)
        finally:
            stop.set()

    def trainer() -> None:
        try:
            rng = np.random.default_rng(2)
            while not stop.is_set():
                batch, ids, w = buf.sample_prioritized(64, beta=0.5)
                assert_rows_consistent(batch)
                np.testing.assert_array_equal(ids, batch.reward.astype(np.int64))
                assert w.max() == 1.0 and (w > 0).all()
                buf.update_priorities(ids, rng.random(64) * 5)
                with sampled:
                    n_samples[0] += 1
                    sampled.notify_all()
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=trainer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors, errors[0]
    assert n_samples[0] > 0
    final = cap + rounds * 40
    assert buf.total_added == final and len(buf) == cap
    live = np.arange(final - cap, final)
    pri = buf.priorities_of(live)
    assert np.isfinite(pri).all() and (pri > 0).all()
    assert buf.total_priority == pytest.approx(pri.sum(), rel=1e-9)
    assert_tree_consistent(buf._priorities.tree)


# ------------------------------------------------------------------------- hostile actor priorities
def test_actor_priorities_are_clipped_to_a_multiple_of_the_learners_max() -> None:
    alpha, eps, ratio = 0.6, 1e-6, DEFAULT_MAX_INITIAL_PRIORITY_RATIO
    buf = make_per(16, alpha=alpha, eps=eps, bounds={"max_draw_ratio": 1e30})  # only this clip binds
    # Before the learner has measured anything, the bound is ratio x INITIAL_MAX_PRIORITY.
    buf.add(make_batch([0, 1, 2]), np.array([3e38, 5.0, 0.5]))
    expected = np.array([ratio * INITIAL_MAX_PRIORITY, 5.0, 0.5])
    np.testing.assert_allclose(buf.priorities_of(np.arange(3)), (expected + eps) ** alpha)
    assert buf.clipped_priorities == 1 and buf.max_priority == INITIAL_MAX_PRIORITY
    buf.add(make_batch([3]))  # a row without a priority is not poisoned either
    np.testing.assert_allclose(buf.priorities_of(np.array([3])), (INITIAL_MAX_PRIORITY + eps) ** alpha)
    # The learner's own priorities (below replay.max_priority) move the bound; actors' never do.
    buf.update_priorities(np.array([0]), np.array([40.0]))
    assert buf.max_priority == 40.0
    buf.add(make_batch([4, 5]), np.array([1e30, 399.0]))
    np.testing.assert_allclose(buf.priorities_of(np.array([4, 5])), (np.array([400.0, 399.0]) + eps) ** alpha)
    assert buf.clipped_priorities == 2 and buf.max_priority == 40.0


def test_bad_actor_priorities_are_still_rejected_with_nothing_changed() -> None:
    buf = make_per(8, bounds={})
    buf.add(make_batch(range(4)), np.full(4, 1e30))
    total, clipped = buf.total_priority, buf.clipped_priorities
    for bad in (np.nan, np.inf, -np.inf, -1.0):
        with pytest.raises(ValueError, match="finite"):
            buf.add(make_batch([4, 5]), np.array([1e30, bad]))
    assert (buf.total_priority, buf.clipped_priorities, len(buf)) == (total, clipped, 4)
    assert buf.max_priority == INITIAL_MAX_PRIORITY
    with pytest.raises(ValueError, match="max_initial_priority_ratio"):
        PrioritizedReplay(4, (1,), np.float32, (), np.int64, max_initial_priority_ratio=0.5)


@pytest.mark.parametrize("hostile", [3e38, 1e30, 1e6])
def test_a_hostile_actor_cannot_starve_the_others_rows(hostile: float) -> None:
    """Two actors insert alternately, one honest (priorities ~1), one sending ``hostile`` for
    every row; a simulated learner samples a batch per insert pair and writes back true |TD|
    (~1 for both actors' rows). The honest half of the data must keep a fair share of the draws
    (unbounded, the hostile rows took all of them and max_priority became ``hostile``)."""
    rows, steps, warmup = 32, 300, 50
    buf = make_per(1024, alpha=0.6, seed=7, bounds={})
    rng = np.random.default_rng(1)
    next_id, honest_draws, draws = 0, 0, 0
    for step in range(steps):
        for priorities in (rng.uniform(0.5, 1.5, rows), np.full(rows, hostile)):
            buf.add(make_batch(range(next_id, next_id + rows)), priorities)
            next_id += rows
        _, ids, _ = buf.sample_prioritized(2 * rows, beta=0.4)
        if step >= warmup:
            honest_draws += int(np.count_nonzero((ids // rows) % 2 == 0))  # even batches: honest
            draws += ids.size
        buf.update_priorities(ids, rng.uniform(0.5, 1.5, ids.size))
    assert honest_draws / draws >= 0.25
    assert buf.max_priority <= 1.5  # only the learner's priorities count
    assert buf.clipped_priorities == steps * rows  # every hostile row, no honest one
    bound = (buf.max_initial_priority_ratio * buf.max_priority + buf.priority_eps) ** buf.alpha
    live = np.arange(next_id - buf.capacity, next_id)
    assert buf.priorities_of(live).max() <= bound
