"""A structure-aware fuzzer of the samples port: valid CartPole ``samples`` messages, built as the
protocol page describes them, and mutated copies, interleaved so that a learner's cached-layout fast
path (``zmqrl.transport.sample_groups``) is hit between the mutations.

Mutations, each picked at random: bit flips anywhere in a frame; frame surgery (a frame dropped,
duplicated, swapped, truncated, extended, or an extra one); header fields (``seq`` and
``actor_id`` at the ends of int64, negative, past int64, wrong types, and the weights version);
array descriptors (dtype strings, shapes with a dimension changed, negative or huge, a descriptor
missing or repeated); episode records; and values (NaN, infinities, actions out of range,
discounts above 1, observations far out of bounds). A mutation may happen to leave a valid
message; the learner takes it then, as it should.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

INT64_MAX = 2**63 - 1
# Values a header integer field is set to by the field mutation.
EXTREME_INTS: tuple[Any, ...] = (
    INT64_MAX, INT64_MAX - 1, 2**63, 2**64 - 1, -1, -(2**63), 0, 1, 1.5, "7", None, True
)
COLUMNS = ("obs", "action", "reward", "next_obs", "discount")


def valid_frames(rng: np.random.Generator, actor_id: int, seq: int, rows: int = 16) -> list[bytes]:
    """A valid CartPole samples message (version 1), built from the protocol page by hand: a msgpack
    header whose ``arrays`` descriptors come last, then one raw little-endian frame per column."""
    obs = rng.uniform(-0.2, 0.2, (rows, 4)).astype("<f4")
    columns = {
        "obs": obs,
        "action": rng.integers(0, 2, rows).astype("<i8"),
        "reward": np.ones(rows, "<f4"),
        "next_obs": obs + rng.uniform(-0.01, 0.01, (rows, 4)).astype("<f4"),
        "discount": np.full(rows, 0.97, "<f4"),
    }
    header = {
        "proto": 1,
        "kind": "samples",
        "actor_id": actor_id,
        "seq": seq,
        "weights_version": 1,
        "episodes": [],
        "arrays": [
            {"name": name, "dtype": "int64" if name == "action" else "float32", "shape": list(col.shape)}
            for name, col in columns.items()
        ],
    }
    return [msgpack.packb(header), *(col.tobytes() for col in columns.values())]


@dataclass
class SamplesFuzzer:
    """Makes messages: ``next()`` gives a valid one every ``valid_every``-th call, a mutated one
    otherwise; counts what it made by kind."""

    seed: int = 0
    valid_every: int = 3
    actor_id: int = 9
    made: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self._seq = 0
        self._calls = 0
        self._mutations: list[Callable[[list[bytes]], list[bytes]]] = [
            self._flip_bits,
            self._frame_surgery,
            self._header_field,
            self._descriptor,
            self._episodes,
            self._values,
        ]

    def next(self) -> list[bytes]:
        self._calls += 1
        frames = valid_frames(self.rng, self.actor_id, self._seq)
        self._seq += 1
        if self._calls % self.valid_every == 0:
            self._count("valid")
            return frames
        mutate = self._mutations[int(self.rng.integers(len(self._mutations)))]
        self._count(mutate.__name__.lstrip("_"))
        return mutate(frames)

    def _count(self, kind: str) -> None:
        self.made[kind] = self.made.get(kind, 0) + 1

    def _pick(self, options: tuple[Any, ...] | list[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def _flip_bits(self, frames: list[bytes]) -> list[bytes]:
        i = int(self.rng.integers(len(frames)))
        data = bytearray(frames[i])
        for _ in range(int(self.rng.integers(1, 4))):
            if data:
                data[int(self.rng.integers(len(data)))] ^= 1 << int(self.rng.integers(8))
        return [*frames[:i], bytes(data), *frames[i + 1 :]]

    def _frame_surgery(self, frames: list[bytes]) -> list[bytes]:
        n = len(frames)
        i, j = int(self.rng.integers(1, n)), int(self.rng.integers(1, n))
        how = int(self.rng.integers(6))
        if how == 0:
            return frames[:i] + frames[i + 1 :]
        if how == 1:
            return [*frames[: i + 1], frames[i], *frames[i + 1 :]]
        if how == 2:
            out = list(frames)
            out[i], out[j] = out[j], out[i]
            return out
        if how == 3:
            return [*frames[:i], frames[i][: int(self.rng.integers(len(frames[i])))], *frames[i + 1 :]]
        if how == 4:
            return [*frames[:i], frames[i] + self.rng.bytes(int(self.rng.integers(1, 64))), *frames[i + 1 :]]
        return [*frames, self.rng.bytes(int(self.rng.integers(0, 64)))]

    def _rewrite(self, frames: list[bytes], change: Callable[[dict[str, Any]], None]) -> list[bytes]:
        header = msgpack.unpackb(frames[0])
        change(header)
        return [msgpack.packb(header), *frames[1:]]

    def _header_field(self, frames: list[bytes]) -> list[bytes]:
        name = self._pick(("seq", "actor_id", "weights_version", "proto", "kind"))
        value = self._pick(EXTREME_INTS) if name != "kind" else self._pick(("rollouts", "weights", "", 1))

        def change(h: dict[str, Any]) -> None:
            h[name] = value

        return self._rewrite(frames, change)

    def _descriptor(self, frames: list[bytes]) -> list[bytes]:
        def change(h: dict[str, Any]) -> None:
            arrays = h["arrays"]
            d = arrays[int(self.rng.integers(len(arrays)))]
            how = int(self.rng.integers(5))
            if how == 0:
                d["dtype"] = self._pick(("float64", "int8", "object", "<f4", "bool", ""))
            elif how == 1:
                k = int(self.rng.integers(len(d["shape"])))
                d["shape"][k] = self._pick((0, -1, 2**31, 2**63 - 1, d["shape"][k] + 1, 3))
            elif how == 2:
                d["shape"] = [*d["shape"], 1]
            elif how == 3:
                arrays.remove(d)
            else:
                arrays.append(dict(d))

        return self._rewrite(frames, change)

    def _episodes(self, frames: list[bytes]) -> list[bytes]:
        records = ([3e38, 10], [float("nan"), 5], [10.0, -1], [10.0, 2**63], [1.0], "x", [1.0, 1.5])
        record = self._pick(records)

        def change(h: dict[str, Any]) -> None:
            h["episodes"] = [record]

        return self._rewrite(frames, change)

    def _values(self, frames: list[bytes]) -> list[bytes]:
        which = int(self.rng.integers(len(COLUMNS)))
        name = COLUMNS[which]
        header = msgpack.unpackb(frames[0])
        desc = header["arrays"][which]
        dtype = "<i8" if desc["dtype"] == "int64" else "<f4"
        col = np.frombuffer(frames[1 + which], dtype).reshape(desc["shape"]).copy()
        flat = col.reshape(-1)
        k = int(self.rng.integers(flat.size))
        if name == "action":
            flat[k] = self._pick((2, -1, 2**40))
        elif name == "discount":
            flat[k] = self._pick((1.5, -0.1, np.nan))
        else:
            flat[k] = self._pick((np.nan, np.inf, -np.inf, 3e38, 1e30))
        return [*frames[: 1 + which], col.tobytes(), *frames[2 + which :]]
