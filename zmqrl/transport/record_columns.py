"""Dict observations on the wire: one array per key (``obs.<key>``), folded into records on receipt.

A run whose observations are records (``zmqrl.types``) sends each observation column as one
array per key, in the record's key order, named ``<column>.<key>``: a samples message's arrays are
``obs.image, obs.state, action, reward, next_obs.image, next_obs.state, discount``. Each array is
in its key's own dtype, so a peer in another language reads and writes plain arrays, and the
decoder checks each key against its own bounds. On receipt the arrays of a column are copied into
one array of records (:func:`fold`) before the column checks run, so everything after the
decoder (and the column checks themselves, which see one ``obs`` column) is the same as for a
plain observation. Only the columns below may be split, each with its leading dimensions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from zmqrl.transport.fields import LE_DTYPES, fail, short
from zmqrl.transport.layouts import ArrayDesc
from zmqrl.types import KEY_PATTERN, MAX_KEYS

# Per message kind: the observation columns that may travel one array per key, and how many
# leading (batch) dimensions each has before the key's own shape.
KEYED_COLUMNS: dict[str, dict[str, int]] = {
    "samples": {"obs": 1, "next_obs": 1},
    "rollouts": {"obs": 2, "final_obs": 1},
    "sequences": {"obs": 2},
}
SEPARATOR = "."


class Fold(NamedTuple):
    """How a message's raw arrays become its columns: per column, the raw indices it takes (one,
    or one per key) and, for a keyed column, its records' dtype and leading shape."""

    descs: list[ArrayDesc]  # the columns as the column checks see them (a keyed one: dtype "record:...")
    parts: list[tuple[int, ...]]  # raw array indices of each column
    dtypes: list[np.dtype[Any] | None]  # each keyed column's records dtype; None for a plain one


def is_keyed(descs: list[ArrayDesc]) -> bool:
    """Whether any array of a message is one key of a column (its name has a separator)."""
    return any(SEPARATOR in d.name for d in descs)


def plan(kind: str, descs: list[ArrayDesc]) -> Fold:
    """Group the consecutive ``<column>.<key>`` arrays of a message of ``kind`` into columns;
    WireError for a split column the kind has no place for, a bad or repeated key, keys whose
    leading dimensions disagree, or a column split twice."""
    allowed = KEYED_COLUMNS.get(kind, {})
    out: list[ArrayDesc] = []
    parts: list[tuple[int, ...]] = []
    dtypes: list[np.dtype[Any] | None] = []
    seen: set[str] = set()
    i = 0
    while i < len(descs):
        name = descs[i].name
        if SEPARATOR not in name:
            out.append(descs[i])
            parts.append((i,))
            dtypes.append(None)
            i += 1
            continue
        column = name.split(SEPARATOR, 1)[0]
        lead_ndim = allowed.get(column)
        if lead_ndim is None:
            fail(f"{kind} array {short(name)}: only {sorted(allowed)} may travel one array per key")
        if column in seen:
            fail(f"{kind} column {column!r} is split in two places")
        seen.add(column)
        fields: list[tuple[str, np.dtype[Any], tuple[int, ...]]] = []
        indices: list[int] = []
        lead: tuple[int, ...] | None = None
        while i < len(descs) and descs[i].name.startswith(column + SEPARATOR):
            d = descs[i]
            key = d.name[len(column) + 1 :]
            if not KEY_PATTERN.fullmatch(key) or any(key == f[0] for f in fields):
                fail(f"{kind} array {short(d.name)}: a bad or repeated key")
            if len(d.shape) <= lead_ndim:
                fail(f"{kind} array {d.name!r} needs more than {lead_ndim} dimensions, got {list(d.shape)}")
            if lead is None:
                lead = d.shape[:lead_ndim]
            elif d.shape[:lead_ndim] != lead:
                got = list(d.shape[:lead_ndim])
                fail(f"{kind} array {d.name!r} has leading dimensions {got}, expected {list(lead)}")
            fields.append((key, LE_DTYPES[d.dtype], d.shape[lead_ndim:]))
            indices.append(i)
            i += 1
        if len(fields) > MAX_KEYS:
            fail(f"{kind} column {column!r} has {len(fields)} keys > {MAX_KEYS}")
        assert lead is not None
        dtype = np.dtype(fields, align=True)
        signature = ",".join(f"{k}:{v.name}{list(s)}" for k, v, s in fields)
        out.append(ArrayDesc(column, f"record:{signature}", lead, sum(descs[j].nbytes for j in indices)))
        parts.append(tuple(indices))
        dtypes.append(dtype)
    return Fold(out, parts, dtypes)


def fold(fold_plan: Fold, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The message's columns from its raw arrays: a keyed column's keys copied into records."""
    out = []
    for desc, indices, dtype in zip(fold_plan.descs, fold_plan.parts, fold_plan.dtypes, strict=True):
        if dtype is None:
            out.append(arrays[indices[0]])
            continue
        records = np.empty(desc.shape, dtype)
        for name, i in zip(dtype.names or (), indices, strict=True):
            records[name] = arrays[i]
        out.append(records)
    return out


def split(name: str, value: Any) -> list[tuple[str, Any]]:
    """What the encoder sends for column ``name``: records as one array per key, else as it is."""
    if isinstance(value, np.ndarray) and value.dtype.names is not None:
        return [(f"{name}{SEPARATOR}{key}", value[key]) for key in value.dtype.names]
    return [(name, value)]
