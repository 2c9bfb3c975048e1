"""What passes between a learner and its intake process (zmqrl/learner/intake_process.py): groups of
samples the intake has checked, its reports, and the learner's few orders.

Why a format of its own: the intake process decodes and checks every message from the network
with the one samples decoder (:func:`zmqrl.transport.decoding.load_samples`), so what it forwards is
already valid; the learner must not pay for decoding it again. A forwarded group is a header and
the group's merged columns as raw frames, read back as views with no check but their sizes.
Trusted, because both ends are one learner's own processes over an ipc socket in a directory only
its user may enter; still never pickle, and nothing in it names code.

Channels (both ipc, both bound by the learner):

* **groups** (intake PUSH -> learner PULL): ``[header, column frames...]``, header a msgpack map
  ``{"infos": [[actor_id, seq, weights_version, start, stop, [[return, length], ...]], ...],
  "rollouts": bool, "sequences": bool, "columns": [[dtype, shape], ...], "priorities": bool}``, one
  frame per column (the priorities' last, when there are). Flow control by credits: the intake sends
  a group only for a credit, and the learner gives one back for every group it takes (``{"credit": 1}`` on
  control), so no group waits in a socket buffer. Merging, the intake starts with one: while the
  learner trains (it takes every few milliseconds) or its replay ratio holds it back, what arrives
  is merged into the next group, up to a limit, and then nothing more is read from the network:
  actors feel it as backpressure, as they did from an ingest thread that waited.
* **settings** (a file in the learner's private directory, named on the intake's command line):
  ``{"transport": {...}}``, the run's transport settings: bind the samples socket. A file, not the
  control channel's first message: a PAIR socket's send waits until its peer connects.
* **control** (a PAIR each way): msgpack maps, every send from the learner bounded in time.
  Learner to intake: ``{"spec": {...}, "num_actors": n, "group_messages": n, "credits": n}``
  (start checking and forwarding), ``{"credit": 1}``, ``{"stop": reason}``. Intake to learner:
  ``{"bound": endpoint}`` or ``{"error": text, "kind": "bind" or "security"}``, and
  ``{"report": {...}}`` (counts of bad messages and each sender's sequence accounting) whenever
  they changed, at most every ``REPORT_SECONDS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.messages import MessageInfo, SampleGroup
from zmqrl.types import (
    Batch,
    EpisodeStat,
    ObsEntry,
    RolloutBatch,
    SequenceBatch,
    TransitionBatch,
    field_layout,
    rollout_columns,
)

# Seconds between the intake's reports (counts change with every bad message; the learner reads
# the newest in its housekeeping, and a test waits on them).
REPORT_SECONDS = 0.1
# The groups channel's high-water mark; what really bounds the groups in flight is the credits.
GROUPS_HWM = 4
# Groups the intake may send ahead of what the learner took when it merges none (one message a
# group: a replay ratio, or large rows): enough that the learner finds one whenever it looks.
SINGLE_CREDITS = 4


def dump_group(group: SampleGroup) -> list[Any]:
    """The frames of a checked group: header, then each column (and the priorities) as raw buffers
    (send them with ``copy=False``)."""
    batch = group.batch
    own = rollout_columns(batch) if isinstance(batch, RolloutBatch) else list(batch)
    columns = [np.ascontiguousarray(col) for col in own]
    if group.priorities is not None:
        columns.append(np.ascontiguousarray(group.priorities))
    header = {
        "infos": [
            [i.actor_id, i.seq, i.weights_version, i.start, i.stop, [list(e) for e in i.episodes]]
            for i in group.infos
        ],
        "rollouts": isinstance(group.batch, RolloutBatch),
        "sequences": isinstance(group.batch, SequenceBatch),
        "columns": [[_dtype_out(col.dtype), list(col.shape)] for col in columns],
        "priorities": group.priorities is not None,
    }
    return [msgpack.packb(header), *columns]


def load_group(frames: Sequence[Any]) -> SampleGroup:
    """The group ``dump_group`` made, its columns read-only views of ``frames``."""
    header = msgpack.unpackb(frames[0])
    arrays = [
        np.frombuffer(frame, _dtype_in(dtype)).reshape(shape)
        for frame, (dtype, shape) in zip(frames[1:], header["columns"], strict=True)
    ]
    priorities = arrays.pop() if header["priorities"] else None
    batch: Batch
    if header.get("sequences"):
        batch = SequenceBatch(*arrays)
    else:
        batch = RolloutBatch(*arrays) if header["rollouts"] else TransitionBatch(*arrays)
    infos = tuple(
        MessageInfo(a, s, v, start, stop, [EpisodeStat(float(r), int(n)) for r, n in eps])
        for a, s, v, start, stop, eps in header["infos"]
    )
    return SampleGroup(infos, batch, priorities)


def _dtype_out(dtype: np.dtype[Any]) -> Any:
    """A column's dtype for the header: its string, or a Dict observation's records as their fields
    (``[[key, dtype, shape], ...]``, remade aligned: ``dtype.str`` of records says only "void")."""
    if dtype.names is None:
        return dtype.str
    return [[key, kind, list(shape)] for key, kind, shape, _ in field_layout(dtype)]


def _dtype_in(wire: Any) -> np.dtype[Any]:
    if isinstance(wire, str):
        return np.dtype(wire)
    return np.dtype([(key, kind, tuple(shape)) for key, kind, shape in wire], align=True)


def dump(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message)


def load(frame: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = msgpack.unpackb(frame)
    return loaded


def spec_to_dict(spec: SampleSpec) -> dict[str, Any]:
    """The spec's fields as msgpack can carry them (its derived limits are remade on the far side;
    a Dict observation's entries as lists of their fields)."""
    out = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
    out["obs_entries"] = [dataclasses.astuple(e) for e in spec.obs_entries]
    return out


def spec_from_dict(fields: dict[str, Any]) -> SampleSpec:
    def tupled(value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    given = {name: tupled(value) for name, value in fields.items()}
    given["obs_entries"] = tuple(ObsEntry(*(tupled(v) for v in e)) for e in fields.get("obs_entries", ()))
    return SampleSpec(**given)
