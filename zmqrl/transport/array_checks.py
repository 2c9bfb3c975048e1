"""Checks of one decoded array's values: its dtype, finite floats, bool bytes, observation and
continuous action bounds against the run's :class:`~zmqrl.spec.SampleSpec`.

The pieces :mod:`zmqrl.transport.validation` builds its message checks from, shared by samples,
rollouts and weights so that every column of a kind (an observation, an action) is held to the
same rule whichever message carries it. Each check is one vectorised pass, or a few, over the
array, and raises :class:`~zmqrl.transport.messages.WireError` through ``fail``.
"""

from __future__ import annotations

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.fields import fail

# Continuous actions may exceed the spec's bounds by this much, relative to the bound's magnitude
# (at least 1): float32 rounding in an actor's rescaling of a squashed policy output (low + (y + 1)
# * (high - low) / 2) lands a few ulps outside a bound; anything further out is a bug or hostile.
ACTION_BOUND_TOLERANCE = 1e-5


# (kind, itemsize) of numpy dtypes by name, looked up once: this is what a numeric dtype's name
# says, whatever the byte order, and ``arr.dtype.name`` costs microseconds per call, six columns
# per message the learner receives.
_KINDS: dict[str, tuple[str, int]] = {}


def is_dtype(arr: np.ndarray, name: str) -> bool:
    """Whether ``arr`` holds the numpy dtype ``name`` (in either byte order)."""
    want = _KINDS.get(name)
    if want is None:
        dtype = np.dtype(name)
        want = _KINDS[name] = (dtype.kind, dtype.itemsize)
    dtype = arr.dtype
    return dtype.kind == want[0] and dtype.itemsize == want[1]


def check_finite(arr: np.ndarray, what: str) -> None:
    # isfinite's temporary is the fastest full scan (see validation._check_weights): a float64 sum
    # is no faster on small columns and slower on large ones.
    if not np.isfinite(arr).all():
        fail(f"{what} contains NaN or infinity")


def check_bool_bytes(arr: np.ndarray, what: str) -> None:
    """numpy would read any non-zero byte as True; the wire allows only 0 and 1."""
    if arr.size and arr.view(np.uint8).max() > 1:
        fail(f"{what} has bool bytes other than 0 and 1")


def check_content(arr: np.ndarray, what: str) -> None:
    """Floats finite, bools 0 or 1; integers need no check of their own."""
    kind = arr.dtype.kind
    if kind == "f":
        check_finite(arr, what)
    elif kind == "b":
        check_bool_bytes(arr, what)


def check_obs(arr: np.ndarray, what: str, spec: SampleSpec) -> None:
    """Every component of ``arr`` (rows of ``spec.obs_shape``, at least one) within the spec's
    observation limits (declared bounds, max_abs_obs).

    One pair of reductions over the column when every component shares its bounds; else one
    pair of comparisons against the per-component bounds, repeated to ``TILED_VALUES`` values
    and laid over that many rows at a time: broadcast row by row, numpy's inner loop is as short
    as a row (4 values on CartPole, whose merged groups of 1024 rows this made 2.5x cheaper).
    """
    limits = spec.obs_limits()
    if limits is None:
        if arr.dtype.kind == "b":
            check_bool_bytes(arr, what)
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


# Values per row of the tiled bounds (see check_obs): long enough for numpy's inner loop.
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


def check_action_bounds(action: np.ndarray, spec: SampleSpec) -> None:
    """Every action within [low, high] up to ACTION_BOUND_TOLERANCE (actions are already finite;
    any leading dimensions: a batch's (B, act_dim), a rollout's (R, T, act_dim)).

    The margin scales with each bound's magnitude (at least 1), and an infinite bound stays
    infinite, so one side of a half-bounded dimension is still checked.
    """
    low = np.asarray(spec.action_low, dtype=np.float64).reshape(spec.action_shape)
    high = np.asarray(spec.action_high, dtype=np.float64).reshape(spec.action_shape)
    slack_low = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(low))
    slack_high = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(high))
    if not ((action >= low - slack_low).all() and (action <= high + slack_high).all()):
        fail("continuous action outside the action space's bounds")


def check_actions(action: np.ndarray, what: str, spec: SampleSpec) -> None:
    """Discrete actions in ``[0, num_actions)``; continuous ones finite and within the bounds."""
    if action.dtype.kind in "iu" and spec.num_actions is not None:
        if not (action.min() >= 0 and action.max() < spec.num_actions):
            fail(f"{what} outside [0, {spec.num_actions})")
    else:
        check_content(action, what)
        if spec.action_low is not None and spec.action_high is not None:
            check_action_bounds(action, spec)
