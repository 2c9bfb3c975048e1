"""A pool of image planes stored once each (``FramePool``): what shared-frame replay (frames.py)
keeps stacked Atari frames in.

A preprocessed Atari observation is a stack of the last 4 frames, and an n-step transition holds
two of them (``obs`` and ``next_obs``): 8 planes of 84x84 bytes, of which consecutive transitions
of the same game share all but about one. Storing planes once, and rows as plane ids, cuts replay
memory nearly 8-fold.

Planes are found again by content: a 16-byte BLAKE2b digest of each plane's bytes, confirmed by
comparing the bytes on a hit, so the wire format and the actors need not know about the sharing.
Each plane is reference-counted by the replay rows that use it and its slot is reused when the
count drops to zero.

How many slots (``slots_for``): an add stages its planes before writing any row (storage.py):
``FramePool.replace`` interns the new planes and only then releases the ones of the rows they
overwrite, all or nothing, so a failed add leaves the pool exactly as it was, and a plane shared
by an overwritten row and a new one is never freed and copied back. The price is the peak:

    Claim: with ``2 * planes * (capacity + max_rows)`` slots, ``intern`` never runs out while a
    buffer of ``capacity`` rows adds ``m <= max_rows`` rows.
    Proof: a slot is in use only while a row references it, or while the ``intern`` call storing
    a plane of a new row has just taken it. Every row, stored or being added, names ``2 * planes``
    plane ids, so the slots in use never exceed ``2 * planes`` times the rows involved: the
    ``s <= capacity`` rows stored before the add (all still holding their planes) plus the ``m``
    new ones. A replay add keeps at most ``capacity`` rows of a batch, so ``max_rows = capacity``
    covers every batch size, and the bound is tight: a full buffer of distinct (noise) frames
    receiving a ``capacity``-row batch of new distinct frames uses every slot.

That size is only *reserved*: on Linux the planes (and the per-slot counts and digests) live in
anonymous mappings made with MAP_NORESERVE, whose pages become resident when first written, and
freed slots are reused before untouched ones, so resident memory follows the largest number of
distinct planes ever live at once, not the reservation.

A Dict observation with several image keys keeps a pool per key (frames.py), each sized as above
for its own stacks; ``replace_all`` makes one add's replace in all of them a single transaction.

The pool is not thread-safe on its own: the replay buffer that owns it serialises access.
"""

from __future__ import annotations

import hashlib
import mmap
import sys
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# Digest size in bytes: 128 bits makes an accidental collision practically impossible, and a
# collision would still be caught by the byte comparison on every hit.
DIGEST_BYTES = 16

IntArray = npt.NDArray[np.int64]

# mmap flag (Linux, every architecture zmqrl runs on): reserve address space without committing.
_LINUX_MAP_NORESERVE = 0x4000

# A slot one ``replace`` took: (slot, came from the never-written range rather than the free list).
Taken = tuple[int, bool]


def slots_for(capacity: int, planes: int, max_rows: int | None = None) -> int:
    """Slots a pool needs so that a buffer of ``capacity`` rows of ``planes``-plane observations
    (obs and next_obs) can add ``max_rows`` rows at once (default: any batch), all or nothing;
    see the module docstring for the proof."""
    rows = capacity if max_rows is None else min(max_rows, capacity)
    return 2 * planes * (capacity + rows)


class FramePoolFull(RuntimeError):
    """More distinct planes are live than the pool was sized for (a sizing bug: see ``slots_for``)."""


