"""Shared-frame replay: the replay buffers that keep stacked image frames in frame pools
(frame_pool.py), ``SharedFramesReplay`` and ``SharedFramesPrioritizedReplay``, and their rows.

What goes to a pool (``frame_layout``): a plain observation ``(planes, *plane_shape)`` is one
stack of planes; a Dict observation (records, zmqrl.types) has one stack per image key
``(planes, H, W)``, each in a pool of its own (keys differ in plane shape and dtype and never
share planes), while its other keys (a small vector, say) stay in the row as they are: pooling
them would cost a digest and a reference count per value to save nothing. A row therefore stores
one observation as ``FrameLayout.stored``: plane ids for each stack, and for a Dict observation
a record of those ids beside the other keys' values. ``gather`` puts the planes back, so samples
and snapshots are exactly the observations that were added, whole records included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.replay.frame_pool import FramePool, replace_all, slots_for
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.storage import DenseRows, Dtypes, Ring, Shapes, UniformReplay
from zmqrl.types import TransitionBatch, describe

# Plane id of a row that holds no observation yet.
_NO_PLANE = -1


@dataclass(frozen=True)
class Stack:
    """One stack of image planes in an observation: the whole observation (``key`` None) or the
    field ``key`` of a record."""

    key: str | None
    planes: int
    plane_shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def plane_bytes(self) -> int:
        return int(np.prod(self.plane_shape, dtype=np.int64)) * self.dtype.itemsize

    def of(self, obs: np.ndarray) -> np.ndarray:
        """This stack's part of ``obs`` (observations, or what rows store of them): a view."""
        return obs if self.key is None else obs[self.key]


@dataclass(frozen=True)
class FrameLayout:
    """How a row keeps one observation of ``obs_dtype``: the ``stacks`` whose planes go to pools,
    and what the row itself holds, ``stored`` of shape ``stored_shape`` (plane ids for each
    stack; for a record, a record of them beside the keys in ``dense_keys``)."""

    obs_dtype: np.dtype[Any]
    stacks: tuple[Stack, ...]
    stored: np.dtype[Any]
    stored_shape: tuple[int, ...]
    dense_keys: tuple[str, ...]

    @property
    def row_bytes(self) -> int:
        """Bytes a row stores for one observation (of obs or next_obs)."""
        return int(np.prod(self.stored_shape, dtype=np.int64)) * self.stored.itemsize

    def empty(self, rows: int) -> np.ndarray:
        """What ``rows`` rows store when they hold no observation: every plane id ``_NO_PLANE``."""
        out = np.zeros((rows, *self.stored_shape), self.stored)
        for stack in self.stacks:
            stack.of(out)[...] = _NO_PLANE
        return out


def frame_layout(obs_shape: tuple[int, ...], obs_dtype: np.dtype[Any]) -> FrameLayout:
    """The layout of shared-frame rows for observations of ``obs_shape`` and ``obs_dtype``;
    ValueError (what make_replay turns into the config's refusal) when no part of them is a stack
    of image planes: a plain observation of fewer than 2 dimensions, a record without an image key."""
    dtype = np.dtype(obs_dtype)
    if dtype.names is None:
        if len(obs_shape) < 2:
            raise ValueError(
                f"replay.share_frames needs image observations (planes, height, width), got {list(obs_shape)}"
            )
        stack = Stack(None, obs_shape[0], tuple(obs_shape[1:]), dtype)
        return FrameLayout(dtype, (stack,), np.dtype(np.int64), (obs_shape[0],), ())
    if obs_shape != ():
        raise ValueError(
            f"replay.share_frames stores one record per observation, got records of shape {obs_shape}"
        )
    stacks: list[Stack] = []
    fields: list[tuple[str, Any, tuple[int, ...]]] = []  # the stored record's: ids, or the key as it is
    dense: list[str] = []
    for name in dtype.names:
        sub = dtype.fields[name][0]  # type: ignore[index]
        if len(sub.shape) == 3:  # an image key (planes, H, W), as the agents' CNN torsos read them
            stacks.append(Stack(name, sub.shape[0], tuple(sub.shape[1:]), sub.base))
            fields.append((name, np.dtype(np.int64), (sub.shape[0],)))
        else:
            dense.append(name)
            fields.append((name, sub.base, sub.shape))
    if not stacks:
        raise ValueError(
            f"replay.share_frames stores the image keys (planes, height, width) of a Dict observation, "
            f"and {describe(dtype)} has none"
        )
    return FrameLayout(dtype, tuple(stacks), np.dtype(fields, align=True), (), tuple(dense))


