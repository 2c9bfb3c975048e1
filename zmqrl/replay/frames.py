"""Shared-frame replay: the replay buffers that keep stacked image frames in frame pools
(frame_pool.py), ``SharedFramesReplay`` and ``SharedFramesPrioritizedReplay``, and their rows.
"""

from __future__ import annotations

import numpy as np

from zmqrl.replay.frame_pool import FramePool, slots_for
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.storage import DenseRows, Dtypes, Ring, Shapes, UniformReplay
from zmqrl.types import TransitionBatch

# Plane id of a row that holds no observation yet.
_NO_PLANE = -1


class FrameRows(DenseRows):
    """Rows whose ``obs`` and ``next_obs`` are ``planes`` ids each into a ``FramePool``.

    Observations of shape ``(planes, *plane_shape)`` (e.g. 4 stacked 84x84 frames): consecutive
    transitions of one game share all but about one of their 8 planes, so a row costs ~1 plane
    instead of 8 (module docstring). ``gather`` puts the planes back into dense arrays, so nothing
    downstream changes. The pool is reserved for the worst case and becomes resident as distinct
    planes arrive.
    """

    def __init__(self, capacity: int, row_shapes: Shapes, dtypes: Dtypes) -> None:
        obs_shape = row_shapes[0]
        if len(obs_shape) < 2:
            raise ValueError(
                f"replay.share_frames needs image observations (planes, height, width), got {obs_shape}"
            )
        self.capacity, self.planes = capacity, obs_shape[0]
        # Sized for the worst case (proof above, `slots_for`): a full buffer keeps its planes
        # while a batch of up to `capacity` new rows is interned.
        self.pool = FramePool(slots_for(capacity, self.planes), obs_shape[1:], dtypes[0])
        super().__init__(capacity, (*row_shapes[1:3], ()), (dtypes[1], dtypes[2], dtypes[4]))
        action, reward, discount = self.columns
        obs_ids, next_ids = (np.full((capacity, self.planes), _NO_PLANE, dtype=np.int64) for _ in "on")
        self.columns = (obs_ids, action, reward, next_ids, discount)

    @property
    def nbytes(self) -> int:
        """Bytes in use now: the id and scalar columns plus the distinct planes stored."""
        return super().nbytes + self.pool.live * self.pool.planes[0].nbytes

    def stage(self, batch: TransitionBatch, start: int, pos: int) -> tuple[np.ndarray, ...]:
        """Intern the new rows' planes and release those of the rows they overwrite, all or
        nothing (``FramePool.replace``): the slots and the new rows' plane ids, for ``write``."""
        m = batch.size - start
        slots = (pos + np.arange(m)) % self.capacity
        obs_ids, next_ids = self.columns[0], self.columns[3]
        old = np.concatenate([obs_ids[slots].ravel(), next_ids[slots].ravel()])
        flat = (m * self.planes, *self.pool.planes.shape[1:])
        new = self.pool.replace(
            [batch.obs[start:].reshape(flat), batch.next_obs[start:].reshape(flat)], old[old != _NO_PLANE]
        )
        return slots, new[0].reshape(m, self.planes), new[1].reshape(m, self.planes)

    def write(self, batch: TransitionBatch, start: int, pos: int, staged: tuple[np.ndarray, ...]) -> None:
        slots, obs, next_obs = staged
        for store, col in zip(
            self.columns,
            (obs, batch.action[start:], batch.reward[start:], next_obs, batch.discount[start:]),
            strict=True,
        ):
            store[slots] = col

    def gather(self, rows: np.ndarray) -> TransitionBatch:
        obs_ids, action, reward, next_ids, discount = self.columns
        planes = self.pool.planes
        return TransitionBatch(
            planes[obs_ids[rows]], action[rows], reward[rows], planes[next_ids[rows]], discount[rows]
        )


class _SharedFrames(Ring):
    """What both shared-frames kinds add to their ring: ``FrameRows`` for rows."""

    _rows: FrameRows

    def _make_rows(self) -> FrameRows:
        return FrameRows(self._capacity, self._row_shapes, self._dtypes)

    @property
    def pool(self) -> FramePool:
        return self._rows.pool

    @property
    def live_planes(self) -> int:
        """Distinct planes stored now (each ``plane_bytes``)."""
        return self._rows.pool.live

    def _stats_locked(self) -> dict[str, float | int]:
        return {**super()._stats_locked(), "live_planes": self._rows.pool.live}


class SharedFramesReplay(_SharedFrames, UniformReplay):
    """``UniformReplay`` storing each image plane once (``replay.share_frames``)."""


class SharedFramesPrioritizedReplay(_SharedFrames, PrioritizedReplay):
    """``PrioritizedReplay`` storing each image plane once (``replay.share_frames``)."""
