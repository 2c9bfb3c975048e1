"""Content checks of decoded samples, rollouts and weights: finite floats, ranges, shapes against the run.

The second of the wire's two levels (see :mod:`zmqrl.transport.wire`): :func:`validate_samples`
checks a samples message (transitions or rollouts) against the run's
:class:`~zmqrl.spec.SampleSpec` and :func:`validate_weights` a weights message against the
receiver's network. Both scan array contents, vectorised, with the per-array checks of
:mod:`zmqrl.transport.array_checks`, and raise only :class:`~zmqrl.transport.messages.WireError`.
They also work on locally built messages (an actor may check itself before its first send).

A samples message's checks come in three parts, so a receiver that merges several messages can
scan their rows once: :func:`validate_structure` (layout against the spec, cached per layout by
the decoder), :func:`validate_per_message` (the values that belong to one message and cannot be
checked over merged rows) and :func:`validate_content` (the scans of every row, merged or not).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from zmqrl.spec import SampleSpec
from zmqrl.transport.array_checks import check_actions, check_bool_bytes, check_obs, is_dtype
from zmqrl.transport.fields import MAX_EPISODES, fail, py_int, short
from zmqrl.transport.messages import SamplesMsg, WeightsMsg, WireError
from zmqrl.types import BATCH_FIELDS, ROLLOUT_FIELDS, Batch, RolloutBatch, TransitionBatch

# Bounds of a rollout step's behaviour log-probability ``logp``. A categorical log-probability is
# <= 0; float32 rounding of ``logit - logsumexp(logits)`` may leave it a few ulps above (an ulp of
# a logsumexp of magnitude 1e3 is 6e-5), never more than this.
DISCRETE_LOGP_SLACK = 1e-3
# |logp| at most, either action kind. A Gaussian's log-density is positive for a narrow policy,
# but each dimension adds at most -log(sigma) - 0.92: under 20 even at sigma = 1e-9 (a log-std of
# -20, the lowest clamp in common use). It is very negative when the clipped action lies many
# sigmas from a mean beyond the bounds (-z^2 / 2 per dimension: thousands, legitimately). 1e6
# admits both for any action size a policy has (a categorical logp below -1e6 needs a logit spread
# of 1e6), and past it float32 means nothing here: its spacing at 1e6 is 0.06, so a ratio
# exp(new - old) of such values is noise, while 3e38 (finite) overflows the learner's arithmetic.
MAX_ABS_LOGP = 1e6


def _columns(batch: Any, names: tuple[str, ...], kind: str) -> list[np.ndarray]:
    cols: list[np.ndarray] = []
    for name in names:
        col = getattr(batch, name, None)
        if not isinstance(col, np.ndarray):
            fail(f"{kind} column {name!r} is not a numpy array")
        cols.append(col)
    return cols


def _check_layout(want: tuple[tuple[str, np.ndarray, tuple[int, ...], str], ...]) -> None:
    for name, col, shape, dtype in want:
        if col.shape != shape or not is_dtype(col, dtype):
            fail(f"{name} is {col.dtype.name} {col.shape}, expected {dtype} {shape}")


def _validate_structure(msg: Any, spec: SampleSpec) -> None:
    if not isinstance(msg, SamplesMsg):
        fail(f"expected a samples message, got {type(msg).__name__}")
    for what in ("actor_id", "seq", "weights_version"):
        py_int(getattr(msg, what), what)
    batch = msg.batch
    if isinstance(batch, RolloutBatch):
        if spec.rollout_length is None:
            fail("rollouts refused: this run trains on transitions (samples messages), not on rollouts")
        _validate_rollout_structure(msg, batch, spec)
    else:
        if (steps := spec.rollout_length) is not None:
            fail(f"samples refused: this run trains on rollouts of {steps} steps, not on transitions")
        _validate_transition_structure(msg, spec)
    _validate_episodes(msg.episodes, spec)


def _validate_transition_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    obs, action, reward, next_obs, discount = _columns(msg.batch, BATCH_FIELDS, "samples")
    if reward.ndim != 1:
        fail(f"reward must have shape (B,), got {reward.shape}")
    n = reward.shape[0]
    if not 1 <= n <= spec.max_batch:
        fail(f"batch size {n} outside [1, {spec.max_batch}]")
    _check_layout(
        (
            ("obs", obs, (n, *spec.obs_shape), spec.obs_dtype),
            ("action", action, (n, *spec.action_shape), spec.action_dtype),
            ("reward", reward, (n,), "float32"),
            ("next_obs", next_obs, (n, *spec.obs_shape), spec.obs_dtype),
            ("discount", discount, (n,), "float32"),
        )
    )
    priorities = getattr(msg, "priorities", None)
    if priorities is not None:
        shaped = isinstance(priorities, np.ndarray) and priorities.shape == (n,)
        if not shaped or not is_dtype(priorities, "float32"):
            fail(f"priority must be float32 of shape ({n},)")


def _validate_rollout_structure(msg: SamplesMsg, batch: RolloutBatch, spec: SampleSpec) -> None:
    obs, action, reward, terminated, truncated, logp, final_obs = _columns(
        msg.batch, ROLLOUT_FIELDS, "rollouts"
    )
    if reward.ndim != 2:
        fail(f"reward must have shape (R, T), got {reward.shape}")
    rows, steps = reward.shape
    if steps != spec.rollout_length:
        fail(f"rollouts of {steps} steps, this run's have {spec.rollout_length} (actor.rollout_length)")
    if not 1 <= rows <= spec.max_batch:
        fail(f"{rows} rollouts outside [1, {spec.max_batch}]")
    k = final_obs.shape[0] if final_obs.ndim else 0
    _check_layout(
        (
            ("obs", obs, (rows, steps + 1, *spec.obs_shape), spec.obs_dtype),
            ("action", action, (rows, steps, *spec.action_shape), spec.action_dtype),
            ("reward", reward, (rows, steps), "float32"),
            ("terminated", terminated, (rows, steps), "bool"),
            ("truncated", truncated, (rows, steps), "bool"),
            ("logp", logp, (rows, steps), "float32"),
            ("final_obs", final_obs, (k, *spec.obs_shape), spec.obs_dtype),
        )
    )
    if getattr(msg, "priorities", None) is not None:
        fail("rollouts carry no priority array")
    _check_final_obs_count(batch)


def _check_final_obs_count(batch: RolloutBatch) -> None:
    """One final_obs row per truncated step. Counting never misreads a bool byte other than 0/1
    (any non-zero byte counts), and such bytes are refused by the content scan anyway."""
    cut = int(np.count_nonzero(batch.truncated))
    if cut != batch.final_obs.shape[0]:
        fail(f"final_obs has {batch.final_obs.shape[0]} rows, but {cut} steps are truncated (one row each)")


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
    if priorities is not None and not (priorities.min() >= 0.0 and priorities.max() < np.inf):
        fail("priority must be finite and >= 0")
    check_obs(obs, "obs", spec)
    check_obs(next_obs, "next_obs", spec)
    check_actions(action, "action", spec)


def _validate_rollout_content(batch: RolloutBatch, spec: SampleSpec) -> None:
    """The scans of a rollout batch's contents (one message's, or several messages' rows merged),
    with the same rules as ``_validate_content`` where a column means the same: observations,
    actions, a per-step reward (one env step: ``max_abs_reward`` itself, no n-step factor)."""
    obs, action, reward, terminated, truncated, logp, final_obs = batch
    _check_done_flags(terminated, truncated)
    _check_final_obs_count(batch)  # merged rows: the total (each message's own: validate_per_message)
    limit = spec.max_abs_reward
    if not (reward.min() >= -limit and reward.max() <= limit):
        fail(f"reward outside [-{limit:g}, {limit:g}] (transport.max_abs_reward, per step) or NaN")
    high = DISCRETE_LOGP_SLACK if spec.num_actions is not None else MAX_ABS_LOGP
    if not (logp.min() >= -MAX_ABS_LOGP and logp.max() <= high):
        fail(f"logp outside [-{MAX_ABS_LOGP:g}, {high:g}] (a log-probability of the action) or NaN")
    check_obs(obs.reshape(-1, *spec.obs_shape), "obs", spec)  # R * (T + 1) observation rows
    if final_obs.shape[0]:
        check_obs(final_obs, "final_obs", spec)
    check_actions(action, "action", spec)


def _check_done_flags(terminated: np.ndarray, truncated: np.ndarray) -> None:
    """Both flags' bytes 0 or 1, and never both set at one step.

    ``np.frombuffer`` views a bool frame's bytes as they came, so a hostile frame can hold a 2 or
    a 255 that numpy (and torch, sharing the buffer) reads as True while its bytes say otherwise
    to anything that looks at them; the wire allows 0 and 1 only. One OR of the raw bytes finds
    any other byte in either flag (its maximum is 1 exactly when both are 0/1), one AND a step
    flagged both ways.
    """
    term, trunc = terminated.view(np.uint8), truncated.view(np.uint8)
    if (term | trunc).max() > 1:
        check_bool_bytes(terminated, "terminated")
        check_bool_bytes(truncated, "truncated")
    if (term & trunc).any():
        fail("a step is both terminated and truncated (termination wins: send it as terminated only)")


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
    """Check a samples message (transitions or rollouts) against the run's spec, contents
    included; raise WireError if bad.

    Works on locally built messages too (the actor may self-check before its first send). Float
    checks are vectorised: this runs once per received batch on the learner.
    """
    validate_structure(msg, spec)
    validate_content(msg.batch, msg.priorities, spec)


def validate_structure(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The layout half of :func:`validate_samples`: the kind this run trains on, types, shapes and
    dtypes against the spec, batch size, episode records, and :func:`validate_per_message`'s
    checks; no scan of array contents. Raises WireError if bad."""
    with _only_wire_errors("samples"):
        _validate_structure(msg, spec)


