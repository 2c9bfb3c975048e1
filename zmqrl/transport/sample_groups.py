"""Receiving a group of queued transition messages straight into the group's merged columns.

Why: with CartPole-sized messages (64 rows of 4 floats) the learner's per-message Python was most
of ingest: 5 ``np.frombuffer`` views and a dataclass per message, a descriptor list checked (from
a cache) per message, then every column copied again by ``np.concatenate`` to merge the group.
The messages of a run have one or two layouts (one per batch size), so this reader learns each
layout once, from a message the full decoder (:func:`zmqrl.transport.wire.load_samples`) accepted,
as a :class:`Layout`: the header's ``"arrays"`` value exactly as it came, and the byte length of
each column. A later header that carries that same value (compared exactly: equal, and every
dimension a real integer) fits the run's spec as the first one did, so its array frames are
received with ``recv_into`` directly into the group's preallocated columns at the next free row:
no bytes object, no view, no concatenation. zmqrl's encoder writes "arrays" last, so a header of
a known layout ends with the same bytes every time: such a header is compared by those bytes and
only its other six entries are unpacked (the descriptors were most of the header's decoding).

Every check stays, on every message: the header is unpacked with the same limits and its keys,
protocol, kind and integer fields checked as :func:`zmqrl.transport.header.parse_header` checks
them; each frame must come as described (count and byte length; a longer one is not written past
its slot: ``recv_into`` truncates and says the real length), within the channel's frame limit;
episode records are checked against the spec. The content scan (finite, bounded values) runs over
the merged rows by the caller, exactly as before. Whatever does not fit the fast case (an unknown
layout, episodes, priorities that differ from the group's, a message that would overflow the
group's columns, any oddity in a header) goes through the full decoder, so its verdict and reason
are the full decoder's; a frame that does not come as described is refused with the reason the
full decoder gives for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.fields import INT64_MAX, LE_DTYPES, MAX_HEADER_BYTES, UNPACK_LIMITS, reject_ext
from zmqrl.transport.header import ArrayDesc, parse_episodes
from zmqrl.transport.messages import (
    KIND_SAMPLES,
    PRIORITY_FIELD,
    PROTO_VERSION,
    MessageInfo,
    SamplesMsg,
    WireError,
)
from zmqrl.transport.receiving import FrameLimit, MessageTooLarge, recv_rest
from zmqrl.transport.validation import validate_episodes
from zmqrl.types import BATCH_FIELDS, EpisodeStat, TransitionBatch

# Most layouts one reader learns; a peer varying its batch size past it is decoded in full.
MAX_LAYOUTS = 8
# A samples header's exact keys (samples have no optional ones).
_SAMPLES_KEYS = frozenset(("proto", "kind", "arrays", "actor_id", "seq", "weights_version", "episodes"))
# The same less "arrays": the keys before it in a header whose "arrays" entry is last (see match).
_LEADING_KEYS = _SAMPLES_KEYS - {"arrays"}
# msgpack's first byte of a map of 7 entries (a samples header), and of one of 6 (the same less one).
_FIXMAP_7, _FIXMAP_6 = 0x87, b"\x86"
# RCVMORE as pyzmq's own enum member, not an int: ``Socket.get`` turns its argument into the enum
# every call, and a member converts faster (0.57 against 0.74 us; six calls per message).
_RCVMORE, _NOBLOCK = zmq.SocketOption.RCVMORE, int(zmq.NOBLOCK)
# The full decoder's msgpack options, bound once (a keyword expansion per header costs).
_unpack: Callable[[bytes], Any] = functools.partial(msgpack.unpackb, ext_hook=reject_ext, **UNPACK_LIMITS)
# A transitions message's array names in header order.
PRIORITY_COLUMNS = (*BATCH_FIELDS, PRIORITY_FIELD)


@dataclass(frozen=True)
class Layout:
    """One accepted layout of a transitions message: its ``"arrays"`` header value and sizes."""

    arrays: list[dict[str, Any]]  # as the header carries it, for an exact comparison
    descs: tuple[ArrayDesc, ...]
    rows: int
    nbytes: int  # all array frames together
    sizes: tuple[int, ...]  # each array frame's
    # The header's last bytes when its last entry is "arrays" with this value, as an actor's
    # encoder writes it (zmqrl.transport.wire.dump): the key, then the value packed.
    tail: bytes

    @classmethod
    def of(cls, descs: tuple[ArrayDesc, ...]) -> Layout:
        arrays = [{"name": d.name, "dtype": d.dtype, "shape": list(d.shape)} for d in descs]
        sizes = tuple(d.nbytes for d in descs)
        tail = msgpack.packb("arrays", use_bin_type=True) + msgpack.packb(arrays, use_bin_type=True)
        return cls(arrays, tuple(descs), descs[0].shape[0], sum(sizes), sizes, tail)

    @property
    def priorities(self) -> bool:
        return len(self.descs) > 5


class Columns:
    """A group's merged columns, preallocated for ``capacity`` rows, filled message by message."""

    def __init__(self, template: tuple[ArrayDesc, ...], capacity: int) -> None:
        self.arrays = [np.empty((capacity, *d.shape[1:]), LE_DTYPES[d.dtype]) for d in template]
        self.bytes = [memoryview(a.reshape(-1).view(np.uint8)) for a in self.arrays]  # type: ignore[arg-type]
        self.row_bytes = [a.itemsize * a[0].size for a in self.arrays]
        self.capacity = capacity
        self.rows = 0
        self.priorities = len(template) > 5

    def fits(self, rows: int, priorities: bool) -> bool:
        return priorities == self.priorities and self.rows + rows <= self.capacity

    def copy_in(self, msg: SamplesMsg) -> tuple[int, int]:
        """Copy a message the full decoder gave (its rows follow the filled ones); its row span."""
        start, n = self.rows, msg.batch.size
        cols = [*msg.batch, *([msg.priorities] if msg.priorities is not None else [])]
        for dest, col in zip(self.arrays, cols, strict=True):
            dest[start : start + n] = col
        self.rows += n
        return start, n

    def batch(self, start: int, stop: int) -> tuple[TransitionBatch, np.ndarray | None]:
        cols = [a[start:stop] for a in self.arrays]
        return TransitionBatch(*cols[:5]), cols[5] if self.priorities else None


