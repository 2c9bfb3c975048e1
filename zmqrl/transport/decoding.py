"""The wire's decoder: a message's frames to a checked message, experience of every kind against the run.

One module on purpose: every message a learner takes from the network is decoded here, from its
frames to rows it may train on, without leaving it (the receiver calls :func:`load_samples` for
each message and :func:`validate_content` once per group), so the whole of what a hostile byte
can meet is read in one place. The other kinds' header fields (weights, heartbeats, stop) are
:mod:`zmqrl.transport.header`'s; the encoder (:mod:`zmqrl.transport.wire`) runs the same
:func:`parse_header` on what it sends, so sender and receiver cannot disagree.

Three levels, so the hot path pays only for what it needs: the *frames* (header map, descriptors
that say exactly how many bytes each frame has); a samples message's *structure* against the run's
:class:`~zmqrl.spec.SampleSpec` (checked once per layout, then only the values that belong to one
message: episode records, a rollout's final observations); and its *contents* (finite, bounded
values), scanned over several messages' merged rows at once. Everything raises
:class:`~zmqrl.transport.messages.WireError` and nothing else. The value checks themselves are in
:mod:`zmqrl.transport.content`, the limits in :mod:`zmqrl.transport.fields`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack
import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport import header as other_kinds
from zmqrl.transport import layouts, mask_checks, record_columns, sequence_checks
from zmqrl.transport.array_checks import check_bool_bytes
from zmqrl.transport.fields import (
    INT64_MAX,
    INT64_MIN,
    LE_DTYPES,
    MAX_ARRAYS,
    MAX_EPISODES,
    MAX_HEADER_BYTES,
    UNPACK_LIMITS,
    fail,
    reject_ext,
    short,
)
from zmqrl.transport.layouts import ArrayDesc
from zmqrl.transport.messages import (
    KIND_ROLLOUTS,
    KIND_SAMPLES,
    KIND_SEQUENCES,
    PROTO_VERSION,
    SamplesMsg,
    WireError,
)
from zmqrl.types import Batch, EpisodeStat, RolloutBatch, SequenceBatch, TransitionBatch

# The exact key set of a samples or rollouts header (the same fields: only the arrays differ).
# Unknown keys are refused rather than ignored: additions go with a PROTO_VERSION bump.
SAMPLES_KEYS = frozenset(("proto", "kind", "arrays", "actor_id", "seq", "weights_version", "episodes"))
EXPERIENCE_KINDS = (KIND_SAMPLES, KIND_ROLLOUTS, KIND_SEQUENCES)
# Bounds of a rollout step's behaviour log-probability ``logp``. A categorical log-probability is
# <= 0; float32 rounding of ``logit - logsumexp(logits)`` may leave it a few ulps above (an ulp of
# a logsumexp of magnitude 1e3 is 6e-5), never more than this.
DISCRETE_LOGP_SLACK = 1e-3
# |logp| at most, either action kind. A Gaussian's log-density is positive for a narrow policy,
# but each dimension adds at most -log(sigma) - 0.92: under 20 even at sigma = 1e-9. It is very
# negative when the clipped action lies many sigmas from a mean beyond the bounds (-z^2 / 2 per
# dimension: thousands, legitimately). 1e6 admits both, and past it float32 means nothing here:
# its spacing at 1e6 is 0.06, so a ratio exp(new - old) of such values is noise.
MAX_ABS_LOGP = 1e6
# Continuous actions may exceed the spec's bounds by this much, relative to the bound's magnitude
# (at least 1): float32 rounding in an actor's rescaling of a squashed policy output (low + (y + 1)
# * (high - low) / 2) lands a few ulps outside a bound; anything further out is a bug or hostile.
ACTION_BOUND_TOLERANCE = 1e-5


class Unframed(NamedTuple):
    """A message's header map (checked), kind, descriptors and arrays (views of its frames)."""

    header: dict[str, Any]
    kind: str
    descs: list[ArrayDesc]
    arrays: list[np.ndarray]


# --------------------------------------------------------------------------------------------
# Frames and headers (every kind)
# --------------------------------------------------------------------------------------------


