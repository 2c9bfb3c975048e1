"""Content checks of decoded samples and weights: finite floats, ranges, shapes against the run.

The second of the wire's two levels (see :mod:`zmqrl.transport.wire`): :func:`validate_samples`
checks a samples message against the run's :class:`~zmqrl.spec.SampleSpec` and
:func:`validate_weights` a weights message against the receiver's network. Both scan array
contents, vectorised, and raise only :class:`~zmqrl.transport.messages.WireError`. They also work
on locally built messages (an actor may check itself before its first send).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.header import MAX_EPISODES, fail, py_int, short
from zmqrl.transport.messages import SamplesMsg, WeightsMsg, WireError
from zmqrl.types import BATCH_FIELDS, TransitionBatch

# Continuous actions may exceed the spec's bounds by this much, relative to the bound's magnitude
# (at least 1): float32 rounding in an actor's rescaling of a squashed policy output (low + (y + 1)
# * (high - low) / 2) lands a few ulps outside a bound; anything further out is a bug or hostile.
ACTION_BOUND_TOLERANCE = 1e-5


# (kind, itemsize) of numpy dtypes by name, looked up once: this is what a numeric dtype's name
# says, whatever the byte order, and ``arr.dtype.name`` costs microseconds per call, six columns
# per message the learner receives.
_KINDS: dict[str, tuple[str, int]] = {}


def _is_dtype(arr: np.ndarray, name: str) -> bool:
    want = _KINDS.get(name)
    if want is None:
        dtype = np.dtype(name)
        want = _KINDS[name] = (dtype.kind, dtype.itemsize)
    dtype = arr.dtype
    return dtype.kind == want[0] and dtype.itemsize == want[1]


def _check_finite(arr: np.ndarray, what: str) -> None:
    # isfinite's temporary is the fastest full scan (see _check_weights): a float64 sum is no
    # faster on small columns and slower on large ones.
    if not np.isfinite(arr).all():
        fail(f"{what} contains NaN or infinity")


def _check_bool_bytes(arr: np.ndarray, what: str) -> None:
    """numpy would read any non-zero byte as True; the wire allows only 0 and 1."""
    if arr.size and arr.view(np.uint8).max() > 1:
        fail(f"{what} has bool bytes other than 0 and 1")


def _check_content(arr: np.ndarray, what: str) -> None:
    kind = arr.dtype.kind
    if kind == "f":
        _check_finite(arr, what)
    elif kind == "b":
        _check_bool_bytes(arr, what)


def _validate_structure(msg: Any, spec: SampleSpec) -> None:
    if not isinstance(msg, SamplesMsg):
        fail(f"expected a samples message, got {type(msg).__name__}")
    for what in ("actor_id", "seq", "weights_version"):
        py_int(getattr(msg, what), what)
    cols: list[np.ndarray] = []
    for name in BATCH_FIELDS:
        col = getattr(msg.batch, name, None)
        if not isinstance(col, np.ndarray):
            fail(f"samples column {name!r} is not a numpy array")
        cols.append(col)
    obs, action, reward, next_obs, discount = cols
    if reward.ndim != 1:
        fail(f"reward must have shape (B,), got {reward.shape}")
    n = reward.shape[0]
    if not 1 <= n <= spec.max_batch:
        fail(f"batch size {n} outside [1, {spec.max_batch}]")
    want = (
        ("obs", obs, (n, *spec.obs_shape), spec.obs_dtype),
        ("action", action, (n, *spec.action_shape), spec.action_dtype),
        ("reward", reward, (n,), "float32"),
        ("next_obs", next_obs, (n, *spec.obs_shape), spec.obs_dtype),
        ("discount", discount, (n,), "float32"),
    )
    for name, col, shape, dtype in want:
        if col.shape != shape or not _is_dtype(col, dtype):
            fail(f"{name} is {col.dtype.name} {col.shape}, expected {dtype} {shape}")
    priorities = getattr(msg, "priorities", None)
    if priorities is not None:
        shaped = isinstance(priorities, np.ndarray) and priorities.shape == (n,)
        if not shaped or not _is_dtype(priorities, "float32"):
            fail(f"priority must be float32 of shape ({n},)")
    if len(msg.episodes) > MAX_EPISODES:
        fail(f"too many episodes: {len(msg.episodes)} > {MAX_EPISODES}")
    for ep in msg.episodes:
        ret, length = ep
        if isinstance(ret, (bool, np.bool_)) or not isinstance(ret, (int, float, np.number)):
            fail(f"episode return must be a number, got {short(ret)}")
        if not math.isfinite(ret):
            fail("episode return must be finite")
        if py_int(length, "episode length") < 0:
            fail("episode length must be >= 0")


def _validate_content(batch: TransitionBatch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The scans of array contents, for a batch whose layout ``_validate_structure`` accepted.

    A vectorised pass over whole columns, so it costs the same few reductions whether the batch
    is one message or many messages' rows merged (the learner checks groups of messages at once).
    """
    obs, action, reward, next_obs, discount = batch
    _check_finite(reward, "reward")
    # min/max propagate NaN and a NaN comparison is False, so this also rejects NaN and inf.
    if not (discount.min() >= 0.0 and discount.max() <= 1.0):
        fail("discount outside [0, 1]")
    if priorities is not None and not (priorities.min() >= 0.0 and priorities.max() < math.inf):
        fail("priority must be finite and >= 0")
    _check_content(obs, "obs")
    _check_content(next_obs, "next_obs")
    if action.dtype.kind in "iu" and spec.num_actions is not None:
        if not (action.min() >= 0 and action.max() < spec.num_actions):
            fail(f"action outside [0, {spec.num_actions})")
    else:
        _check_content(action, "action")
        if spec.action_low is not None and spec.action_high is not None:
            _check_action_bounds(action, spec)


