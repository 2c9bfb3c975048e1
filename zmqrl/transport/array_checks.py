"""Checks of decoded arrays outside the samples decoder's hot path: a dtype by name, finite
floats (a weights message's), bool bytes, and a weights message against the receiver's network.

Samples and rollouts are checked by :mod:`zmqrl.transport.decoding` (their values) and
:mod:`zmqrl.transport.layouts` (their structure, which asks :func:`is_dtype`); a weights message,
once per new version on every actor, here. Each check is one vectorised pass, or a few, and
raises :class:`~zmqrl.transport.messages.WireError` through ``fail``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.transport.fields import fail
from zmqrl.transport.messages import WeightsMsg, WireError

# (kind, itemsize) of numpy dtypes by name, looked up once: this is what a numeric dtype's name
# says, whatever the byte order, and ``arr.dtype.name`` costs microseconds per call, six columns
# per message the learner receives.
_KINDS: dict[str, tuple[str, int]] = {}


def is_dtype(arr: np.ndarray, name: str | np.dtype[Any]) -> bool:
    """Whether ``arr`` holds the numpy dtype ``name`` (in either byte order); a records dtype
    (``SampleSpec.obs_np_dtype`` of a Dict observation run) must be exactly equal."""
    if not isinstance(name, str):
        if name.names is not None:
            return arr.dtype == name
        name = name.name
    want = _KINDS.get(name)
    if want is None:
        dtype = np.dtype(name)
        want = _KINDS[name] = (dtype.kind, dtype.itemsize)
    dtype = arr.dtype
    return dtype.kind == want[0] and dtype.itemsize == want[1]


def check_bool_bytes(arr: np.ndarray, what: str) -> None:
    """numpy would read any non-zero byte as True; the wire allows only 0 and 1."""
    if arr.size and arr.view(np.uint8).max() > 1:
        fail(f"{what} has bool bytes other than 0 and 1")


def _check_weights(msg: WeightsMsg, reference: Mapping[str, tuple[tuple[int, ...], str]] | None) -> None:
    # Runs on every actor for every new version, so the passing path does no per-array string
    # work (dtype names, f-strings): those are built only for the message of a failure.
    arrays = msg.weights.arrays
    if reference is not None:
        if arrays.keys() != reference.keys():
            missing = [k for k in reference if k not in arrays]
            extra = [k for k in arrays if k not in reference]
            fail(f"weights names differ from reference: missing {missing[:8]}, unexpected {extra[:8]}")
        for name, (shape, dtype) in reference.items():
            arr = arrays[name]
            if not _weights_fit(arr, shape, dtype):
                want_shape = tuple(int(d) for d in shape)
                want = f"{np.dtype(dtype).name} {want_shape}"
                fail(f"weights {name!r} is {arr.dtype.name} {arr.shape}, expected {want}")
    for name, arr in arrays.items():
        kind = arr.dtype.kind
        if kind == "f":
            # isfinite's temporary is the fastest full scan at parameter sizes: faster on a large
            # layer than one float64 sum (whose cast runs buffered) or min + max; on a bias of a
            # few values all cost the same.
            if not np.isfinite(arr).all():
                fail(f"weights {name!r} contains NaN or infinity")
        elif kind == "b":
            check_bool_bytes(arr, f"weights {name!r}")


def _weights_fit(arr: np.ndarray, shape: tuple[int, ...], dtype: str) -> bool:
    """Whether ``arr`` has the reference's shape and dtype (a spec lists shapes as tuples of ints and
    dtypes by name; anything else a caller passes is normalised first)."""
    if arr.shape != shape and arr.shape != tuple(int(d) for d in shape):
        return False
    return is_dtype(arr, dtype if isinstance(dtype, str) else np.dtype(dtype).name)


def validate_weights(
    msg: WeightsMsg, reference: Mapping[str, tuple[tuple[int, ...], str]] | None = None
) -> None:
    """The content half of :func:`zmqrl.transport.wire.load_weights`, for a message already decoded
    by ``load`` (the actor checks the fingerprint in between, so a mismatched network is named,
    not dropped)."""
    try:
        _check_weights(msg, reference)
    except WireError:
        raise
    except Exception as exc:  # whatever a check of foreign input trips over surfaces as WireError
        raise WireError(f"invalid weights message ({type(exc).__name__})") from exc