class FramePool:
    """Fixed number of plane slots, each holding one distinct plane and its reference count."""

    def __init__(self, slots: int, plane_shape: tuple[int, ...], dtype: npt.DTypeLike = np.uint8) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.planes = _reserve((slots, *plane_shape), np.dtype(dtype))
        self._refs: IntArray = _reserve((slots,), np.dtype(np.int64))
        # Digest of the plane each in-use slot holds: a slot leaves the index under this key.
        self._digests = _reserve((slots, DIGEST_BYTES), np.dtype(np.uint8))
        self._slot_of: dict[bytes, int] = {}
        self._free: list[int] = []  # released slots, reused first (they are already resident)
        self._unused = 0  # slots >= this were never written: their pages are not yet resident

    @property
    def slots(self) -> int:
        return int(self.planes.shape[0])

    @property
    def live(self) -> int:
        """Slots holding a referenced plane (distinct planes, barring a digest collision)."""
        return self._unused - len(self._free)

    @property
    def high_water(self) -> int:
        """Most slots ever in use at once (a failed add's included): freed slots are reused
        first, so the slots ever written, whose pages are resident, are exactly these."""
        return self._unused

    @property
    def nbytes(self) -> int:
        """Bytes reserved (address space; resident memory follows ``high_water``)."""
        return int(self.planes.nbytes + self._refs.nbytes + self._digests.nbytes)

    def intern(self, planes: np.ndarray) -> IntArray:
        """Slot ids for ``planes`` ``(k, *plane_shape)``, storing the ones not yet in the pool; each
        returned id gains one reference. All or nothing, as ``replace``."""
        return self.replace([planes], np.zeros(0, dtype=np.int64))[0]

    def replace(self, stacks: Sequence[np.ndarray], old: np.ndarray) -> list[IntArray]:
        """``intern`` each of ``stacks``, then ``release`` the ids ``old``: what a replay add does
        for the planes of its new rows and of the rows they overwrite, in that order, so a plane
        both use keeps a reference throughout and is never freed and stored again.

        All or nothing: if anything raises (FramePoolFull when the new distinct planes do not fit,
        a release the pool refuses), the pool is left exactly as it was.
        """
        return replace_all([(self, stacks, old)])[0]

    def _intern(self, stacks: Sequence[np.ndarray]) -> tuple[list[IntArray], list[Taken]]:
        """The ids of ``stacks``' planes, each with one more reference, and the slots this took
        (for ``_unintern``); if a plane cannot be stored, the pool is left as it was."""
        out = [np.empty(stack.shape[0], dtype=np.int64) for stack in stacks]
        taken: list[Taken] = []
        try:
            for stack, ids in zip(stacks, out, strict=True):
                stack = np.ascontiguousarray(stack)
                for i in range(stack.shape[0]):
                    ids[i] = self._store(stack[i], taken)
        except BaseException:
            self._untake(taken)  # the rows that would have used them are not written
            raise
        for ids in out:
            np.add.at(self._refs, ids, 1)
        return out, taken

    def _unintern(self, out: list[IntArray], taken: list[Taken]) -> None:
        """Undo an ``_intern`` (nothing else changed the pool since): its references, its slots."""
        for ids in out:
            np.subtract.at(self._refs, ids, 1)
        self._untake(taken)

    def _store(self, plane: np.ndarray, taken: list[Taken]) -> int:
        """The slot holding ``plane``, written into a new one (recorded in ``taken``) if none does."""
        digest = hashlib.blake2b(plane.data, digest_size=DIGEST_BYTES).digest()
        slot = self._slot_of.get(digest)
        if slot is None or not np.array_equal(self.planes[slot], plane):
            slot = self._take_slot(taken)
            self.planes[slot] = plane
            self._digests[slot] = np.frombuffer(digest, dtype=np.uint8)
            # An existing key means a (never yet seen) collision: that slot stays unindexed.
            self._slot_of.setdefault(digest, slot)
        return slot

    def release(self, ids: np.ndarray) -> None:
        """Drop one reference per id; slots that reach zero become free. Checked before anything
        changes, so an id without a reference (a caller's bug) raises with the pool intact."""
        self._apply_release(*self.check_release(ids))

    def check_release(self, ids: np.ndarray) -> tuple[IntArray, IntArray]:
        """The distinct slots of ``ids`` and their reference counts once ``ids`` are released, for
        ``_apply_release``; ValueError, changing nothing, if an id would lose a reference it lacks."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        slots, counts = np.unique(ids, return_counts=True)
        after = self._refs[slots] - counts
        if after.size and int(after.min()) < 0:
            raise ValueError("released a plane id more often than it was referenced")
        return slots, after

    def _apply_release(self, slots: IntArray, after: IntArray) -> None:
        """A checked release: cannot fail."""
        self._refs[slots] = after
        for slot in slots[after == 0].tolist():
            self._forget(slot)

    def _take_slot(self, taken: list[Taken]) -> int:
        if self._free:
            slot = self._free.pop()
            taken.append((slot, False))
            return slot
        if self._unused < self.slots:
            self._unused += 1
            taken.append((self._unused - 1, True))
            return self._unused - 1
        raise FramePoolFull(f"all {self.slots} plane slots hold live planes")

    def _untake(self, taken: list[Taken]) -> None:
        """Return taken slots, newest first, to exactly where they came from."""
        for slot, was_unused in reversed(taken):
            self._unindex(slot)
            self._refs[slot] = 0
            if was_unused:
                self._unused -= 1
            else:
                self._free.append(slot)
        taken.clear()

    def _forget(self, slot: int) -> None:
        self._unindex(slot)
        self._refs[slot] = 0
        self._free.append(slot)

    def _unindex(self, slot: int) -> None:
        digest = self._digests[slot].tobytes()
        if self._slot_of.get(digest) == slot:  # else an unindexed collision slot
            del self._slot_of[digest]


def replace_all(jobs: Sequence[tuple[FramePool, Sequence[np.ndarray], np.ndarray]]) -> list[list[IntArray]]:
    """``FramePool.replace(stacks, old)`` for each ``(pool, stacks, old)`` of ``jobs`` (distinct
    pools: one per image key of a Dict observation), all of them or none.

    Every pool interns its new planes first (each undoable, ``_unintern``), then every release is
    checked against the counts that includes (``check_release``, which changes nothing); only once
    all of that passed do the releases happen, and a checked release cannot fail. So whichever step
    raises, in whichever pool, every pool is left exactly as it was.
    """
    if len({id(pool) for pool, _, _ in jobs}) != len(jobs):
        raise ValueError("replace_all takes each pool once")
    interned: list[tuple[list[IntArray], list[Taken]]] = []
    try:
        for pool, stacks, _ in jobs:
            interned.append(pool._intern(stacks))
        releases = [pool.check_release(old) for pool, _, old in jobs]
    except BaseException:
        for (pool, _, _), (out, taken) in reversed(list(zip(jobs, interned, strict=False))):
            pool._unintern(out, taken)
        raise
    for (pool, _, _), (slots, after) in zip(jobs, releases, strict=True):
        pool._apply_release(slots, after)
    return [out for out, _ in interned]


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
