"""Torch-free acting: the DQN (MLP or MinAtar CNN torso) and SAC policies in numpy, for actors and evaluators.

An actor only runs forward passes of a small network, one observation (or one row per sub-env) at
a time; for that numpy is as fast as torch (faster: no per-op dispatch) and the process starts
without importing torch at all. Each policy imports weights in exactly the layout its torch agent
exports (``DQNAgent`` / ``SACAgent``: the same parameter names and shapes, so the wire check
against ``weights_spec`` is the same) and acts with the same rules and the same RNG draws: with
the same seed and weights, ``act`` gives the same actions as the torch agent's.

Initial weights (before the first publish) are drawn from torch's default distribution with a
numpy generator; they are not the torch agent's initial values, only as random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.torsos import CONV_TORSOS, conv_features, fan_in
from zmqrl.types import TransitionBatch, Weights

# Bounds of the SAC policy's log standard deviation (see zmqrl.agents.sac, which uses these).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
# Stream of the seed's generator that draws initial weights, apart from the acting RNG's stream.
INIT_STREAM = 1


class VersionedArrays:
    """Named float32 parameters with the sync-model rules of ``zmqrl.agents.sync``: an import
    applies only a strictly newer version, after every name and shape was checked."""

    def __init__(self, layout: dict[str, tuple[int, ...]], seed: int | None) -> None:
        rng = np.random.default_rng(None if seed is None else [seed, INIT_STREAM])
        self.arrays: dict[str, np.ndarray] = {}
        for name, shape in layout.items():
            # A bias has its weight's fan-in (a Linear's in_features, a Conv2d's C * k * k).
            inputs = fan_in(shape if name.endswith(".weight") else layout[name.replace(".bias", ".weight")])
            bound = 1.0 / math.sqrt(inputs) if inputs > 0 else 0.0
            self.arrays[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
        self.version = 0  # 0: initial, never imported

    def spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {name: (array.shape, "float32") for name, array in self.arrays.items()}

    def load(self, weights: Weights) -> bool:
        if weights.version <= self.version:
            return False
        sources = {name: imported_array(weights, name, array.shape) for name, array in self.arrays.items()}
        for name in weights.arrays:
            if name not in self.arrays:
                raise ValueError(f"import_weights: unexpected parameter {name!r}")
        # Copied (wire buffers are read-only and may be reused by the next receive) into the arrays
        # already held, in place: no allocation per import. Every source was checked above, and a
        # copy of numbers into float32 cannot fail, so a bad snapshot changes nothing.
        for name, array in self.arrays.items():
            np.copyto(array, sources[name], casting="unsafe")
        self.version = int(weights.version)
        return True


def imported_array(weights: Weights, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """``weights``' parameter ``name`` as an array, checked to be numbers of ``shape``, so that the
    in-place copies of an import cannot fail half-way; ValueError names what is wrong."""
    if name not in weights.arrays:
        raise ValueError(f"import_weights: missing parameter {name!r}")
    source = np.asarray(weights.arrays[name])
    if source.shape != shape:
        raise ValueError(f"import_weights: {name!r} has shape {source.shape}, expected {shape}")
    if source.dtype.kind not in "biuf":
        raise ValueError(f"import_weights: {name!r} is {source.dtype}, not real numbers")
    return source


def mlp_layout(prefix: str, in_dim: int, hidden: Sequence[int]) -> tuple[dict[str, tuple[int, ...]], int]:
    """Names and shapes of ``nn.Sequential(Linear, ReLU, ...)`` as torch's state_dict lists them
    (``torso.0.weight``, ``torso.0.bias``, ``torso.2.weight``, ...), and the output width."""
    layout: dict[str, tuple[int, ...]] = {}
    width = in_dim
    for i, size in enumerate(hidden):
        layout[f"{prefix}.{2 * i}.weight"] = (size, width)
        layout[f"{prefix}.{2 * i}.bias"] = (size,)
        width = size
    return layout, width


def relu_torso(obs: np.ndarray, arrays: dict[str, np.ndarray], prefix: str, depth: int) -> np.ndarray:
    """Forward pass of ``depth`` Linear -> ReLU layers on observations ``(B, ...)``, flattened and
    cast to float32 as the torch networks do."""
    x = obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)
    for i in range(depth):
        x = x @ arrays[f"{prefix}.{2 * i}.weight"].T + arrays[f"{prefix}.{2 * i}.bias"]
        np.maximum(x, 0.0, out=x)
    return x


def linear(x: np.ndarray, arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ arrays[f"{name}.weight"].T + arrays[f"{name}.bias"]


# DQN torsos whose acting runs in numpy: the MLP, and the CNNs whose tables say it is cheap.
NUMPY_DQN_TORSOS = ("mlp", *(name for name, torso in CONV_TORSOS.items() if torso.numpy_acting))


def dqn_layout(config: DQNConfig, obs_shape: tuple[int, ...], n_actions: int) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of ``QNetwork`` (torso, then the plain or dueling heads)."""
    if config.torso == "mlp":
        layout, width = mlp_layout("torso", math.prod(obs_shape), config.hidden_sizes)
    else:
        torso = CONV_TORSOS[config.torso]
        layout, width = torso.layout("torso", obs_shape), torso.hidden
    heads = {"value": 1, "advantage": n_actions} if config.dueling else {"head": n_actions}
    for name, out in heads.items():
        layout[f"{name}.weight"] = (out, width)
        layout[f"{name}.bias"] = (out,)
    return layout


