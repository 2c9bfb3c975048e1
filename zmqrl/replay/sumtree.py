"""A vectorized, array-based sum tree: the index structure behind proportional prioritized replay.

Prioritized replay (Schaul et al. 2016) samples row ``i`` with probability ``v_i / sum(v)`` and
changes ``v_i`` after every training step, so it needs both operations in ``O(log n)``. A binary
tree whose internal nodes hold the sum of their children gives exactly that: a leaf update walks up
to the root, and a draw descends from the root choosing the child whose prefix sum covers a target.

Why vectorized rather than the textbook per-item loop: the learner samples and re-prioritises whole
batches (64..512 rows) per step, and a Python loop of ``batch * log2(capacity)`` iterations costs
milliseconds per step at 1M rows. Here every operation walks the tree *one level at a time for all
items at once*, so the Python overhead is ``log2(capacity)`` numpy calls regardless of batch size.

Layout: one ``float64`` array of ``2 * P`` nodes, ``P`` = capacity rounded up to a power of two.
Node 1 is the root, node ``k`` has children ``2k`` and ``2k + 1``, leaves are nodes ``P .. 2P - 1``
(leaf ``i`` is node ``P + i``), node 0 is unused. Leaves at ``capacity .. P - 1`` stay 0 forever, so
they can never be drawn. float64 because the sums of up to millions of small float32-scale
priorities must not drift enough to bias sampling.

Two implementations share that layout. ``SumTree`` is numpy only: the reference, always there.
``CompiledSumTree`` runs each batched operation as one call into a small C extension
(``_sumtree.c``, built by ``pip install`` where a C compiler exists): still ``log2(capacity)``
numpy-free steps per item, but no per-level call overhead, which is what made prioritized replay
slow next to uniform (docs/performance.md, "replay"). Both give bit-identical nodes and draws
(tests/test_sumtree_compiled.py). ``make_sum_tree`` picks the compiled one when the extension
loads (``IMPLEMENTATION``); ``ZMQRL_SUMTREE=numpy`` in the environment forces the reference.

Not thread-safe on its own: the owner (``zmqrl.replay.PrioritizedReplay``) serialises access.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Final

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

# Storage dtype of all nodes (see module docstring).
NODE_DTYPE: Final = np.dtype(np.float64)

# Environment variable choosing the implementation: "numpy" (the reference), "compiled" (fail if
# the extension did not load), unset or "auto" (compiled when it loads).
IMPLEMENTATION_ENV: Final = "ZMQRL_SUMTREE"

# A bulk update touching at least P / _REBUILD_DIVISOR distinct leaves recomputes every internal
# node with contiguous slices instead of walking fancy-indexed parents: above roughly this size the
# O(P) rebuild is cheaper than O(n log P) gathers/scatters (and it is what a full refill hits).
_REBUILD_DIVISOR: Final = 8

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class SumTree:
    """Fixed-capacity sum tree over non-negative leaf values, with batched updates and lookups."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        self._leaf0 = _next_power_of_two(self._capacity)  # P: index of leaf 0
        self._depth = self._leaf0.bit_length() - 1  # log2(P): descent steps from root to a leaf
        self._nodes: FloatArray = np.zeros(2 * self._leaf0, dtype=NODE_DTYPE)
        # View of the nodes as (left, right) sibling pairs: row k holds the children of node k,
        # so one gather per level fetches both.
        self._pairs: FloatArray = self._nodes.reshape(-1, 2)

    @property
    def capacity(self) -> int:
        """Number of usable leaves (leaf indices ``0 .. capacity - 1``)."""
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the node array."""
        return int(self._nodes.nbytes)

    @property
    def total(self) -> float:
        """Sum of all leaf values (the root)."""
        return float(self._nodes[1])

    def get(self, indices: npt.ArrayLike) -> FloatArray:
        """Leaf values at ``indices`` (a copy)."""
        idx = self._check_indices(indices)
        return self._nodes[self._leaf0 + idx]

    def update(self, indices: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Set leaves ``indices`` to ``values`` and refresh every ancestor.

        Duplicate indices are allowed and the *last* occurrence wins (the order a loop of single
        writes would give): numpy's fancy assignment does not promise which duplicate lands, so
        the input is reduced to one value per leaf explicitly before writing.

        Raises ValueError on out-of-range indices, mismatched lengths, or values that are negative
        or not finite (a NaN would poison every sum above it, silently and permanently).
        """
        idx = self._check_indices(indices)
        vals = np.asarray(values, dtype=NODE_DTYPE).reshape(-1)
        if vals.shape != idx.shape:
            raise ValueError(f"got {idx.size} indices but {vals.size} values")
        if idx.size == 0:
            return
        if not (np.isfinite(vals).all() and (vals >= 0).all()):
            raise ValueError("sum tree values must be finite and >= 0")
        # Last-wins dedupe: the first occurrence in the reversed array is the last in the original.
        # (np.unique also sorts the leaves, which keeps the gathers below cache-friendly.)
        leaves, first_in_reversed = np.unique(idx[::-1], return_index=True)
        vals = vals[::-1][first_in_reversed]
        nodes = self._nodes
        p = self._leaf0
        nodes[p + leaves] = vals
        if leaves.size * _REBUILD_DIVISOR >= p:
            self._rebuild()
            return
        # Parents need no dedupe: siblings share a parent, but every copy of it is computed from
        # the same children, gathered in full before the scatter, so all copies write one value.
        pairs = self._pairs
        level = leaves + p
        for _ in range(self._depth):
            level >>= 1
            children = pairs[level]
            nodes[level] = children[:, 0] + children[:, 1]

    def update_current(
        self, ids: npt.ArrayLike, values: npt.ArrayLike, owners: IntArray
    ) -> tuple[BoolArray, int]:
        """``update`` for the ids whose leaf still holds them: leaf ``ids[j] % capacity`` gets
        ``values[j]`` where ``owners[leaf] == ids[j]`` (``owners``: the id each leaf holds now).

        For a caller whose rows are overwritten while it holds their ids (prioritized replay's
        ring), so that an id from before the overwrite does not set the new row's value. Returns
        ``(live, n_live)``: which ``j`` were written and how many. Raises ValueError, with nothing
        written, for mismatched lengths, a negative id, or a value to write that ``update`` refuses.
        """
        idx = _as_leaf_indices(ids)
        vals = np.asarray(values, dtype=NODE_DTYPE).reshape(-1)
        if vals.shape != idx.shape:
            raise ValueError(f"got {idx.size} indices but {vals.size} values")
        if idx.size and int(idx.min()) < 0:
            raise ValueError("ids must be >= 0")
        slots = idx % self._capacity
        live = owners[slots] == idx
        n_live = int(np.count_nonzero(live))
        if n_live:
            self.update(slots[live], vals[live])
        return live, n_live

    def find_prefix_sum(self, targets: npt.ArrayLike) -> IntArray:
        """For each target ``t``, the leaf ``i`` with ``sum(v[:i]) <= t < sum(v[:i + 1])``.

        All targets descend together, one numpy step per tree level. Robust to float drift: targets
        are clipped to ``[0, total]``, and the descent never enters a subtree whose sum is zero (it
        goes right only if the right child is positive), so when ``total > 0`` every result is a
        leaf with a non-zero value, even for ``t >= total`` or when rounding made ``t - left``
        exceed the right child's sum.

        Raises ValueError when the tree is empty (``total == 0``) or a target is not finite.
        """
        t = np.array(targets, dtype=NODE_DTYPE).reshape(-1)  # a copy: modified in place below
        total = self._nodes[1]
        if not total > 0:
            raise ValueError("cannot search a sum tree whose total is zero")
        if not np.isfinite(t).all():
            raise ValueError("prefix-sum targets must be finite")
        np.clip(t, 0.0, total, out=t)
        nodes = self._nodes
        node = np.ones(t.shape, dtype=np.int64)
        for _ in range(self._depth):
            node <<= 1  # left child
            left_sum = nodes[node]
            go_right = (t >= left_sum) & (nodes[node + 1] > 0)
            np.subtract(t, left_sum, out=t, where=go_right)
            node += go_right
        return node - self._leaf0

    def sample_stratified(self, uniforms: npt.ArrayLike) -> tuple[IntArray, FloatArray]:
        """``(leaves, values)`` for one draw in each of ``n = len(uniforms)`` equal segments of
        ``[0, total)``: target ``j`` is ``(j + uniforms[j]) * total / n`` (uniforms in [0, 1)),
        searched as ``find_prefix_sum`` does; ``values`` are the drawn leaves' values.

        Raises ValueError when the tree is empty or a uniform is not finite.
        """
        u = np.asarray(uniforms, dtype=NODE_DTYPE).reshape(-1)
        total = self._nodes[1]
        if not total > 0:
            raise ValueError("cannot search a sum tree whose total is zero")
        if not np.isfinite(u).all():
            raise ValueError("uniform draws must be finite")
        if u.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=NODE_DTYPE)
        leaves = self.find_prefix_sum((np.arange(u.size) + u) * (total / u.size))
        return leaves, self._nodes[self._leaf0 + leaves]

    def _rebuild(self) -> None:
        """Recompute all internal nodes from the leaves, one contiguous slice per level."""
        nodes = self._nodes
        lo = self._leaf0 >> 1
        while lo >= 1:
            nodes[lo : 2 * lo] = nodes[2 * lo : 4 * lo : 2] + nodes[2 * lo + 1 : 4 * lo : 2]
            lo >>= 1

    def _check_indices(self, indices: npt.ArrayLike) -> IntArray:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" and idx.size:
            raise ValueError(f"leaf indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self._capacity):
            raise ValueError(f"leaf index out of range [0, {self._capacity})")
        return idx


def _load_kernels() -> tuple[ModuleType | None, str]:
    """The compiled extension (or None) and why, honouring ``ZMQRL_SUMTREE``."""
    wanted = os.environ.get(IMPLEMENTATION_ENV, "auto").strip().lower() or "auto"
    if wanted == "numpy":
        return None, f"{IMPLEMENTATION_ENV}=numpy"
    try:
        kernels = importlib.import_module("zmqrl.replay._sumtree")
    except ImportError as exc:  # not built (no compiler at install time), or built for another Python
        return None, f"the compiled extension did not load: {exc}"
    if wanted not in ("auto", "compiled"):
        return kernels, f"ignored {IMPLEMENTATION_ENV}={wanted!r} (expected numpy, compiled or auto)"
    return kernels, "zmqrl.replay._sumtree"


_kernels, _WHY = _load_kernels()
# Which implementation make_sum_tree builds: "compiled" or "numpy" (the reference).
IMPLEMENTATION: Final = "compiled" if _kernels is not None else "numpy"
_REQUIRED = os.environ.get(IMPLEMENTATION_ENV, "").strip().lower() == "compiled"
_announced = False


class CompiledSumTree(SumTree):
    """``SumTree`` with each batched operation done by one call into ``_sumtree.c``.

    Same nodes array, same arithmetic, same errors as the reference it subclasses; only the
    speed differs. Inputs are converted to contiguous int64 / float64 here (a no-op for arrays
    that already are), and the kernel validates everything before it writes anything.
    """

    def __init__(self, capacity: int) -> None:
        if _kernels is None:
            raise RuntimeError(f"the compiled sum tree is unavailable: {_WHY}")
        super().__init__(capacity)
        self._k = _kernels

    def get(self, indices: npt.ArrayLike) -> FloatArray:
        idx = _as_leaf_indices(indices)
        out = np.empty(idx.size, dtype=NODE_DTYPE)
        self._k.get(self._nodes, self._capacity, idx, out)
        return out

    def update(self, indices: npt.ArrayLike, values: npt.ArrayLike) -> None:
        self._k.update(
            self._nodes,
            self._capacity,
            _as_leaf_indices(indices),
            np.asarray(values, dtype=NODE_DTYPE).ravel(),
        )

    def update_current(
        self, ids: npt.ArrayLike, values: npt.ArrayLike, owners: IntArray
    ) -> tuple[BoolArray, int]:
        idx = _as_leaf_indices(ids)
        live = np.empty(idx.size, dtype=np.bool_)
        n_live = self._k.update_current(
            self._nodes,
            self._capacity,
            idx,
            np.asarray(values, dtype=NODE_DTYPE).ravel(),
            np.ascontiguousarray(owners, dtype=np.int64),
            live,
        )
        return live, int(n_live)

    def find_prefix_sum(self, targets: npt.ArrayLike) -> IntArray:
        t = np.asarray(targets, dtype=NODE_DTYPE).ravel()
        leaves = np.empty(t.size, dtype=np.int64)
        self._k.find(self._nodes, self._capacity, t, leaves, np.empty(t.size, dtype=NODE_DTYPE))
        return leaves

    def sample_stratified(self, uniforms: npt.ArrayLike) -> tuple[IntArray, FloatArray]:
        u = np.asarray(uniforms, dtype=NODE_DTYPE).ravel()
        leaves = np.empty(u.size, dtype=np.int64)
        values = np.empty(u.size, dtype=NODE_DTYPE)
        self._k.stratified(self._nodes, self._capacity, u, leaves, values)
        return leaves, values


def _as_leaf_indices(indices: npt.ArrayLike) -> IntArray:
    """Indices as contiguous 1-D int64 (no copy when they already are); ValueError for floats."""
    idx = np.asarray(indices)
    if idx.dtype != np.int64:
        if idx.dtype.kind not in "iu" and idx.size:
            raise ValueError(f"leaf indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64)
    return idx.ravel()


def all_finite_nonnegative(values: FloatArray) -> bool:
    """Whether every value of a float64 array is finite and >= 0, in one pass where compiled."""
    if _kernels is not None and values.dtype == NODE_DTYPE:
        return bool(_kernels.all_finite_nonnegative(values.ravel()))
    return bool(np.isfinite(values).all() and (values >= 0).all())


def make_sum_tree(capacity: int, implementation: str | None = None) -> SumTree:
    """A sum tree of ``capacity`` leaves: ``implementation`` "compiled" or "numpy", None for
    ``IMPLEMENTATION``. The first call logs which one the process uses."""
    global _announced
    if implementation is None:
        if _REQUIRED and _kernels is None:
            raise RuntimeError(f"{IMPLEMENTATION_ENV}=compiled, but {_WHY}")
        implementation = IMPLEMENTATION
        if not _announced:
            _announced = True
            log.info("sum tree: %s (%s)", implementation, _WHY)
    if implementation == "compiled":
        return CompiledSumTree(capacity)
    if implementation == "numpy":
        return SumTree(capacity)
    raise ValueError(f"sum tree implementation must be 'compiled' or 'numpy', got {implementation!r}")