class GroupReader:
    """Reads queued transition messages of known layouts into :class:`Columns` (see module doc)."""

    def __init__(self, sock: zmq.Socket, spec: SampleSpec, limit: FrameLimit) -> None:
        self._sock = sock
        self.spec = spec
        self.limit = limit
        self.layouts: list[Layout] = []
        self._get, self._recv_into = sock.get, sock.recv_into  # bound once: called per frame

    @staticmethod
    def usable(sock: zmq.Socket, spec: SampleSpec, zero_copy: bool) -> bool:
        """Transitions of small rows (large ones are received zero-copy, one per group), and a
        pyzmq with ``recv_into`` (26.4 and later)."""
        return spec.rollout_length is None and not zero_copy and hasattr(sock, "recv_into")

    def match(self, head: bytes) -> tuple[Layout, dict[str, Any]] | None:
        """The known layout of a header frame whose every field checks out as the full decoder
        checks it (episode records are checked after the frames, as there), or None: then the
        full decoder reads the message."""
        if len(head) > MAX_HEADER_BYTES:
            return None
        layout: Layout | None = None
        if head and head[0] == _FIXMAP_7:
            for known in self.layouts:
                if head.endswith(known.tail):
                    layout = known
                    break
        try:
            if layout is not None:
                # A map of 7 entries whose last bytes are "arrays" and a known value: msgpack is
                # self-delimiting, so the bytes between are the other 6 entries. Read as a map of 6,
                # they give exactly what the whole header gives less "arrays" (whose value is the
                # layout's, dimensions ints), without unpacking and comparing the array
                # descriptors, most of the header. Anything else is read whole, as below.
                header = _unpack(_FIXMAP_6 + head[1 : len(head) - len(layout.tail)])
                if type(header) is not dict or header.keys() != _LEADING_KEYS:
                    return None
            else:
                header = _unpack(head)
                if type(header) is not dict or header.keys() != _SAMPLES_KEYS:
                    return None
        except Exception:  # the full decoder says what is wrong
            return None
        proto, actor, seq, version = (
            header["proto"],
            header["actor_id"],
            header["seq"],
            header["weights_version"],
        )
        if not (
            type(proto) is int
            and proto == PROTO_VERSION
            and header["kind"] == KIND_SAMPLES
            and type(actor) is int
            and type(seq) is int
            and type(version) is int
            and 0 <= actor <= INT64_MAX
            and 0 <= seq <= INT64_MAX
            and 0 <= version <= INT64_MAX
            and type(header["episodes"]) is list
        ):
            return None
        if layout is None:
            arrays = header["arrays"]
            for known in self.layouts:
                if arrays == known.arrays:
                    layout = known
                    break
            else:
                return None
            for desc in arrays:  # equal is not enough: 64.0 and True equal 64 and 1
                for dim in desc["shape"]:
                    if type(dim) is not int:
                        return None
        if len(head) + layout.nbytes > self.limit.max_bytes:
            return None
        return layout, header

    def learn(self, msg: SamplesMsg) -> None:
        """Remember the layout of a transitions message the full decoder accepted in structure
        (its arrays are as the header described them)."""
        if len(self.layouts) >= MAX_LAYOUTS or not isinstance(msg.batch, TransitionBatch):
            return
        layout = Layout.of(descs_of(msg))
        if all(known.arrays != layout.arrays for known in self.layouts):
            self.layouts.append(layout)

    def receive(self, layout: Layout, columns: Columns, head_bytes: int) -> WireError | None:
        """The message's array frames into ``columns`` at its next free row; None when they came
        as described (the rows then count as filled), else the reason (every frame was read)."""
        get, recv_into = self._get, self._recv_into
        start = columns.rows
        for i, (column, row_bytes, nbytes) in enumerate(
            zip(columns.bytes, columns.row_bytes, layout.sizes, strict=True)
        ):
            if not get(_RCVMORE):
                return self._refused(head_bytes, list(layout.sizes[:i]), False, layout)
            offset = start * row_bytes
            size = recv_into(column[offset : offset + nbytes], flags=_NOBLOCK)
            if size != nbytes:
                return self._refused(head_bytes, [*layout.sizes[:i], size], bool(get(_RCVMORE)), layout)
        if get(_RCVMORE):
            return self._refused(head_bytes, list(layout.sizes), True, layout)
        columns.rows += layout.rows
        return None

    def _refused(self, head_bytes: int, sizes: list[int], more: bool, layout: Layout) -> WireError:
        """Read the rest of a message that did not come as its header said, and the full
        decoder's reason for it: the frame limit first, then the frame count, then a length."""
        while more:
            frame = self._sock.recv(zmq.NOBLOCK, copy=False)
            sizes.append(len(frame))
            more = frame.more
            del frame
        frames, total = 1 + len(sizes), head_bytes + sum(sizes)
        if frames > self.limit.max_frames or total > self.limit.max_bytes:
            return MessageTooLarge(self.limit.describe(frames, total))
        if len(sizes) != len(layout.descs):
            described = len(layout.descs)
            return WireError(
                f"{KIND_SAMPLES} header describes {described} arrays but {len(sizes)} array frames came"
            )
        for desc, size in zip(layout.descs, sizes, strict=True):
            if size != desc.nbytes:
                return WireError(f"array {desc.name!r}: frame is {size} bytes, descriptor says {desc.nbytes}")
        return WireError("malformed message")  # unreachable: some check above differs

    def read(
        self, limit: int, held: SamplesMsg | None, bad: BadMessages
    ) -> tuple[tuple[tuple[MessageInfo, ...], TransitionBatch, np.ndarray | None] | None, SamplesMsg | None]:
        """Up to ``limit`` queued messages (``held`` first: one the previous group could not take):
        the valid ones in layout, their rows merged in preallocated columns, each message as its
        :class:`MessageInfo` (its rows' span in them); and the message to hold for the next group
        (priorities that differ from the group's, or rows past its columns). Drops are recorded in
        ``bad``. The contents are not scanned yet (the caller scans the merged rows)."""
        columns: Columns | None = None
        spans: list[tuple[int, int, int, int, list[EpisodeStat]]] = []  # actor, seq, version, row, episodes
        sock, spec = self._sock, self.spec
        while len(spans) < limit:
            if held is None:
                try:
                    head = sock.recv(_NOBLOCK)
                except zmq.Again:
                    break
                known = self.match(head)
                if known is not None:
                    layout, header = known
                    if columns is None or not (spans or columns.fits(layout.rows, layout.priorities)):
                        columns = Columns(layout.descs, limit * layout.rows)  # the group's first
                    if columns.fits(layout.rows, layout.priorities):
                        start = columns.rows
                        error = self.receive(layout, columns, len(head))
                        episodes: list[EpisodeStat] = []
                        if error is None and header["episodes"]:
                            try:  # after the frames, as the full decoder checks them
                                episodes = parse_episodes(header["episodes"])
                                validate_episodes(episodes, spec)
                            except WireError as exc:
                                error, columns.rows = exc, start
                        if error is not None:
                            bad.record(error)
                            continue
                        spans.append(
                            (header["actor_id"], header["seq"], header["weights_version"], start, episodes)
                        )
                        continue
                decoded = self.decode_rest(head, copy=True)
                if isinstance(decoded, WireError):
                    bad.record(decoded)
                    continue
                held = decoded
            rows, with_priorities = held.batch.size, held.priorities is not None
            if columns is None or not (spans or columns.fits(rows, with_priorities)):
                columns = Columns(descs_of(held), limit * rows)
            if not columns.fits(rows, with_priorities):
                break  # held for the next group (never without a group to return)
            start, _ = columns.copy_in(held)
            spans.append((held.actor_id, held.seq, held.weights_version, start, held.episodes))
            held = None
        if columns is None or not spans:
            return None, held
        stops = [span[3] for span in spans[1:]] + [columns.rows]
        infos = tuple(
            MessageInfo(actor_id, seq, version, start, stop, episodes)
            for (actor_id, seq, version, start, episodes), stop in zip(spans, stops, strict=True)
        )
        merged, priorities = columns.batch(0, columns.rows)
        return (infos, merged, priorities), held

    def decode_rest(self, head: bytes, copy: bool) -> SamplesMsg | WireError:
        """The rest of a message whose header ``match`` did not take, through the full decoder
        (learning its layout when it is a valid transitions message)."""
        try:
            frames = recv_rest(self._sock, self.limit, [head], copy=copy)
            msg = wire.load_samples(frames, self.spec, contents=False)
        except WireError as exc:
            return exc
        self.learn(msg)
        return msg


def descs_of(msg: SamplesMsg) -> tuple[ArrayDesc, ...]:
    """A decoded transitions message's columns as the descriptors its header had."""
    cols = (*msg.batch, *([msg.priorities] if msg.priorities is not None else []))
    return tuple(
        ArrayDesc(n, a.dtype.name, a.shape, a.nbytes) for n, a in zip(PRIORITY_COLUMNS, cols, strict=False)
    )