class FrameRows(DenseRows):
    """Rows whose ``obs`` and ``next_obs`` keep their image planes in ``FramePool``s, one per stack
    (``frame_layout``), and store plane ids (and a Dict observation's other keys) themselves.

    A stack of ``planes`` frames (e.g. 4 stacked 84x84 frames): consecutive transitions of one
    game share all but about one of their 8 planes, so a row costs ~1 plane instead of 8 (see
    frame_pool.py). ``gather`` puts the planes back into whole observations, so nothing downstream
    changes. Each pool is reserved for the worst case and becomes resident as distinct planes arrive.
    """

    def __init__(self, capacity: int, row_shapes: Shapes, dtypes: Dtypes) -> None:
        self.layout = frame_layout(row_shapes[0], dtypes[0])
        self.capacity = capacity
        # Sized for the worst case (frame_pool.py, `slots_for`): a full buffer keeps its planes
        # while a batch of up to `capacity` new rows is interned.
        self.pools = {
            s.key: FramePool(slots_for(capacity, s.planes), s.plane_shape, s.dtype)
            for s in self.layout.stacks
        }
        super().__init__(capacity, (*row_shapes[1:3], ()), (dtypes[1], dtypes[2], dtypes[4]))
        action, reward, discount = self.columns
        self.columns = (self.layout.empty(capacity), action, reward, self.layout.empty(capacity), discount)

    @property
    def nbytes(self) -> int:
        """Bytes in use now: the stored and scalar columns plus the distinct planes stored."""
        return super().nbytes + sum(pool.live * pool.planes[0].nbytes for pool in self.pools.values())

    def stage(self, batch: TransitionBatch, start: int, pos: int) -> tuple[np.ndarray, ...]:
        """Intern the new rows' planes and release those of the rows they overwrite, in every pool
        or in none (``replace_all``): the slots and what the new rows store, for ``write``."""
        m = batch.size - start
        slots = (pos + np.arange(m)) % self.capacity
        sources = (batch.obs[start:], batch.next_obs[start:])
        stored = (self.layout.empty(m), self.layout.empty(m))  # allocated before any pool changes
        for key in self.layout.dense_keys:
            for out, source in zip(stored, sources, strict=True):
                out[key] = source[key]
        jobs = []
        for stack in self.layout.stacks:
            old = np.concatenate([stack.of(self.columns[c][slots]).ravel() for c in (0, 3)])
            flat = (m * stack.planes, *stack.plane_shape)
            new = [stack.of(source).reshape(flat) for source in sources]
            jobs.append((self.pools[stack.key], new, old[old != _NO_PLANE]))
        for stack, ids in zip(self.layout.stacks, replace_all(jobs), strict=True):
            for out, new_ids in zip(stored, ids, strict=True):
                stack.of(out)[...] = new_ids.reshape(m, stack.planes)
        return slots, *stored

    def write(self, batch: TransitionBatch, start: int, pos: int, staged: tuple[np.ndarray, ...]) -> None:
        slots, obs, next_obs = staged
        for store, col in zip(
            self.columns,
            (obs, batch.action[start:], batch.reward[start:], next_obs, batch.discount[start:]),
            strict=True,
        ):
            store[slots] = col

    def gather(self, rows: np.ndarray) -> TransitionBatch:
        obs, action, reward, next_obs, discount = self.columns
        return TransitionBatch(
            self._observations(obs[rows]),
            action[rows],
            reward[rows],
            self._observations(next_obs[rows]),
            discount[rows],
        )

    def _observations(self, stored: np.ndarray) -> np.ndarray:
        """The observations rows hold, from what they store (``stored``, copies)."""
        layout = self.layout
        if layout.obs_dtype.names is None:  # a plain image stack: its planes are the observation
            return self.pools[None].planes[stored]
        out = np.zeros(stored.shape, layout.obs_dtype)  # zeros: the padding between keys too
        for stack in layout.stacks:
            out[stack.key] = self.pools[stack.key].planes[stored[stack.key]]
        for key in layout.dense_keys:
            out[key] = stored[key]
        return out


class _SharedFrames(Ring):
    """What both shared-frames kinds add to their ring: ``FrameRows`` for rows."""

    _rows: FrameRows

    def _make_rows(self) -> FrameRows:
        return FrameRows(self._capacity, self._row_shapes, self._dtypes)

    @property
    def pools(self) -> dict[str | None, FramePool]:
        """The frame pool of each image stack: by key for a Dict observation, ``None`` for a
        plain image observation."""
        return dict(self._rows.pools)

    @property
    def pool(self) -> FramePool:
        """The one frame pool (a plain image observation, or a Dict observation with one image key)."""
        if len(self._rows.pools) != 1:
            raise ValueError(
                f"this buffer keeps one frame pool per image key: {list(self._rows.pools)}; see pools"
            )
        return next(iter(self._rows.pools.values()))

    @property
    def live_planes(self) -> int:
        """Distinct planes stored now, in all pools."""
        return sum(pool.live for pool in self._rows.pools.values())

    def _stats_locked(self) -> dict[str, float | int]:
        return {**super()._stats_locked(), "live_planes": self.live_planes}


class SharedFramesReplay(_SharedFrames, UniformReplay):
    """``UniformReplay`` storing each image plane once (``replay.share_frames``)."""


class SharedFramesPrioritizedReplay(_SharedFrames, PrioritizedReplay):
    """``PrioritizedReplay`` storing each image plane once (``replay.share_frames``)."""