def _check_action_bounds(action: np.ndarray, spec: SampleSpec) -> None:
    """Every row within [low, high] up to ACTION_BOUND_TOLERANCE (actions are already finite).

    The margin scales with each bound's magnitude (at least 1), and an infinite bound stays
    infinite, so one side of a half-bounded dimension is still checked.
    """
    low = np.asarray(spec.action_low, dtype=np.float64).reshape(spec.action_shape)
    high = np.asarray(spec.action_high, dtype=np.float64).reshape(spec.action_shape)
    slack_low = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(low))
    slack_high = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(high))
    if not ((action >= low - slack_low).all() and (action <= high + slack_high).all()):
        fail("continuous action outside the action space's bounds")


@contextmanager
def _only_wire_errors(kind: str) -> Iterator[None]:
    """Whatever a check of foreign input trips over surfaces as WireError, and only as that."""
    try:
        yield
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"invalid {kind} message ({type(exc).__name__})") from exc


def validate_samples(msg: SamplesMsg, spec: SampleSpec) -> None:
    """Check a samples message against the run's spec, contents included; raise WireError if bad.

    Works on locally built messages too (the actor may self-check before its first send). Float
    checks are vectorised: this runs once per received batch on the learner.
    """
    validate_structure(msg, spec)
    validate_content(msg.batch, msg.priorities, spec)


def validate_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The layout half of :func:`validate_samples`: types, shapes and dtypes against the spec,
    batch size, episode records; no scan of array contents. Raises WireError if bad."""
    with _only_wire_errors("samples"):
        _validate_structure(msg, spec)


def validate_content(batch: TransitionBatch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The contents half of :func:`validate_samples`, for a batch (one message's, or several
    messages' rows merged) whose layout passed :func:`validate_structure`. Raises WireError."""
    with _only_wire_errors("samples"):
        _validate_content(batch, priorities, spec)


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
            # isfinite's temporary is the fastest full scan at parameter sizes: on a Nature CNN
            # layer (1.6M float32) 210 us, against 646 us for one float64 sum (whose cast runs
            # buffered) and 407 us for min + max; on a bias of a few values all cost the same.
            if not np.isfinite(arr).all():
                fail(f"weights {name!r} contains NaN or infinity")
        elif kind == "b":
            _check_bool_bytes(arr, f"weights {name!r}")


def _weights_fit(arr: np.ndarray, shape: tuple[int, ...], dtype: str) -> bool:
    """Whether ``arr`` has the reference's shape and dtype (a spec lists shapes as tuples of ints and
    dtypes by name; anything else a caller passes is normalised first)."""
    if arr.shape != shape and arr.shape != tuple(int(d) for d in shape):
        return False
    return _is_dtype(arr, dtype if isinstance(dtype, str) else np.dtype(dtype).name)


def validate_weights(
    msg: WeightsMsg, reference: Mapping[str, tuple[tuple[int, ...], str]] | None = None
) -> None:
    """The content half of :func:`load_weights`, for a message already decoded by :func:`load`
    (the actor checks the fingerprint in between, so a mismatched network is named, not dropped)."""
    with _only_wire_errors("weights"):
        _check_weights(msg, reference)
