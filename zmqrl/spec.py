"""What a run's samples look like (observation and action shapes, dtypes, bounds): a domain type.

The learner builds it from the env's spaces; the wire decoders check batches against it, replay
sizes its columns by it and agents size their networks by it. It lives outside the transport layer
because none of those users are about transport.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# numpy dtype names an array frame may carry. Deliberately small: each is fixed-size, has one
# unambiguous byte layout in every language, and covers observations, actions and parameters.
ALLOWED_DTYPES: frozenset[str] = frozenset({"float32", "float64", "int32", "int64", "uint8", "bool"})

# Most dimensions one array may have (a batch adds one to a spec's shapes).
MAX_NDIM = 8


@dataclass(frozen=True)
class SampleSpec:
    """What a run's samples must look like; built by the learner from the env's spaces.

    Structural decoding cannot know the env, so this is what turns "a well-formed batch" into
    "a batch this learner can train on". Dtypes are normalised to numpy names on construction so
    ``np.float32`` and ``"float32"`` are interchangeable.
    """

    obs_shape: tuple[int, ...]
    obs_dtype: str  # e.g. "float32", "uint8"
    action_shape: tuple[int, ...]  # () for discrete
    action_dtype: str  # "int64" discrete, "float32" continuous
    num_actions: int | None = None  # discrete: valid actions are 0..num_actions-1
    max_batch: int = 65536
    # Continuous only: inclusive per-element bounds (a scalar, or anything of action_shape; stored
    # flattened as floats, +-inf allowed), checked within ACTION_BOUND_TOLERANCE. None: only finite.
    action_low: float | tuple[float, ...] | None = None
    action_high: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("obs_dtype", "action_dtype"):
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
        self._normalise_bounds()

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