def unframe(frames: Sequence[Any]) -> Unframed:
    """Frames to a checked header and array views: the frame count and every frame's length
    agree with the header's descriptors. Arrays may be read-only, unaligned views of the frames."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        fail("expected a sequence of frames, got a single buffer")
    views = [_bytes_view(f) for f in frames]
    if not views:
        fail("empty message")
    if views[0].nbytes > MAX_HEADER_BYTES:
        fail(f"header frame is {views[0].nbytes} bytes > {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(views[0], ext_hook=reject_ext, **UNPACK_LIMITS)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types (ExtraData, FormatError, ...)
        fail(f"header is not valid msgpack ({type(exc).__name__})")
    kind, descs = parse_header(header)
    if len(views) != 1 + len(descs):
        fail(f"{kind} header describes {len(descs)} arrays but {len(views) - 1} array frames came")
    arrays = []
    for d, view in zip(descs, views[1:], strict=True):
        if view.nbytes != d.nbytes:
            fail(f"array {d.name!r}: frame is {view.nbytes} bytes, descriptor says {d.nbytes}")
        arrays.append(np.frombuffer(view, dtype=LE_DTYPES[d.dtype]).reshape(d.shape))
    if kind in EXPERIENCE_KINDS and (keyed := _keyed_plan(kind, descs)) is not None:
        return Unframed(header, kind, keyed.descs, record_columns.fold(keyed, arrays))  # Dict observations
    return Unframed(header, kind, descs, arrays)


def _bytes_view(frame: Any) -> memoryview:
    """A flat unsigned-byte view of any buffer (bytes, memoryview, zmq.Frame, numpy array)."""
    mv = memoryview(frame)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def parse_header(header: Any) -> tuple[str, list[ArrayDesc]]:
    """Validate a decoded header of any kind; return its kind and array descriptors."""
    if type(header) is not dict:
        fail(f"header must be a map, got {short(header)}")
    proto = header.get("proto")
    if type(proto) is not int or proto != PROTO_VERSION:
        fail(f"unsupported protocol version {short(proto)}")
    kind = header.get("kind")
    if kind not in EXPERIENCE_KINDS:
        if type(kind) is not str or kind not in other_kinds.HEADER_KEYS:
            fail(f"unknown message kind {short(kind)}")
        other_kinds.check_keys(
            header, other_kinds.HEADER_KEYS[kind], f"{kind} header", other_kinds.OPTIONAL_KEYS.get(kind)
        )
        descs = _descriptors(header["arrays"])
        other_kinds.check_fields(kind, header, [d.name for d in descs])
        return kind, descs
    if header.keys() != SAMPLES_KEYS:
        other_kinds.check_keys(header, SAMPLES_KEYS, f"{kind} header")
    descs = _descriptors(header["arrays"])
    for what in ("actor_id", "seq", "weights_version"):
        value = header[what]
        if type(value) is not int:
            fail(f"{what} must be an integer, got {short(value)}")
        if not 0 <= value <= INT64_MAX:
            fail(f"{what} out of range: {value}")
    checked = _CHECKED_LAYOUTS[kind]
    if id(descs) not in checked:
        keyed = _keyed_plan(kind, descs)
        _COLUMN_CHECKS[kind](descs if keyed is None else keyed.descs)
        if id(descs) in _CACHED:
            checked.add(id(descs))
    return kind, descs


def _keyed_plan(kind: str, descs: list[ArrayDesc]) -> record_columns.Fold | None:
    """How a message with Dict observations (arrays named ``obs.<key>``) folds into columns;
    None for plain columns. Planned once per cached layout, like the column check."""
    if id(descs) in _FOLDS:
        return _FOLDS[id(descs)]
    keyed = record_columns.plan(kind, descs) if record_columns.is_keyed(descs) else None
    if id(descs) in _CACHED:
        _FOLDS[id(descs)] = keyed
    return keyed


# Validated descriptor lists by their (name, dtype, shape) contents. A peer sends the same few
# layouts over and over (one per batch size), each checked once. Bounded: a hostile peer varying
# shapes only fills it, after which its layouts are checked from scratch as before.
_LAYOUTS: dict[tuple[tuple[str, str, tuple[int, ...]], ...], list[ArrayDesc]] = {}
_MAX_LAYOUTS = 512
# ids of the cached lists (never freed, so an id is never reused), and per kind those that passed
# its column check. Cached lists are shared: callers only read them.
_CACHED: set[int] = set()
_CHECKED_LAYOUTS: dict[str, set[int]] = {kind: set() for kind in EXPERIENCE_KINDS}
_FOLDS: dict[int, record_columns.Fold | None] = {}  # by id of a cached layout (see _keyed_plan)
_ROW_BATCHES: dict[str, Any] = {KIND_ROLLOUTS: RolloutBatch, KIND_SEQUENCES: SequenceBatch}
_COLUMN_CHECKS = {KIND_SAMPLES: layouts.check_sample_columns, KIND_ROLLOUTS: layouts.check_rollout_columns}
_COLUMN_CHECKS[KIND_SEQUENCES] = sequence_checks.check_sequence_columns


def _layout_key(arrays: list[Any]) -> tuple[tuple[str, str, tuple[int, ...]], ...] | None:
    """The cache key of a descriptor list, or None when it is not plainly well-typed (then the
    full check runs, and reports what is wrong). Exact types only: ``True`` or ``64.0`` equal 1
    and 64 as keys, but are not valid dimensions."""
    key = []
    for d in arrays:
        if type(d) is not dict or len(d) != 3:
            return None
        name, dtype, shape = d.get("name"), d.get("dtype"), d.get("shape")
        if type(name) is not str or type(dtype) is not str or type(shape) is not list:
            return None
        for dim in shape:
            if type(dim) is not int:
                return None
        key.append((name, dtype, tuple(shape)))
    return tuple(key)


def _descriptors(arrays: Any) -> list[ArrayDesc]:
    """Validate the "arrays" list and compute each array's exact byte length (a layout seen
    before is looked up, not checked again: same contents, same result)."""
    if type(arrays) is not list:
        fail(f"'arrays' must be a list, got {short(arrays)}")
    key = _layout_key(arrays) if len(arrays) <= MAX_ARRAYS else None
    if key is not None:
        known = _LAYOUTS.get(key)
        if known is not None:
            return known
    out = layouts.check_descriptors(arrays)
    if key is not None and len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[key] = out
        _CACHED.add(id(out))
    return out


def parse_episodes(value: Any) -> list[EpisodeStat]:
    """A samples header's "episodes": a bounded list of [finite return, int64 length >= 0]
    records (a return may come as an integer: other encoders shrink 3.0 to 3)."""
    if type(value) is not list:
        fail(f"'episodes' must be a list, got {short(value)}")
    if len(value) > MAX_EPISODES:
        fail(f"too many episodes: {len(value)} > {MAX_EPISODES}")
    out: list[EpisodeStat] = []
    for rec in value:
        if type(rec) is not list or len(rec) != 2:
            fail(f"episode record must be [return, length], got {short(rec)}")
        ret, length = rec
        if type(ret) is float:
            if not math.isfinite(ret):
                fail(f"episode return must be finite, got {ret}")
        elif type(ret) is int and INT64_MIN <= ret <= INT64_MAX:
            ret = float(ret)
        else:
            fail(f"episode return must be a finite number, got {short(ret)}")
        if type(length) is not int:
            fail(f"episode length must be an integer, got {short(length)}")
        if not 0 <= length <= INT64_MAX:
            fail(f"episode length out of range: {length}")
        out.append(EpisodeStat(ret, length))
    return out


# --------------------------------------------------------------------------------------------
# Samples and rollouts against the run
# --------------------------------------------------------------------------------------------


def load_samples(frames: Sequence[Any], spec: SampleSpec, contents: bool = True) -> SamplesMsg:
    """Decode a message that must be experience of the kind the run trains on (``"samples"`` when
    ``spec.rollout_length`` is None, else ``"rollouts"`` of that many steps) and must fit
    ``spec``; raise WireError otherwise.

    ``contents=False`` leaves out the scans of array contents (finite floats, ranges): for a
    caller that runs :func:`validate_content` itself, over several messages at once, before
    anything of them is used.
    """
    try:
        header, kind, descs, arrays = unframe(frames)
    except WireError:
        raise
    except Exception as exc:  # belt and braces: no foreign input may raise anything else
        raise WireError(f"malformed message ({type(exc).__name__})") from exc
    if kind not in EXPERIENCE_KINDS:
        fail(f"expected a samples message, got {kind}")
    transitions = kind == KIND_SAMPLES
    msg = SamplesMsg(
        actor_id=header["actor_id"],
        seq=header["seq"],
        weights_version=header["weights_version"],
        batch=TransitionBatch(*arrays[:5]) if transitions else _ROW_BATCHES[kind](*arrays),
        episodes=parse_episodes(header["episodes"]),
        priorities=arrays[5] if transitions and len(arrays) > 5 else None,
    )
    if contents:
        validate_samples(msg, spec)
    elif (id(descs), id(spec)) not in _FITTING:
        validate_structure(msg, spec)
        if id(descs) in _CACHED and len(_FITTING) < MAX_FITTING:
            _FITTING[id(descs), id(spec)] = spec  # the value keeps the spec (and its id) alive
    else:  # a known layout, but episode returns and a rollout's truncation count are values
        validate_per_message(msg, spec)
    return msg


# (layout, spec) pairs whose structure check passed. A decoded message's layout (kind, shapes,
# dtypes, batch size) is its descriptor list, and the ids and episode records' types the header
# check has already checked; so a known layout that fit a spec once always does. Only the episode
# returns' bound (the spec's reward limit) and a rollout's count of truncated steps depend on the
# values, and are checked for every message (validate_per_message).
_FITTING: dict[tuple[int, int], SampleSpec] = {}
MAX_FITTING = 1024


def _invalid(exc: Exception) -> WireError:
    """Whatever a check of foreign input trips over surfaces as WireError, and only as that (a
    plain try in each entry point: a context manager would re-enter this module twice a call)."""
    return WireError(f"invalid samples message ({type(exc).__name__})")


def validate_samples(msg: SamplesMsg, spec: SampleSpec) -> None:
    """Check a samples message (transitions or rollouts) against the run's spec, contents
    included; raise WireError if bad. Works on locally built messages too (an actor may check
    itself before its first send)."""
    validate_structure(msg, spec)
    validate_content(msg.batch, msg.priorities, spec)


def validate_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The layout half of :func:`validate_samples`: the kind this run trains on, types, shapes and
    dtypes against the spec, batch size, episode records, and :func:`validate_per_message`'s
    checks; no scan of array contents. Raises WireError if bad."""
    try:
        if spec.sequence_length is not None or isinstance(msg.batch, SequenceBatch):
            sequence_checks.check_sequence_structure(msg, spec)  # then only the header's fields
        layouts.check_structure(msg, spec)
        _check_per_message(msg, spec)
    except WireError:
        raise
    except Exception as exc:
        raise _invalid(exc) from exc


