"""Dict observations in torch: the keyed torso, reading each key out of the records' bytes.

Towards torch a batch of records crosses as its bytes (``zmqrl.types.as_bytes``: one uint8
tensor ``(..., itemsize)``), so staging, CUDA-graph buffers and device copies handle it as any
other observation tensor. The networks take the fields back out here: a field is the byte range
at its offset, viewed as its dtype (the record is aligned, so the view needs no copy, on the CPU as
on CUDA) and shaped as its key (an ONNX export gives them key by key instead: :class:`KeyTensors`).
The layers are those of ``zmqrl.agents.keyed`` (its docstring says the rule and the names), so
the state dict is the layout the numpy policies load.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from zmqrl.agents.keyed import Field, encoded_width, encoder

# numpy dtype names (zmqrl.spec.ALLOWED_DTYPES) -> torch's.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


class KeyTensors:
    """A batch of records given key by key (``{key: (B, *shape)}`` tensors, each in its key's
    dtype) where a keyed network takes their bytes: an ONNX export's graph has one input per key,
    and cannot rebuild the bytes from them (no ONNX operator of opset 17 reads a float32's bytes
    as the float, as ``field_tensor`` does). :func:`field_tensor` hands out a key's tensor as it
    is, so the networks read either form through their one ``forward``."""

    def __init__(self, values: Mapping[str, torch.Tensor]) -> None:
        self.values = dict(values)


def field_tensor(raw: torch.Tensor | KeyTensors, field: Field) -> torch.Tensor:
    """Key ``field`` of records given as their bytes ``(*lead, itemsize)`` uint8: ``(*lead,
    *field.shape)`` in the field's dtype, a view where the bytes allow one (they do when the
    record's rows start at multiples of its size, as every batch of them does); of
    :class:`KeyTensors`, the key's tensor."""
    if isinstance(raw, KeyTensors):
        return raw.values[field.key]
    part = raw[..., field.offset : field.offset + field.nbytes]
    dtype = TORCH_DTYPES[field.dtype]
    if dtype.itemsize > 1:
        try:
            part = part.view(dtype)
        except RuntimeError:  # a slice whose rows are not aligned to the dtype: copy them
            part = part.contiguous().view(dtype)
    elif dtype != torch.uint8:
        part = part.view(dtype)
    return part.reshape(*raw.shape[:-1], *field.shape)


def check_bytes(raw: torch.Tensor | KeyTensors, fields: tuple[Field, ...]) -> None:
    """Refuse anything but records' bytes ``(B, itemsize)`` uint8 long enough for ``fields``
    (or :class:`KeyTensors` with every key of ``fields``)."""
    if isinstance(raw, KeyTensors):
        if missing := [f.key for f in fields if f.key not in raw.values]:
            raise ValueError(f"a keyed network needs the keys {missing}, got {list(raw.values)}")
        return
    end = max(f.offset + f.nbytes for f in fields)
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] < end:
        raise ValueError(
            f"a keyed network takes records as their bytes (B, itemsize >= {end}) uint8 "
            f"(zmqrl.types.as_bytes), got {raw.dtype} {tuple(raw.shape)}"
        )


def flat_obs(obs: torch.Tensor, fields: tuple[Field, ...]) -> torch.Tensor:
    """Observations flattened to float32 ``(B, D)``: a plain batch as it is, records (their bytes)
    as every key flattened, concatenated in key order (SAC's critics read them so)."""
    if not fields:
        return obs.reshape(obs.shape[0], -1).to(torch.float32)
    check_bytes(obs, fields)
    parts = [field_tensor(obs, f).reshape(obs.shape[0], -1).to(torch.float32) for f in fields]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def flat_width(fields: tuple[Field, ...]) -> int:
    """Width of :func:`flat_obs` for records of ``fields``."""
    return sum(f.size for f in fields)


class KeyedTorso(nn.Module):
    """Records' bytes ``(B, itemsize)`` -> features: per key its encoder (a conv torso of
    ``zmqrl.agents.conv`` for an image key under a CNN ``torso``, else flattened to float32),
    concatenated in key order, then Linear -> ``activation`` per width of ``hidden``.

    The encoders are children named by their key and the MLP's layers children numbered as a
    Sequential numbers them, registered in this order: the state dict is
    ``ActingNet.layout``'s (``torso.<key>.convs.0.weight``, ..., ``torso.0.weight``, ...). A key is
    registered as it is even where it spells a module attribute (``type``, ``training``): it is
    only ever looked up by name in ``_modules``, so it cannot shadow anything.
    """

    def __init__(
        self,
        fields: tuple[Field, ...],
        torso: str,
        hidden: tuple[int, ...],
        activation: type[nn.Module],
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.fields = fields
        self._encoded: list[str] = []  # keys with an encoder of their own
        for field in fields:
            if encoder(field, torso) is not None:
                from zmqrl.agents.conv import CONV_NETS  # only image keys pay for the conv module

                # Not add_module: it refuses a name an attribute has (see the class docstring).
                self._modules[field.key] = CONV_NETS[torso](field.shape, generator=generator)
                self._encoded.append(field.key)
        width = encoded_width(fields, torso)
        self._layers = 0
        for size in hidden:
            self.add_module(str(self._layers), nn.Linear(width, size))
            self.add_module(str(self._layers + 1), activation())
            self._layers += 2
            width = size
        self.out_features = width

    def forward(self, raw: torch.Tensor | KeyTensors) -> torch.Tensor:
        check_bytes(raw, self.fields)
        parts = []
        for field in self.fields:
            values = field_tensor(raw, field)
            if field.key in self._encoded:
                parts.append(self._modules[field.key](values))  # type: ignore[misc]
            else:
                parts.append(values.reshape(values.shape[0], -1).to(torch.float32))
        x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        for i in range(self._layers):
            x = self._modules[str(i)](x)  # type: ignore[misc]
        return x

    def dense(self) -> nn.ModuleList:
        """The MLP's layers (what a generator re-draws after the encoders drew their own)."""
        return nn.ModuleList([self._modules[str(i)] for i in range(self._layers)])  # type: ignore[misc]
