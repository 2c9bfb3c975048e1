"""Torch-free acting: the DQN (MLP or MinAtar CNN torso) and SAC policies in numpy, for actors and evaluators.

An actor only runs forward passes of a small network, one observation (or one row per sub-env) at
a time; for that numpy is as fast as torch (faster: no per-op dispatch) and the process starts
without importing torch at all. Each policy imports weights in exactly the layout its torch agent
exports (``DQNAgent`` / ``SACAgent``: the same parameter names and shapes) and acts with the
same rules and the same RNG draws: with the same seed and weights, ``act`` gives the same actions
as the torch agent's. Epsilon exploration is not a policy's: the actor's explorer
(``zmqrl.actor.exploration``) replaces rows by random actions around any policy.

Initial weights (before the first publish) are drawn from torch's default distribution with a
numpy generator; they are not the torch agent's initial values, only as random.

The torch agents' side of the same weights lives here too, because it is the same layout and the
same code: :class:`PublishedModule` exports and loads the one network an agent publishes as named
float32 arrays, checked as the numpy policies check them (which snapshot is newer is the weights
client's business, ``zmqrl.transport.weights_channel``), and :func:`parameter_views` lets a torch
agent on the CPU act through this module's forward functions. For one observation (or one row per
sub-env), torch's per-op dispatch and module-call overhead dwarf a small MLP's arithmetic
(docs/performance.md, "Figures behind the agents' code"); on numpy views of its parameters the
agent gives the same numbers as the numpy policy and keeps a single copy of that code.
Those two import torch only when called (a torch agent has it loaded already), so an actor
importing this module still never loads torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from zmqrl.agents.colored_noise import ColoredNoise
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.keyed import obs_fields
from zmqrl.agents.layers import ActingNet, dqn_net, dueling_q, sac_policy_net
from zmqrl.agents.masks import mask_numpy
from zmqrl.agents.torsos import CONV_TORSOS, fan_in
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

if TYPE_CHECKING:
    import torch
    from torch import nn

# Bounds of the SAC policy's log standard deviation (see zmqrl.agents.sac, which uses these).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
# Stream of the seed's generator that draws initial weights, apart from the acting RNG's stream.
INIT_STREAM = 1


class NamedArrays:
    """Named float32 parameters, loaded in place after every name and shape was checked."""

    def __init__(self, layout: dict[str, tuple[int, ...]], seed: int | None) -> None:
        rng = np.random.default_rng(None if seed is None else [seed, INIT_STREAM])
        self.arrays: dict[str, np.ndarray] = {}
        for name, shape in layout.items():
            # A bias has its weight's fan-in (a Linear's in_features, a Conv2d's C * k * k).
            inputs = fan_in(shape if name.endswith(".weight") else layout[name.replace(".bias", ".weight")])
            bound = 1.0 / math.sqrt(inputs) if inputs > 0 else 0.0
            self.arrays[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        sources = {name: imported_array(arrays, name, array.shape) for name, array in self.arrays.items()}
        for name in arrays:
            if name not in self.arrays:
                raise ValueError(f"load_weights: unexpected parameter {name!r}")
        # Copied (wire buffers are read-only and may be reused by the next receive) into the arrays
        # already held, in place: no allocation per load. Every source was checked above, and a
        # copy of numbers into float32 cannot fail, so a bad snapshot changes nothing.
        for name, array in self.arrays.items():
            np.copyto(array, sources[name], casting="unsafe")


def imported_array(arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Parameter ``name`` of ``arrays``, checked to be float32 of ``shape``, so that the in-place
    copies of a load cannot fail half-way; ValueError names what is wrong."""
    if name not in arrays:
        raise ValueError(f"load_weights: missing parameter {name!r}")
    source = np.asarray(arrays[name])
    if source.shape != shape:
        raise ValueError(f"load_weights: {name!r} has shape {source.shape}, expected {shape}")
    if source.dtype != np.float32:  # what the learner publishes; anything else is not its weights
        raise ValueError(f"load_weights: {name!r} is {source.dtype}, not float32")
    return source


# DQN torsos whose acting runs in numpy: the MLP, and the CNNs whose tables say it is cheap.
NUMPY_DQN_TORSOS = ("mlp", *(name for name, torso in CONV_TORSOS.items() if torso.numpy_acting))


def dqn_q_values(
    net: ActingNet, arrays: Mapping[str, np.ndarray], obs: np.ndarray, masked: bool = False
) -> np.ndarray:
    """``QNetwork``'s action values ``(B, n_actions)`` in numpy, from its table (``dqn_net``) and
    weights named as it names them (``masked``: illegal actions' values are MASKED_VALUE).

    Shared by NumpyDQNPolicy and DQNAgent's CPU acting (on views of its tensors), so both run one
    copy of the forward code.
    """
    heads = net.forward(arrays, obs)
    q = heads["head"] if "head" in heads else dueling_q(heads["value"], heads["advantage"])
    return mask_numpy(q, obs) if masked else q


