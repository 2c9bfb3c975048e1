"""The inputs of an exported graph: one observation array ``obs``, or one per key of a Dict
observation; how a model's inputs are checked against its metadata, and fed from what a user has.

A Dict observation's policy takes one input per key, named by the key, in the key's dtype and shape
with a dynamic batch dimension, in the records' key order (``zmqrl.types.record_dtype``). Why not
the records' bytes, as torch takes them: a deployment holds the env's Dict, not zmqrl's byte
layout with its padding, and ONNX has no operator that reads a float's bytes back as the float.

No torch here: :mod:`zmqrl.checkpoints.onnx_policy` imports this module, and a deployed model
plays without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.types import ObsEntry, describe, record_dtype, records_batch

# The one input of a graph of plain observations.
INPUT = "obs"
# A recurrent policy's LSTM state: inputs ``(B, H)`` float32 after the observation's, and the
# state after the step as outputs after the action (the caller feeds them back at the next step).
CORE_INPUTS = ("core_h", "core_c")
CORE_OUTPUTS = ("core_h_next", "core_c_next")
# onnxruntime's names of the tensor types a graph's inputs may have (zmqrl.spec.ALLOWED_DTYPES).
ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}

# (name, numpy dtype name, shape without the batch) of one input of the graph.
InputSpec = tuple[str, str, tuple[int, ...]]


def graph_inputs(
    obs_shape: tuple[int, ...], obs_dtype: str, keys: tuple[ObsEntry, ...], core: int = 0
) -> list[InputSpec]:
    """The inputs the metadata says the graph has, in order: ``obs``, or each key; then a
    recurrent policy's state (``core``: its LSTM's width, 0 for none)."""
    obs = [(e.key, e.dtype, tuple(e.shape)) for e in keys] if keys else [(INPUT, obs_dtype, tuple(obs_shape))]
    return obs + [(name, "float32", (core,)) for name in (CORE_INPUTS if core else ())]


def inputs_problem(inputs: Sequence[Any], expected: list[InputSpec]) -> str | None:
    """Why the graph's ``inputs`` (onnxruntime's ``NodeArg``s: name, type, shape) are not those
    ``expected`` from its metadata (names in order, each one's type and non-batch dims), or None.
    A file whose metadata lists a key its graph lacks, or one it does not, or another dtype, is
    refused here rather than failing at its first ``run``."""
    names = [str(i.name) for i in inputs]
    if names != [name for name, _, _ in expected]:
        return f"the graph's inputs are {names}, its metadata describes {[name for name, _, _ in expected]}"
    for node, (name, dtype, shape) in zip(inputs, expected, strict=True):
        kind = ORT_TYPES.get(str(node.type), str(node.type)[:40])
        dims = list(node.shape)[1:] if isinstance(node.shape, list) else None
        if kind != dtype or dims != list(shape):
            return (
                f"input {name!r}: the graph takes {kind} {dims} (after the batch), its metadata says "
                f"{dtype} {list(shape)}"
            )
    return None


def key_feeds(obs: Any, keys: tuple[ObsEntry, ...], source: Path) -> tuple[dict[str, np.ndarray], bool]:
    """The inputs ``{key: (B, *shape)}`` of a Dict observation's graph from ``obs``: the env's raw
    Dict (``{key: array}``, one observation or a batch, an ``action_mask`` as any 0/1 array) or
    records (one, or ``(B,)``, fields read by name); and whether it was one observation."""
    try:
        batch, single = records_batch(obs, record_dtype(keys))
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return {e.key: np.ascontiguousarray(batch[e.key], dtype=e.dtype) for e in keys}, single


def observation_text(obs_shape: tuple[int, ...], obs_dtype: str, keys: tuple[ObsEntry, ...]) -> str:
    """What a model takes, as messages name it: ``[4] float32``, or ``{goal: float32 [2], grid:
    uint8 [1, 7, 7]}`` (each key's dtype and shape)."""
    if keys:
        return describe(record_dtype(keys)).removeprefix("record ")
    return f"{list(obs_shape)} {obs_dtype}"
