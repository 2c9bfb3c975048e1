"""What a run's samples look like (observation and action shapes, dtypes, bounds): a domain type.

The learner builds it from the env's spaces; the wire decoders check batches against it, replay
sizes its columns by it and agents size their networks by it. It lives outside the transport layer
because none of those users are about transport.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.errors import ConfigError
from zmqrl.types import ACTION_MASK_KEY, MAX_KEYS, RECORD, ObsEntry, check_key, record_dtype

# numpy dtype names an array frame may carry. Deliberately small: each is fixed-size, has one
# unambiguous byte layout in every language, and covers observations, actions and parameters.
ALLOWED_DTYPES: frozenset[str] = frozenset({"float32", "float64", "int32", "int64", "uint8", "bool"})

# Most dimensions one array may have (a batch adds one to a spec's shapes).
MAX_NDIM = 8

# Largest magnitude an observation component may have where the env declares no finite bound
# (CartPole's velocities, MuJoCo's whole Box), and a cap on declared ones beyond it (CartPole says
# +-3.4e38, float32's largest). What real envs produce there is orders below (MuJoCo's velocities
# and contact forces reach the thousands); a 1e30 row fed to a network overflows float32 in its
# first products and turns every parameter NaN in one update. ``transport.max_abs_obs``.
DEFAULT_MAX_ABS_OBS = 1e6
# Float observations may pass a declared bound by this much, relative to the bound's magnitude (at
# least 1), as continuous actions may (transport/decoding.py): an env's float32 rounding lands
# a few ulps past a bound it clips to; anything further is not an observation it can produce.
OBS_BOUND_TOLERANCE = 1e-5
# Largest magnitude of a transition's reward as sent (an n-step transition's discounted sum) and of
# an episode's return per step. Generous on purpose: unclipped Atari scores reach a few thousand a
# step, MuJoCo's rewards are tens; at 1e6 a squared TD error stays far inside float32 (3.4e38).
# ``transport.max_abs_reward``.
DEFAULT_MAX_ABS_REWARD = 1e6
# Largest |c| of a recurrent rollout row's LSTM start state (h, c) where the env declares no time
# limit. An LSTM cell's ``c' = sigmoid(f) c + sigmoid(i) tanh(g)`` moves by less than 1 a step
# (|c'| < |c| + 1) and is zero at an episode's first step, so a row starting at step k of an
# episode has |c| < k: the env's time limit bounds it (``learner_spec`` uses it); without one,
# an episode of a million steps is this bound (and float32 still holds it exactly). |h| <= 1 (tanh).
DEFAULT_MAX_ABS_CORE_CELL = 1e6
# The widest LSTM core a run may have (zmqrl's configs use 64 to 512): its state travels in every
# recurrent message and an ONNX export declares it, so configs, specs and exports share one bound.
MAX_CORE_SIZE = 8192


@dataclass(frozen=True)
class SampleSpec:
    """What a run's samples must look like; built by the learner from the env's spaces.

    Structural decoding cannot know the env, so this is what turns "a well-formed batch" into
    "a batch this learner can train on". Dtypes are normalised to numpy names on construction so
    ``np.float32`` and ``"float32"`` are interchangeable.
    """

    obs_shape: tuple[int, ...]  # () for records
    obs_dtype: str  # e.g. "float32", "uint8"; "record" for a Dict observation (obs_entries)
    action_shape: tuple[int, ...]  # () for discrete
    action_dtype: str  # "int64" discrete, "float32" continuous
    num_actions: int | None = None  # discrete: valid actions are 0..num_actions-1
    max_batch: int = 65536
    # Continuous only: inclusive per-element bounds (a scalar, or anything of action_shape; stored
    # flattened as floats, +-inf allowed), checked within ACTION_BOUND_TOLERANCE. None: only finite.
    action_low: float | tuple[float, ...] | None = None
    action_high: float | tuple[float, ...] | None = None
    # Observations: inclusive per-component bounds as the env declares them (a scalar, or anything
    # of obs_shape; stored flattened, or as one float when every component shares it; +-inf
    # allowed). None: no declared bounds. Every bound beyond max_abs_obs counts as max_abs_obs.
    obs_low: float | tuple[float, ...] | None = None
    obs_high: float | tuple[float, ...] | None = None
    max_abs_obs: float = DEFAULT_MAX_ABS_OBS  # |obs| limit where the declared bounds say nothing
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD  # |reward| limit of a transition as sent
    max_discount: float = 1.0  # a transition's discount is gamma ** k (k >= 1) or 0: at most gamma
    # On-policy runs: every message is a RolloutBatch of exactly this many steps per row (and plain
    # transitions are refused); None: transitions only (and rollouts are refused).
    rollout_length: int | None = None
    # Recurrent on-policy runs: each rollout row carries its LSTM start state, (2, core_size) float32
    # (h, c); 0: rows carry none (and a state is refused). |c| at most max_abs_core_cell (see
    # DEFAULT_MAX_ABS_CORE_CELL), |h| at most 1.
    core_size: int = 0
    max_abs_core_cell: float = DEFAULT_MAX_ABS_CORE_CELL
    # Masked runs (an env whose Dict observation has an ``action_mask``, see zmqrl.envs.action_masks):
    # each observation row is a flat vector whose last num_actions components are its state's legal
    # actions (1 legal, 0 not), or, with obs_entries, a record whose field ``action_mask`` holds them.
    # The rows carry them, so the wire, replay and snapshots need no column of their own; the
    # decoder checks them (transport/mask_checks.py) and the agents obey them.
    action_mask: bool = False
    # Recurrent replay runs (R2D2): every message is a SequenceBatch of windows of exactly this many
    # positions (burn-in included), each with a core state of core_size units; None: no sequences.
    sequence_length: int | None = None
    burn_in: int = 0  # the positions of a window that only warm the core (SequenceBatch.mask 1)
    # Dict observation runs (zmqrl.types): one entry per key, in order; each observation is a
    # record of them (obs_shape (), obs_dtype "record"), each key's values checked against the
    # entry's bounds. (): plain observations of obs_shape and obs_dtype.
    obs_entries: tuple[ObsEntry, ...] = ()
    # Derived from the fields above on construction (see obs_limits); not part of equality.
    _obs_limits: tuple[np.ndarray, np.ndarray] | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _entry_limits: dict[str, tuple[np.ndarray, np.ndarray] | None] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _obs_np_dtype: np.dtype[Any] = field(init=False, repr=False, compare=False, default=np.dtype("uint8"))

    def __post_init__(self) -> None:
        self._check_entries()
        for name in ("obs_dtype", "action_dtype"):
            if name == "obs_dtype" and self.obs_entries:
                continue  # "record", checked with the entries
            dtype = np.dtype(getattr(self, name)).name
            if dtype not in ALLOWED_DTYPES:
                raise ValueError(f"SampleSpec.{name} {dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
            object.__setattr__(self, name, dtype)
        for name in ("obs_shape", "action_shape"):
            shape = tuple(int(d) for d in getattr(self, name))
            if any(d < 0 for d in shape) or len(shape) + 1 > MAX_NDIM:
                raise ValueError(f"SampleSpec.{name} {shape} is not a valid shape")
            object.__setattr__(self, name, shape)
        if self.num_actions is not None and int(self.num_actions) < 1:
            raise ValueError(f"SampleSpec.num_actions must be >= 1, got {self.num_actions}")
        if int(self.max_batch) < 1:
            raise ValueError(f"SampleSpec.max_batch must be >= 1, got {self.max_batch}")
        carried = self.rollout_length is not None or self.sequence_length is not None
        if not 0 <= int(self.core_size) <= MAX_CORE_SIZE or (self.core_size and not carried):
            raise ValueError(
                f"SampleSpec.core_size must be 0 to {MAX_CORE_SIZE} (0 without rollouts): {self.core_size}"
            )
        if self.sequence_length is not None and not (
            self.rollout_length is None and self.core_size and 0 <= self.burn_in < self.sequence_length
        ):
            raise ValueError(
                f"SampleSpec.sequence_length {self.sequence_length} needs no rollout_length, a core_size "
                f"and 0 <= burn_in {self.burn_in} < it"
            )
        for name in ("max_abs_obs", "max_abs_reward", "max_abs_core_cell"):
            limit = float(getattr(self, name))
            if not (math.isfinite(limit) and limit > 0):
                raise ValueError(f"SampleSpec.{name} must be finite and > 0, got {limit}")
            object.__setattr__(self, name, limit)
        if self.rollout_length is not None and int(self.rollout_length) < 1:
            raise ValueError(f"SampleSpec.rollout_length must be >= 1 or None, got {self.rollout_length}")
        if not 0.0 <= float(self.max_discount) <= 1.0:
            raise ValueError(f"SampleSpec.max_discount must be in [0, 1], got {self.max_discount}")
        object.__setattr__(self, "max_discount", float(self.max_discount))
        if self.action_mask:
            if self.obs_entries:
                self._check_mask_entry()
            elif self.num_actions is None or len(self.obs_shape) != 1 or self.obs_shape[0] < self.num_actions:
                raise ValueError(
                    "SampleSpec.action_mask needs Discrete actions and flat observations that end with their "
                    f"mask, got obs_shape {self.obs_shape}, num_actions {self.num_actions}"
                )
            object.__setattr__(self, "action_mask", True)
        self._normalise_bounds()
        dtype = record_dtype(self.obs_entries) if self.obs_entries else np.dtype(self.obs_dtype)
        object.__setattr__(self, "_obs_np_dtype", dtype)
        if self.obs_entries:
            self._normalise_entry_bounds()
        else:
            self._normalise_obs_bounds()

    def _check_entries(self) -> None:
        """A Dict observation's entries: named keys (unique, at most MAX_KEYS) of allowed dtypes
        and valid shapes, the spec's own obs_shape () and obs_dtype "record" (and back: "record"
        only with entries)."""
        entries = tuple(self.obs_entries)
        if not entries:
            if self.obs_dtype == RECORD:
                raise ValueError("SampleSpec.obs_dtype 'record' needs obs_entries")
            return
        if len(entries) > MAX_KEYS or len({e.key for e in entries}) != len(entries):
            raise ValueError(f"SampleSpec.obs_entries must be 1 to {MAX_KEYS} entries with distinct keys")
        if tuple(self.obs_shape) != () or self.obs_dtype != RECORD or self.obs_low is not None:
            raise ValueError(
                "SampleSpec with obs_entries takes obs_shape (), obs_dtype 'record' and no obs_low/obs_high"
            )
        checked = []
        for e in entries:
            check_key(e.key)
            dtype = np.dtype(e.dtype).name
            shape = tuple(int(d) for d in e.shape)
            if dtype not in ALLOWED_DTYPES or any(d < 1 for d in shape) or len(shape) + 3 > MAX_NDIM:
                raise ValueError(
                    f"SampleSpec.obs_entries key {e.key!r}: {dtype} {list(shape)} is not a valid entry"
                )
            checked.append(ObsEntry(e.key, shape, dtype, e.low, e.high))
        object.__setattr__(self, "obs_entries", tuple(checked))

    def _check_mask_entry(self) -> None:
        """A masked run of records: its legal actions are the entry ``action_mask``, one flag per
        Discrete action, declared within [0, 1] (what the decoder and the agents read by name)."""
        entry = next((e for e in self.obs_entries if e.key == ACTION_MASK_KEY), None)
        if (
            self.num_actions is None
            or entry is None
            or entry.shape != (self.num_actions,)
            or entry.low is None
            or entry.high is None
            or not (np.asarray(entry.low) == 0).all()
            or not (np.asarray(entry.high) == 1).all()
        ):
            raise ValueError(
                f"SampleSpec.action_mask with obs_entries needs Discrete actions and an entry "
                f"{ACTION_MASK_KEY!r} of shape (num_actions,) with bounds [0, 1], got num_actions "
                f"{self.num_actions} and {entry}"
            )

    @property
    def obs_np_dtype(self) -> np.dtype[Any]:
        """The numpy dtype observation arrays have: the record's for a Dict observation."""
        return self._obs_np_dtype

    @property
    def obs_bytes(self) -> int:
        """Bytes of one observation row (what decides zero-copy receives, group sizes, memory)."""
        return int(np.prod(self.obs_shape, dtype=np.int64)) * self.obs_np_dtype.itemsize

    def entry_limits(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        """What :meth:`obs_limits` is for a plain observation, for one key of a Dict observation."""
        return self._entry_limits[key]

    def _normalise_entry_bounds(self) -> None:
        entries = []
        for e in self.obs_entries:
            low, high, limits = _bounds(
                e.shape, e.dtype, e.low, e.high, self.max_abs_obs, f"obs_entries[{e.key!r}]"
            )
            entries.append(ObsEntry(e.key, e.shape, e.dtype, low, high))
            self._entry_limits[e.key] = limits
        object.__setattr__(self, "obs_entries", tuple(entries))

    def obs_limits(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The bounds every observation component is checked against: ``(low, high)`` in the
        observations' dtype, each of one element (the same for every component) or flattened over
        obs_shape.

        The declared bounds, each limited to ``+-max_abs_obs`` (an infinite or float32-max bound
        says nothing). None when nothing needs checking: integer observations whose limits are
        their dtype's own (Atari's 0..255 frames).
        """
        return self._obs_limits

    def _normalise_obs_bounds(self) -> None:
        """Store declared observation bounds flat (or as one float), and derive ``obs_limits``."""
        low, high, limits = _bounds(
            self.obs_shape, self.obs_dtype, self.obs_low, self.obs_high, self.max_abs_obs, "obs"
        )
        object.__setattr__(self, "obs_low", low)
        object.__setattr__(self, "obs_high", high)
        object.__setattr__(self, "_obs_limits", limits)

    def _normalise_bounds(self) -> None:
        """Broadcast the bounds to ``action_shape`` and store them as flat float tuples, so the spec
        stays hashable and comparable and a scalar bound means the same for every dimension."""
        if self.action_low is None and self.action_high is None:
            return
        if self.action_low is None or self.action_high is None:
            raise ValueError("SampleSpec.action_low and action_high must be given together")
        if self.num_actions is not None or np.dtype(self.action_dtype).kind != "f":
            raise ValueError("SampleSpec action bounds apply to continuous (float) actions only")
        flat = []
        for name in ("action_low", "action_high"):
            try:
                arr = np.broadcast_to(np.asarray(getattr(self, name), dtype=np.float64), self.action_shape)
            except ValueError:
                raise ValueError(f"SampleSpec.{name} does not fit action_shape {self.action_shape}") from None
            if np.isnan(arr).any():
                raise ValueError(f"SampleSpec.{name} contains NaN")
            flat.append(arr.reshape(-1))
        if not (flat[0] <= flat[1]).all():
            raise ValueError("SampleSpec.action_low must be <= action_high in every dimension")
        object.__setattr__(self, "action_low", tuple(float(x) for x in flat[0]))
        object.__setattr__(self, "action_high", tuple(float(x) for x in flat[1]))


# The on-policy learner's sizes, shared by the config's checks and the rollout queue
# (zmqrl.replay.rollout_queue), which is where they matter.

# The queue's size when learner.queue_steps is not set: this many batches.
DEFAULT_QUEUE_BATCHES = 2


def queue_rows(batch_size: int, rollout_length: int, queue_steps: int | None) -> tuple[int, int]:
    """``(batch rows, queue rows)`` for a batch of ``batch_size`` env steps, rollouts of
    ``rollout_length`` steps and a queue of ``queue_steps`` (None: DEFAULT_QUEUE_BATCHES batches).
    ValueError when the batch is not whole rollouts, or the queue holds less than a batch."""
    if batch_size % rollout_length:
        raise ValueError(
            f"agent.batch_size {batch_size} must be a multiple of actor.rollout_length {rollout_length}"
            " (a batch is whole rollouts)"
        )
    batch_rows = batch_size // rollout_length
    steps = DEFAULT_QUEUE_BATCHES * batch_size if queue_steps is None else queue_steps
    if steps < batch_size:
        raise ValueError(
            f"learner.queue_steps {steps} must be at least agent.batch_size {batch_size} (one batch)"
        )
    return batch_rows, steps // rollout_length


def message_rows(batch_rows: int, capacity_rows: int) -> int:
    """The most rollouts one message may carry so that it always fits once the trainer has taken
    what it can (see the module docstring): what the run's spec allows (``max_batch``)."""
    return capacity_rows - batch_rows + 1


def rollout_message_problem(spec: SampleSpec, rows: int, length: int, max_message_mb: int) -> str | None:
    """Why an actor's rollouts of ``rows`` envs x ``length`` steps would not fit one message of
    ``transport.max_message_mb`` (its observation frame alone holds rows x (length + 1)
    observations, and a larger message is dropped unread), or None."""
    obs_frame = rows * (length + 1) * spec.obs_bytes
    if obs_frame <= max_message_mb * 2**20:
        return None
    return (
        f"a rollouts message of actor.envs_per_actor {rows} x (actor.rollout_length {length} + 1) "
        f"observations is {obs_frame / 2**20:.0f} MiB, more than transport.max_message_mb "
        f"{max_message_mb}: every one would be dropped; lower actor.rollout_length or "
        f"actor.envs_per_actor, or raise transport.max_message_mb"
    )


Bound = float | tuple[float, ...] | None


def _bounds(
    shape: tuple[int, ...], dtype_name: str, low_given: Bound, high_given: Bound, cap: float, what: str
) -> tuple[Bound, Bound, tuple[np.ndarray, np.ndarray] | None]:
    """Declared bounds of observations of ``shape`` and ``dtype_name`` as the spec stores them
    (flat, or one float when every component shares it; None when none are declared), and the
    limits every component is checked against (see ``SampleSpec.obs_limits``). ``what`` names the
    field in errors ("obs" -> ``SampleSpec.obs_low``)."""
    if (low_given is None) != (high_given is None):
        raise ValueError(f"SampleSpec.{what}_low and {what}_high must be given together")
    stored: list[Bound] = [None, None]
    if low_given is None:
        low, high = np.array([-cap]), np.array([cap])
    else:
        flat = []
        for i, (side, given_value) in enumerate((("low", low_given), ("high", high_given))):
            given = np.asarray(given_value, dtype=np.float64)
            if given.size == math.prod(shape) and given.ndim <= 1:
                given = given.reshape(shape)  # stored flat, as the spec keeps it
            try:
                arr = np.broadcast_to(given, shape)
            except ValueError:
                raise ValueError(f"SampleSpec.{what}_{side} does not fit shape {shape}") from None
            if np.isnan(arr).any():
                raise ValueError(f"SampleSpec.{what}_{side} contains NaN")
            arr = arr.reshape(-1)
            uniform = arr.size > 0 and bool((arr == arr[0]).all())
            stored[i] = float(arr[0]) if uniform else tuple(float(x) for x in arr)
            flat.append(arr[:1] if uniform else arr)
        if flat[0].size != flat[1].size:  # one side uniform, the other not
            flat = [np.broadcast_to(a, (int(np.prod(shape)),)) for a in flat]
        if not (flat[0] <= flat[1]).all():
            raise ValueError(f"SampleSpec.{what}_low must be <= {what}_high in every component")
        if (flat[0] > cap).any() or (flat[1] < -cap).any():
            raise ConfigError(
                f"the env declares observations beyond +-{cap:g} (transport.max_abs_obs), which "
                f"would refuse every one of them: raise transport.max_abs_obs above "
                f"{float(max(flat[0].max(), -flat[1].min())):g}"
            )
        low, high = np.maximum(flat[0], -cap), np.minimum(flat[1], cap)  # a bound beyond: the cap
    dtype = np.dtype(dtype_name)
    if dtype.kind == "b":
        return stored[0], stored[1], None  # bool bytes are checked as such
    # In the observations' own dtype (a float32 bound is a float32 value): comparing float32
    # rows with float64 bounds costs a cast of every element, per received batch. Rounded
    # outwards, so the cast never refuses a value the declared bound allows.
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if (low <= info.min).all() and (high >= info.max).all():
            return stored[0], stored[1], None  # the dtype is the bound
        low = np.clip(np.ceil(low), info.min, info.max).astype(dtype)
        high = np.clip(np.floor(high), info.min, info.max).astype(dtype)
    else:
        # A simulator's own rounding may put a value a few ulps past the bound it clips to.
        low = low - OBS_BOUND_TOLERANCE * np.maximum(1.0, np.abs(low))
        high = high + OBS_BOUND_TOLERANCE * np.maximum(1.0, np.abs(high))
        low_cast, high_cast = low.astype(dtype), high.astype(dtype)
        low = np.where(low_cast > low, np.nextafter(low_cast, dtype.type(-np.inf)), low_cast)
        high = np.where(high_cast < high, np.nextafter(high_cast, dtype.type(np.inf)), high_cast)
    return stored[0], stored[1], (low, high)