def validate_content(batch: Batch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The contents half of :func:`validate_samples`, for a batch (one message's, or several
    messages' rows merged) whose layout passed :func:`validate_structure`. Raises WireError."""
    try:
        if isinstance(batch, RolloutBatch):
            _check_rollout_content(batch, spec)
        elif isinstance(batch, SequenceBatch):
            _check_sequence_content(batch, spec)
        else:
            _check_content(batch, priorities, spec)
    except WireError:
        raise
    except Exception as exc:
        raise _invalid(exc) from exc


def validate_per_message(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The checks of values that belong to one message and cannot run over merged rows: its
    episode records against the spec's reward limit, and a rollouts message's final_obs count
    against its own truncated steps (merged, one message's missing row could hide behind another's
    extra one). Part of :func:`validate_structure`, and separate because :func:`load_samples`
    skips the structure check for a layout it has seen before and runs this for every message."""
    try:
        _check_per_message(msg, spec)
    except WireError:
        raise
    except Exception as exc:
        raise _invalid(exc) from exc


# --------------------------------------------------------------------------------------------
# Values: one message's, and every row's (merged over a group's messages)
# --------------------------------------------------------------------------------------------


def _check_per_message(msg: SamplesMsg, spec: SampleSpec) -> None:
    # Each step's reward is within max_abs_reward (a transition's n-step sum is checked against it
    # too), so an episode return beyond it times the length is not one this run can have.
    limit = spec.max_abs_reward
    for ret, length in msg.episodes:
        if not abs(ret) <= limit * max(1, length):  # also False for NaN
            fail(f"episode return {short(ret)} beyond transport.max_abs_reward x its length {length}")
    if isinstance(msg.batch, RolloutBatch):
        _check_final_obs_count(msg.batch)


def _check_final_obs_count(batch: RolloutBatch) -> None:
    """One final_obs row per truncated step. Counting never misreads a bool byte other than 0/1
    (any non-zero byte counts), and such bytes are refused by the content scan anyway."""
    cut = int(np.count_nonzero(batch.truncated))
    if cut != batch.final_obs.shape[0]:
        fail(f"final_obs has {batch.final_obs.shape[0]} rows, but {cut} steps are truncated (one row each)")


def _check_content(batch: TransitionBatch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The scans of a transition batch's contents: vectorised passes over whole columns, the same
    few reductions for one message or many messages' rows merged. Finite is not enough: every
    value must be one the run can mean (SampleSpec's limits). min/max propagate NaN and a NaN
    comparison is False, so each range check also refuses NaN."""
    obs, action, reward, next_obs, discount = batch
    limit = spec.max_abs_reward
    if not (reward.min() >= -limit and reward.max() <= limit):
        fail(f"reward outside [-{limit:g}, {limit:g}] (transport.max_abs_reward x agent.n_step) or NaN")
    if not (discount.min() >= 0.0 and discount.max() <= _discount_limit(spec)):
        fail(f"discount outside [0, {spec.max_discount:g}] (agent.gamma) or NaN")
    if priorities is not None and not (priorities.min() >= 0.0 and priorities.max() < np.inf):
        fail("priority must be finite and >= 0")
    _check_obs(obs, "obs", spec)
    _check_obs(next_obs, "next_obs", spec)
    _check_actions(action, "action", spec)
    if spec.action_mask:  # the rows' legal actions, and the actions taken among them
        mask_checks.check_masked_transitions(batch, spec)


def _check_rollout_content(batch: RolloutBatch, spec: SampleSpec) -> None:
    """The scans of a rollout batch's contents, with the transitions' rules where a column means
    the same, and a per-step reward (one env step: ``max_abs_reward`` itself, no n-step factor).

    The done flags' raw bytes: ``np.frombuffer`` views a bool frame as it came, so a hostile frame
    can hold a 2 or a 255 that numpy (and torch) reads as True; the wire allows 0 and 1 only. One
    OR of the bytes finds any other byte in either flag, one AND a step flagged both ways."""
    obs, action, reward, terminated, truncated, logp, final_obs = batch[:7]
    if batch.core_state is not None:
        _check_core_state(batch.core_state, spec)
    term, trunc = terminated.view(np.uint8), truncated.view(np.uint8)
    if (term | trunc).max() > 1:
        check_bool_bytes(terminated, "terminated")
        check_bool_bytes(truncated, "truncated")
    if (term & trunc).any():
        fail("a step is both terminated and truncated (termination wins: send it as terminated only)")
    _check_final_obs_count(batch)  # merged rows: the total (each message's own: _check_per_message)
    limit = spec.max_abs_reward
    if not (reward.min() >= -limit and reward.max() <= limit):
        fail(f"reward outside [-{limit:g}, {limit:g}] (transport.max_abs_reward, per step) or NaN")
    high = DISCRETE_LOGP_SLACK if spec.num_actions is not None else MAX_ABS_LOGP
    if not (logp.min() >= -MAX_ABS_LOGP and logp.max() <= high):
        fail(f"logp outside [-{MAX_ABS_LOGP:g}, {high:g}] (a log-probability of the action) or NaN")
    _check_obs(obs.reshape(-1, *spec.obs_shape), "obs", spec)  # R * (T + 1) observation rows
    if final_obs.shape[0]:
        _check_obs(final_obs, "final_obs", spec)
    _check_actions(action, "action", spec)
    if spec.action_mask:  # the rows' legal actions, and the actions taken among them
        mask_checks.check_masked_rollouts(batch, spec)


def _check_sequence_content(batch: SequenceBatch, spec: SampleSpec) -> None:
    """A window batch's values: its flags (``sequence_checks``), then the rollouts' rules."""
    sequence_checks.check_sequence_flags(batch, spec)
    _check_core_state(batch.core_state, spec)
    limit = spec.max_abs_reward
    if not (batch.reward.min() >= -limit and batch.reward.max() <= limit):
        fail(f"reward outside [-{limit:g}, {limit:g}] (transport.max_abs_reward, per step) or NaN")
    _check_obs(batch.obs.reshape(-1, *spec.obs_shape), "obs", spec)
    _check_actions(batch.action, "action", spec)
    if spec.action_mask:  # the rows' legal actions, and the actions taken at real positions
        mask_checks.check_masked_sequences(batch, spec)


def _check_core_state(state: np.ndarray, spec: SampleSpec) -> None:
    """A recurrent row's start state: ``h`` in [-1, 1] (a tanh times a sigmoid), ``c`` within the
    spec's cell bound (an LSTM's cell grows by less than 1 a step from zero at an episode's start,
    so the env's time limit bounds it: ``SampleSpec.max_abs_core_cell``). NaN fails both."""
    h, c = state[:, 0], state[:, 1]
    if not (h.min() >= -1.0 and h.max() <= 1.0):
        fail("core_state h outside [-1, 1] (an LSTM's output) or NaN")
    limit = spec.max_abs_core_cell
    if not (c.min() >= -limit and c.max() <= limit):
        fail(f"core_state c outside [-{limit:g}, {limit:g}] (the episode limit bounds an LSTM cell) or NaN")


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
    """Every component of ``arr`` (rows of ``spec.obs_shape``, at least one) within the spec's
    observation limits (declared bounds, max_abs_obs).

    One pair of reductions over the column when every component shares its bounds; else one
    pair of comparisons against the per-component bounds repeated to ``TILED_VALUES`` values and
    laid over that many rows at a time: broadcast row by row, numpy's inner loop is only as long
    as a row (4 values on CartPole).
    """
    if spec.obs_entries:  # records: each key against its own bounds
        for entry in spec.obs_entries:
            _check_values(arr[entry.key], f"{what}.{entry.key}", spec.entry_limits(entry.key))
        return
    _check_values(arr, what, spec.obs_limits())


def _check_values(arr: np.ndarray, what: str, limits: tuple[np.ndarray, np.ndarray] | None) -> None:
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
    """The reason for a refused observation column, naming the first bad component."""
    rows = arr.reshape(arr.shape[0], -1)
    bad = ~((rows >= low) & (rows <= high))
    row, col = (int(i) for i in np.argwhere(bad)[0])
    i = 0 if low.size == 1 else col
    return (
        f"{what} component {col} is {float(rows[row, col]):g}, outside [{float(low[i]):g}, "
        f"{float(high[i]):g}] (the env's observation space, at most transport.max_abs_obs)"
    )


def _check_actions(action: np.ndarray, what: str, spec: SampleSpec) -> None:
    """Discrete actions in ``[0, num_actions)``; continuous ones finite and within the bounds up to
    ACTION_BOUND_TOLERANCE, scaled by each bound's magnitude (at least 1; an infinite bound stays
    infinite, so one side of a half-bounded dimension is still checked)."""
    if action.dtype.kind in "iu" and spec.num_actions is not None:
        if not (action.min() >= 0 and action.max() < spec.num_actions):
            fail(f"{what} outside [0, {spec.num_actions})")
        return
    if action.dtype.kind == "f" and not np.isfinite(action).all():
        fail(f"{what} contains NaN or infinity")
    if action.dtype.kind == "b":
        check_bool_bytes(action, what)
    if spec.action_low is None or spec.action_high is None:
        return
    low = np.asarray(spec.action_low, dtype=np.float64).reshape(spec.action_shape)
    high = np.asarray(spec.action_high, dtype=np.float64).reshape(spec.action_shape)
    slack_low = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(low))
    slack_high = ACTION_BOUND_TOLERANCE * np.maximum(1.0, np.abs(high))
    if not ((action >= low - slack_low).all() and (action <= high + slack_high).all()):
        fail("continuous action outside the action space's bounds")
