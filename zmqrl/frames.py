"""A pool of image planes stored once each, for replay of stacked Atari frames.

A preprocessed Atari observation is a stack of the last 4 frames, and an n-step transition holds
two of them (``obs`` and ``next_obs``): 8 planes of 84x84 bytes, of which consecutive transitions
of the same game share all but about one. Storing planes once, and rows as plane ids, cuts replay
memory about 8x (5.3 GiB -> ~0.7 GiB per 100k transitions).

Planes are found again by content: a 16-byte BLAKE2b digest of each plane's bytes (about 3 µs per
plane), confirmed by comparing the bytes on a hit, so the wire format and the actors need not know
about the sharing. Each plane is reference-counted by the replay rows that use it and its slot is
reused when the count drops to zero.

The pool is sized for the worst case (no two planes alike), so it can never run out, but that
size is only *reserved*: on Linux the planes live in an anonymous mapping made with MAP_NORESERVE,
whose pages become resident when first written, and freed slots are reused before untouched ones,
so resident memory follows the number of distinct live planes.

Not thread-safe on its own: the owning replay buffer serialises access.
"""

from __future__ import annotations

import hashlib
import mmap
import sys

import numpy as np
import numpy.typing as npt

# Digest size in bytes: 128 bits makes an accidental collision practically impossible, and a
# collision would still be caught by the byte comparison on every hit.
DIGEST_BYTES = 16

IntArray = npt.NDArray[np.int64]

# mmap flag (Linux, every architecture zmqrl runs on): reserve address space without committing.
_LINUX_MAP_NORESERVE = 0x4000


class FramePoolFull(RuntimeError):
    """More distinct planes are live than the pool was sized for."""


class FramePool:
    """Fixed number of plane slots, each holding one distinct plane and its reference count."""

    def __init__(self, slots: int, plane_shape: tuple[int, ...], dtype: npt.DTypeLike = np.uint8) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.planes = _reserve((slots, *plane_shape), np.dtype(dtype))
        self._refs = np.zeros(slots, dtype=np.int64)
        self._digest_of: list[bytes | None] = [None] * slots
        self._slot_of: dict[bytes, int] = {}
        self._free: list[int] = []  # released slots, reused first (they are already resident)
        self._unused = 0  # slots >= this were never written: their pages are not yet resident

    @property
    def slots(self) -> int:
        return int(self.planes.shape[0])

    @property
    def live(self) -> int:
        """Distinct planes currently referenced."""
        return len(self._slot_of)

    @property
    def nbytes(self) -> int:
        return int(self.planes.nbytes + self._refs.nbytes)

    def intern(self, planes: np.ndarray) -> IntArray:
        """Slot ids for ``planes`` ``(k, *plane_shape)``, storing the ones not yet in the pool; each
        returned id gains one reference. Raises FramePoolFull, with nothing changed, when the new
        distinct planes do not fit."""
        planes = np.ascontiguousarray(planes)
        out = np.empty(planes.shape[0], dtype=np.int64)
        added: list[int] = []
        try:
            for i in range(planes.shape[0]):
                plane = planes[i]
                digest = hashlib.blake2b(plane.data, digest_size=DIGEST_BYTES).digest()
                slot = self._slot_of.get(digest)
                if slot is None or not np.array_equal(self.planes[slot], plane):
                    slot = self._take_slot()
                    added.append(slot)
                    self.planes[slot] = plane
                    if digest not in self._slot_of:  # else a (never yet seen) collision: unindexed
                        self._slot_of[digest] = slot
                        self._digest_of[slot] = digest
                out[i] = slot
        except FramePoolFull:
            for slot in added:  # undo: the rows that would have used them are not written
                self._forget(slot)
            raise
        np.add.at(self._refs, out, 1)
        return out

    def release(self, ids: np.ndarray) -> None:
        """Drop one reference per id; slots that reach zero become free."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return
        np.subtract.at(self._refs, ids, 1)
        for slot in np.unique(ids[self._refs[ids] == 0]).tolist():
            self._forget(slot)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._unused < self.slots:
            self._unused += 1
            return self._unused - 1
        raise FramePoolFull(f"all {self.slots} plane slots hold live planes")

    def _forget(self, slot: int) -> None:
        digest = self._digest_of[slot]
        if digest is not None and self._slot_of.get(digest) == slot:
            del self._slot_of[digest]
        self._digest_of[slot] = None
        self._refs[slot] = 0
        self._free.append(slot)


def _reserve(shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> np.ndarray:
    """A zeroed array whose pages are committed only when written. ``np.zeros`` is lazy too, but
    the kernel's default overcommit heuristic refuses one allocation larger than RAM + swap, which a
    worst-case-sized pool for a 1M-row buffer is; MAP_NORESERVE asks for address space only."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    flags = getattr(mmap, "MAP_NORESERVE", _LINUX_MAP_NORESERVE)  # Python's mmap does not name it
    if sys.platform != "linux" or nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)