def sac_policy_outputs(
    net: ActingNet, arrays: Mapping[str, np.ndarray], obs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``SquashedGaussianPolicy``'s ``(mean, clamped log_std)`` in numpy, from its table
    (``sac_policy_net``): shared by NumpySACPolicy and SACAgent's CPU acting."""
    heads = net.forward(arrays, obs)
    return heads["mean"], np.clip(heads["log_std"], LOG_STD_MIN, LOG_STD_MAX)


class SquashedActions:
    """SAC's acting rule onto ``[low, high]``, shared by SACAgent and NumpySACPolicy (same draws,
    same order): ``explore`` samples the tanh-squashed Gaussian, its noise white or colored as
    ``config.noise_beta`` says (see zmqrl.agents.colored_noise); greedy is ``tanh(mean)``."""

    def __init__(self, low: np.ndarray, high: np.ndarray, config: SACConfig) -> None:
        self.low, self.high = low, high
        self.noise = ColoredNoise(config.noise_beta, config.noise_horizon)
        self.scale = (high - low) / 2.0
        self.shift = (high + low) / 2.0

    def __call__(
        self,
        rng: np.random.Generator,
        obs: np.ndarray,
        explore: bool,
        outputs: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    ) -> np.ndarray:
        mean, log_std = outputs(obs)
        if explore:
            noise = self.noise(rng, mean.shape)
            squashed = np.tanh(mean + np.exp(log_std) * noise)
        else:
            squashed = np.tanh(mean)
        # Clip: the affine map may round one ulp past a bound the env checks.
        return np.clip(squashed * self.scale + self.shift, self.low, self.high)


class LoadedArrays:
    """The acting half of the contract's weights, for a policy whose weights are the
    ``NamedArrays`` in ``self._params``."""

    _params: NamedArrays

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The weights acted with now, by parameter name (read-only use)."""
        return self._params.arrays

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._params.load(arrays)


class NumpyDQNPolicy(LoadedArrays):
    """DQN's acting side for the MLP or MinAtar CNN torso (plain or dueling heads): greedy on numpy
    Q-values (the actor's explorer adds epsilon-random rows).

    ``initial_priorities`` are the Ape-X ones ``DQNAgent`` computes on an actor, whose target
    network always equals its online one (both are overwritten by every load).
    """

    def __init__(self, config: DQNConfig, spec: SampleSpec, *, seed: int | None = None) -> None:
        config.check()
        if config.torso not in NUMPY_DQN_TORSOS:
            raise ValueError(
                f"NumpyDQNPolicy runs the {', '.join(NUMPY_DQN_TORSOS)} torsos only, not {config.torso!r}"
            )
        if spec.num_actions is None:
            raise ValueError("NumpyDQNPolicy needs a Discrete action space (spec.num_actions)")
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self.n_actions = spec.num_actions
        self.dueling = config.dueling
        self.masked = spec.action_mask  # greedy over each row's legal actions only
        self.net = dqn_net(
            config.torso, config.hidden_sizes, self.n_actions, config.dueling, obs_fields(spec)
        )
        self._params = NamedArrays(self.net.layout(self.obs_shape), seed)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Action values ``(B, n_actions)`` float32 for obs ``(B, *obs_shape)``."""
        return dqn_q_values(self.net, self._params.arrays, obs, self.masked)

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Greedy int64 actions ``(B,)``, whatever ``explore`` says: DQN explores only by the
        epsilon-random rows of the actor's explorer."""
        return self.q_values(obs).argmax(axis=1).astype(np.int64, copy=False)

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray:
        """``|reward + discount * max_a Q(next_obs, a) - Q(obs, action)|`` per row, float32: one
        forward pass over ``obs`` and ``next_obs`` together (the target net is the online net)."""
        n = batch.size
        q_both = self.q_values(np.concatenate([batch.obs, batch.next_obs]))
        q_taken = q_both[np.arange(n), batch.action]
        td_target = batch.reward + batch.discount * q_both[n:].max(axis=1)
        return np.abs(td_target - q_taken).astype(np.float32, copy=False)


def squashed_action_bounds(spec: SampleSpec) -> tuple[np.ndarray, np.ndarray]:
    """The spec's action bounds as float32 ``(act_dim,)`` arrays (none: -1 / +1), checked finite
    and ordered: the policy's tanh output is mapped affinely onto them, which an infinite or empty
    interval would make meaningless."""
    act_dim = math.prod(spec.action_shape)
    bounds = []
    for name, value, default in (
        ("action_low", spec.action_low, -1.0),
        ("action_high", spec.action_high, 1.0),
    ):
        array = np.full(act_dim, default, np.float32) if value is None else np.asarray(value, np.float32)
        array = np.broadcast_to(array, (act_dim,)).copy()
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


def sac_act_dim(spec: SampleSpec) -> int:
    """SAC's action dimensions: a 1-D Box's size (``check_sac`` refuses anything else)."""
    if spec.num_actions is not None or len(spec.action_shape) != 1 or spec.action_shape[0] < 1:
        raise ValueError(f"SAC needs a 1-D Box action space, got action_shape {spec.action_shape}")
    return spec.action_shape[0]


class NumpySACPolicy(LoadedArrays):
    """SAC's acting side: the tanh-squashed Gaussian policy MLP, rescaled onto the spec's action bounds.

    ``explore=False`` acts ``tanh(mean)``; ``explore=True`` samples the squashed Gaussian.
    """

    def __init__(self, config: SACConfig, spec: SampleSpec, *, seed: int | None = None) -> None:
        config.check()
        self.obs_shape = tuple(spec.obs_shape)
        self.act_dim = sac_act_dim(spec)
        self.action_low, self.action_high = squashed_action_bounds(spec)
        self._actions = SquashedActions(self.action_low, self.action_high, config)
        self.net = sac_policy_net(config.hidden_sizes, self.act_dim, obs_fields(spec))
        self._params = NamedArrays(self.net.layout(self.obs_shape), seed)
        self.rng = np.random.default_rng(seed)  # acting draws, in SACAgent's order

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, clamped log_std)`` of the pre-tanh Gaussian, each ``(B, act_dim)`` float32."""
        return sac_policy_outputs(self.net, self._params.arrays, obs)

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Float32 actions ``(B, act_dim)`` in ``[low, high]`` (see SquashedActions)."""
        return self._actions(self.rng, obs, explore, self.policy_outputs)


# The torch agents' side of the same weights (torch imported when called: see the docstring).


def parameter_views(module: nn.Module) -> dict[str, np.ndarray]:
    """``module``'s parameters by state-dict name (``torso.0.weight``, ...) as numpy arrays that
    share the tensors' memory.

    In-place changes (optimiser steps, ``copy_``, ``load_state_dict``) are seen at once; a
    parameter *replaced* by a new tensor (moving the module to another device,
    ``load_state_dict(assign=True)``) would not be: take the views once the network is final.
    """
    import torch

    params = dict(module.named_parameters())
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params.values()):
        raise ValueError("numpy views need float32 parameters on the CPU")
    return {name: p.detach().numpy() for name, p in params.items()}