def dqn_q_values(config: DQNConfig, arrays: dict[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
    """``QNetwork``'s action values ``(B, n_actions)`` in numpy, from weights named as it names them.

    Shared by NumpyDQNPolicy and DQNAgent's CPU acting (on views of its tensors), so both run one
    copy of the forward code.
    """
    if config.torso == "mlp":
        x = relu_torso(obs, arrays, "torso", len(config.hidden_sizes))
    else:
        x = conv_features(obs, arrays, "torso", CONV_TORSOS[config.torso])
    if not config.dueling:
        return linear(x, arrays, "head")
    value, advantage = linear(x, arrays, "value"), linear(x, arrays, "advantage")
    return value + advantage - advantage.mean(axis=1, keepdims=True)


def explores(epsilon: float | np.ndarray) -> bool:
    # np.any costs ~1 µs per call: keep the scalar test for the single-env actor's hot path.
    return epsilon > 0.0 if isinstance(epsilon, float) else bool(np.any(epsilon > 0.0))


def epsilon_greedy(
    rng: np.random.Generator,
    epsilon: float | np.ndarray,
    obs: np.ndarray,
    n_actions: int,
    greedy: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """DQN's acting rule, shared by DQNAgent and NumpyDQNPolicy (same draws from ``rng``, in the
    same order): each row explores independently with probability ``epsilon``, and when every
    row explores ``greedy`` is not called."""
    explore_rows = rng.random(obs.shape[0]) < epsilon
    n_random = int(np.count_nonzero(explore_rows))
    if n_random == obs.shape[0]:
        return rng.integers(n_actions, size=n_random, dtype=np.int64)
    actions = greedy(obs)
    if n_random:
        actions[explore_rows] = rng.integers(n_actions, size=n_random, dtype=np.int64)
    return actions


class SquashedActions:
    """SAC's acting rule onto ``[low, high]``, shared by SACAgent and NumpySACPolicy (same draws,
    same order): ``explore`` samples the tanh-squashed Gaussian, except that each row is a
    uniformly random action with probability ``epsilon``; greedy is ``tanh(mean)``."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low, self.high = low, high
        self.scale = (high - low) / 2.0
        self.shift = (high + low) / 2.0

    def __call__(
        self,
        rng: np.random.Generator,
        epsilon: float | np.ndarray,
        obs: np.ndarray,
        explore: bool,
        outputs: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    ) -> np.ndarray:
        n = obs.shape[0]
        n_random = 0
        if explore and explores(epsilon):
            random_rows = rng.random(n) < epsilon
            n_random = int(np.count_nonzero(random_rows))
            if n_random == n:  # the network is not evaluated
                return self.uniform(rng, n)
        mean, log_std = outputs(obs)
        if explore:
            noise = rng.standard_normal(mean.shape, dtype=np.float32)
            squashed = np.tanh(mean + np.exp(log_std) * noise)
        else:
            squashed = np.tanh(mean)
        # Clip: the affine map may round one ulp past a bound the env checks.
        actions = np.clip(squashed * self.scale + self.shift, self.low, self.high)
        if n_random:
            actions[random_rows] = self.uniform(rng, n_random)
        return actions

    def uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, size=(n, self.low.shape[0])).astype(np.float32)


class ImportedWeights:
    """The receiving half of the sync-model contract, for a policy whose weights are the
    ``VersionedArrays`` in ``self._params``."""

    _params: VersionedArrays

    @property
    def weights_version(self) -> int:
        return self._params.version

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return self._params.spec()

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The weights acted with now, by parameter name (read-only use)."""
        return self._params.arrays

    def import_weights(self, weights: Weights) -> bool:
        return self._params.load(weights)


class NumpyDQNPolicy(ImportedWeights):
    """DQN's acting side for the MLP or MinAtar CNN torso (plain or dueling heads): epsilon-greedy
    on numpy Q-values.

    ``initial_priorities`` are the Ape-X ones ``DQNAgent`` computes on an actor, whose target
    network always equals its online one (both are overwritten by every import).
    """

    def __init__(
        self,
        config: DQNConfig,
        obs_shape: tuple[int, ...],
        n_actions: int,
        *,
        epsilon: float | np.ndarray = 0.0,
        seed: int | None = None,
    ) -> None:
        config.check()
        if config.torso not in NUMPY_DQN_TORSOS:
            raise ValueError(
                f"NumpyDQNPolicy runs the {', '.join(NUMPY_DQN_TORSOS)} torsos only, not {config.torso!r}"
            )
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        self.config = config
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.dueling = config.dueling
        self._params = VersionedArrays(dqn_layout(config, self.obs_shape, n_actions), seed)
        self.rng = np.random.default_rng(seed)  # acting draws, in DQNAgent's order
        self.epsilon: float | np.ndarray = epsilon

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Action values ``(B, n_actions)`` float32 for obs ``(B, *obs_shape)``."""
        return dqn_q_values(self.config, self._params.arrays, obs)

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Epsilon-greedy (``explore=True``) or greedy int64 actions ``(B,)``; each row explores
        independently, and when every row explores the network is not evaluated."""
        if explore and explores(self.epsilon):
            return epsilon_greedy(self.rng, self.epsilon, obs, self.n_actions, self._greedy)
        return self._greedy(obs)

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=1).astype(np.int64, copy=False)

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray:
        """``|reward + discount * max_a Q(next_obs, a) - Q(obs, action)|`` per row, float32: one
        forward pass over ``obs`` and ``next_obs`` together (the target net is the online net)."""
        n = batch.size
        q_both = self.q_values(np.concatenate([batch.obs, batch.next_obs]))
        q_taken = q_both[np.arange(n), batch.action]
        td_target = batch.reward + batch.discount * q_both[n:].max(axis=1)
        return np.abs(td_target - q_taken).astype(np.float32, copy=False)


def squashed_action_bounds(
    low: np.ndarray | None, high: np.ndarray | None, act_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Float32 ``(act_dim,)`` bounds (None: -1 / +1), checked finite and ordered: the policy's tanh
    output is mapped affinely onto them, which an infinite or empty interval would make meaningless."""
    bounds = []
    for name, value, default in (("action_low", low, -1.0), ("action_high", high, 1.0)):
        array = np.full(act_dim, default, np.float32) if value is None else np.asarray(value, np.float32)
        if array.shape != (act_dim,):
            raise ValueError(f"{name} must have shape ({act_dim},), got {array.shape}")
        if not np.all(np.isfinite(array)):
            raise ValueError(
                f"{name} must be finite for SAC (the tanh policy is rescaled onto it), got {array}"
            )
        bounds.append(array)
    if not np.all(bounds[0] < bounds[1]):
        raise ValueError(
            f"action_low must be < action_high in every dimension, got {bounds[0]} and {bounds[1]}"
        )
    return bounds[0], bounds[1]


class NumpySACPolicy(ImportedWeights):
    """SAC's acting side: the tanh-squashed Gaussian policy MLP, rescaled onto the action bounds.

    ``explore=False`` acts ``tanh(mean)``; ``explore=True`` samples the squashed Gaussian, each row
    a uniformly random action instead with probability ``epsilon`` (the actors' warm-up).
    """

    def __init__(
        self,
        config: SACConfig,
        obs_shape: tuple[int, ...],
        act_dim: int,
        *,
        action_low: np.ndarray | None = None,
        action_high: np.ndarray | None = None,
        epsilon: float | np.ndarray = 0.0,
        seed: int | None = None,
    ) -> None:
        config.check()
        if act_dim < 1:
            raise ValueError(f"act_dim must be >= 1, got {act_dim}")
        self.obs_shape = tuple(obs_shape)
        self.act_dim = act_dim
        self.action_low, self.action_high = squashed_action_bounds(action_low, action_high, act_dim)
        self._actions = SquashedActions(self.action_low, self.action_high)
        self._depth = len(config.hidden_sizes)
        layout, width = mlp_layout("torso", math.prod(self.obs_shape), config.hidden_sizes)
        for name in ("mean", "log_std"):
            layout[f"{name}.weight"] = (act_dim, width)
            layout[f"{name}.bias"] = (act_dim,)
        self._params = VersionedArrays(layout, seed)
        self.rng = np.random.default_rng(seed)  # acting draws, in SACAgent's order
        self.epsilon: float | np.ndarray = epsilon

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, clamped log_std)`` of the pre-tanh Gaussian, each ``(B, act_dim)`` float32."""
        arrays = self._params.arrays
        x = relu_torso(obs, arrays, "torso", self._depth)
        log_std = np.clip(linear(x, arrays, "log_std"), LOG_STD_MIN, LOG_STD_MAX)
        return linear(x, arrays, "mean"), log_std

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Float32 actions ``(B, act_dim)`` in ``[low, high]`` (see SquashedActions)."""
        return self._actions(self.rng, self.epsilon, obs, explore, self.policy_outputs)

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """None: the policy holds no critic, which a TD error needs."""
        return None
