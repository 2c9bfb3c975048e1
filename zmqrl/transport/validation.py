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
from zmqrl.transport.fields import MAX_EPISODES, fail, py_int, short
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
    _validate_episodes(msg.episodes, spec)


def _validate_episodes(episodes: Any, spec: SampleSpec) -> None:
    if len(episodes) > MAX_EPISODES:
        fail(f"too many episodes: {len(episodes)} > {MAX_EPISODES}")
    for ep in episodes:
        ret, length = ep
        if isinstance(ret, (bool, np.bool_)) or not isinstance(ret, (int, float, np.number)):
            fail(f"episode return must be a number, got {short(ret)}")
        if py_int(length, "episode length") < 0:
            fail("episode length must be >= 0")
        # Each step's reward is within max_abs_reward (a transition's n-step sum is checked
        # against it too), so a return beyond it times the length is not one this run can have.
        if not abs(ret) <= spec.max_abs_reward * max(1, length):  # also False for NaN
            fail(f"episode return {short(ret)} beyond transport.max_abs_reward x its length {length}")


def _validate_content(batch: TransitionBatch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The scans of array contents, for a batch whose layout ``_validate_structure`` accepted.

    A vectorised pass over whole columns, so it costs the same few reductions whether the batch
    is one message or many messages' rows merged (the learner checks groups of messages at once).
    Finite is not enough: every value must be one the run can mean (see SampleSpec's limits).
    min/max propagate NaN and a NaN comparison is False, so each range check also rejects NaN.
    """
    obs, action, reward, next_obs, discount = batch
    limit = spec.max_abs_reward
    if not (reward.min() >= -limit and reward.max() <= limit):
        fail(f"reward outside [-{limit:g}, {limit:g}] (transport.max_abs_reward x agent.n_step) or NaN")
    if not (discount.min() >= 0.0 and discount.max() <= _discount_limit(spec)):
        fail(f"discount outside [0, {spec.max_discount:g}] (agent.gamma) or NaN")
    if priorities is not None and not (priorities.min() >= 0.0 and priorities.max() < math.inf):
        fail("priority must be finite and >= 0")
    _check_obs(obs, "obs", spec)
    _check_obs(next_obs, "next_obs", spec)
    if action.dtype.kind in "iu" and spec.num_actions is not None:
        if not (action.min() >= 0 and action.max() < spec.num_actions):
            fail(f"action outside [0, {spec.num_actions})")
    else:
        _check_content(action, "action")
        if spec.action_low is not None and spec.action_high is not None:
            _check_action_bounds(action, spec)


def _discount_limit(spec: SampleSpec) -> float:
    """``max_discount`` as the largest float32 a sender may have rounded gamma ** 1 to."""
    limit = _DISCOUNT_LIMITS.get(spec.max_discount)
    if limit is None:
        rounded = np.float32(spec.max_discount)
        if float(rounded) < spec.max_discount:
            rounded = np.nextafter(rounded, np.float32(np.inf))
        limit = _DISCOUNT_LIMITS[spec.max_discount] = float(rounded)
    return limit


# max_discount -> _discount_limit, computed once per value (a run has one gamma).
_DISCOUNT_LIMITS: dict[float, float] = {}


def _check_obs(arr: np.ndarray, what: str, spec: SampleSpec) -> None:
    """Every component within the spec's observation limits (declared bounds, max_abs_obs).

    One pair of reductions over the column when every component shares its bounds; else one
    pair of comparisons against the per-component bounds, repeated to ``TILED_VALUES`` values
    and laid over that many rows at a time: broadcast row by row, numpy's inner loop is as short
    as a row (4 values on CartPole, whose merged groups of 1024 rows this made 2.5x cheaper).
    """
    limits = spec.obs_limits()
    if limits is None:
        if arr.dtype.kind == "b":
            _check_bool_bytes(arr, what)
        return
    low, high = limits
    if low.size == 1:
        inside = arr.min() >= low[0] and arr.max() <= high[0]
    else:
        rows = arr.reshape(arr.shape[0], low.size)
        k, wide_low, wide_high = _tiled(low, high)
        whole = rows.shape[0] // k * k
        inside = True
        if whole:
            wide = rows[:whole].reshape(whole // k, k * low.size)
            inside = bool((wide >= wide_low).all() and (wide <= wide_high).all())
        if inside and whole < rows.shape[0]:
            rest = rows[whole:]
            inside = bool((rest >= low).all() and (rest <= high).all())
    if not inside:
        fail(_obs_outside(arr, what, low, high))


# Values per row of the tiled bounds (see _check_obs): long enough for numpy's inner loop.
TILED_VALUES = 256
# id(low) -> (low, rows per pass, tiled low, tiled high); ``low`` kept so the id stays its own.
MAX_TILED = 64
_TILED: dict[int, tuple[np.ndarray, int, np.ndarray, np.ndarray]] = {}


def _tiled(low: np.ndarray, high: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Per-component bounds repeated for ``k`` rows, ``k`` a power of two (batch sizes are)."""
    cached = _TILED.get(id(low))
    if cached is None or cached[0] is not low:
        if len(_TILED) >= MAX_TILED:  # a process has one spec; tests make many
            _TILED.clear()
        k = 1 << max(0, (TILED_VALUES // low.size).bit_length() - 1)
        cached = _TILED[id(low)] = (low, k, np.tile(low, k), np.tile(high, k))
    return cached[1], cached[2], cached[3]


def _obs_outside(arr: np.ndarray, what: str, low: np.ndarray, high: np.ndarray) -> str:
    """The reason for a refused observation column, naming the first bad component (a failure
    only, so the extra scan costs nothing on the passing path)."""
    rows = arr.reshape(arr.shape[0], -1)
    bad = ~((rows >= low) & (rows <= high))
    row, col = (int(i) for i in np.argwhere(bad)[0])
    i = 0 if low.size == 1 else col
    return (
        f"{what} component {col} is {float(rows[row, col]):g}, outside [{float(low[i]):g}, "
        f"{float(high[i]):g}] (the env's observation space, at most transport.max_abs_obs)"
    )


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


def validate_episodes(episodes: Any, spec: SampleSpec) -> None:
    """The finished-episode records of a samples message against the spec's reward limit; raises
    WireError. Part of :func:`validate_structure`, and separate because a decoder that skips
    the structure check for a layout it has seen before (``wire.load_samples(contents=False)``)
    has checked the records' types but not their values: the learner's ingest calls this."""
    with _only_wire_errors("samples"):
        _validate_episodes(episodes, spec)


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