class PublishedModule:
    """Export/load of ``module``'s parameters (its state dict) as float32 numpy arrays."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._targets: dict[str, tuple[torch.Tensor, np.ndarray | None]] | None = None  # see _storage

    def export(self) -> dict[str, np.ndarray]:
        """C-contiguous float32 copies of the parameters, by state-dict name."""
        return {
            name: np.array(t.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)
            for name, t in self.module.state_dict().items()
        }

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy ``arrays`` into the parameters after checking every name and shape; ValueError
        (and nothing changed) when one is missing, unexpected or misshapen."""
        import torch

        own = self._storage()
        sources = {name: imported_array(arrays, name, tuple(t.shape)) for name, (t, _) in own.items()}
        for name in arrays:
            if name not in own:
                raise ValueError(f"load_weights: unexpected parameter {name!r}")
        with torch.no_grad():
            for name, (tensor, view) in own.items():
                if view is not None:
                    # One pass, straight into the parameter's memory: a read-only or unaligned
                    # wire buffer is fine as a source, nothing of it is kept, and numbers checked
                    # above cannot fail to convert.
                    np.copyto(view, sources[name], casting="unsafe")
                else:  # torch.tensor copies, so read-only wire buffers are fine and never aliased
                    tensor.copy_(torch.tensor(sources[name], dtype=torch.float32))

    def _storage(self) -> dict[str, tuple[torch.Tensor, np.ndarray | None]]:
        """The module's state-dict tensors by name, each with a numpy view of its memory when it is
        a float32 CPU tensor (else None), looked up once.

        ``state_dict()`` walks the module tree (slow for the Nature CNN), and building a tensor
        from each array before ``copy_`` made a second full copy of every import; an actor imports
        many times. Like ``parameter_views``, this holds while the parameters are updated in
        place (optimiser steps, ``copy_``, ``load_state_dict``), which is all this codebase does
        once a network is built.
        """
        if self._targets is None:
            self._targets = {name: (t, _numpy_view(t)) for name, t in self.module.state_dict().items()}
        return self._targets


def _numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A numpy array sharing ``tensor``'s memory, for float32 on the CPU; None otherwise."""
    import torch

    if tensor.device.type != "cpu" or tensor.dtype != torch.float32:
        return None
    return tensor.detach().numpy()