def validate_content(batch: Batch, priorities: np.ndarray | None, spec: SampleSpec) -> None:
    """The contents half of :func:`validate_samples`, for a batch (one message's, or several
    messages' rows merged) whose layout passed :func:`validate_structure`. Raises WireError."""
    with _only_wire_errors("samples"):
        if isinstance(batch, RolloutBatch):
            _validate_rollout_content(batch, spec)
        else:
            _validate_content(batch, priorities, spec)


def validate_per_message(msg: SamplesMsg, spec: SampleSpec) -> None:
    """The checks of values that belong to one message and cannot run over merged rows: its
    episode records against the spec's reward limit, and a rollouts message's final_obs count
    against its own truncated steps (merged, one message's missing row could hide behind another's
    extra one). Part of :func:`validate_structure`, and separate because a decoder that skips the
    structure check for a layout it has seen before (``wire.load_samples(contents=False)``) runs
    this for every message. Raises WireError."""
    with _only_wire_errors("samples"):
        if msg.episodes:
            _validate_episodes(msg.episodes, spec)
        if isinstance(msg.batch, RolloutBatch):
            _check_final_obs_count(msg.batch)


def validate_episodes(episodes: Any, spec: SampleSpec) -> None:
    """The finished-episode records of a samples message against the spec's reward limit; raises
    WireError (one part of :func:`validate_per_message`)."""
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
    """The content half of :func:`load_weights`, for a message already decoded by :func:`load`
    (the actor checks the fingerprint in between, so a mismatched network is named, not dropped)."""
    with _only_wire_errors("weights"):
        _check_weights(msg, reference)
