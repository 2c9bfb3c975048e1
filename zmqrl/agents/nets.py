"""Small torch building blocks shared by agents: device choice, MLPs, Q-networks, target updates.

Kept free of algorithm logic so that an agent module reads as "networks + loss" and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from zmqrl.agents.configs import DEVICE_NAMES, TORSOS
from zmqrl.agents.keyed import Field, mask_field
from zmqrl.agents.keyed_nets import KeyedTorso
from zmqrl.agents.layers import MLP, ActingNet, dqn_net
from zmqrl.agents.masks import mask_torch
from zmqrl.types import as_bytes


def resolve_device(name: str) -> torch.device:
    """Turn a config device name into a ``torch.device``, failing loudly instead of falling back.

    "auto" picks CUDA when present; an explicit "cuda" on a machine without one is a config error,
    because silently training on CPU would make a run many times slower without saying why.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but torch sees no CUDA device; use 'cpu' or 'auto'")
        return torch.device("cuda")
    raise ValueError(f"unknown device {name!r}; expected one of {', '.join(DEVICE_NAMES)}")


def annealed_lr(lr: float, lr_final: float | None, decay_updates: int, updates: int) -> float:
    """``lr`` moved linearly to ``lr_final`` over ``decay_updates`` updates (``lr_final`` None:
    constant), the schedule of every agent with an ``lr_final`` setting."""
    if lr_final is None:
        return lr
    frac = min(1.0, updates / decay_updates)
    return lr + frac * (lr_final - lr)


def fused_adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam with the fused kernel where this torch build has it (faster steps for small CPU
    networks, where per-tensor Python overhead dominates), else the default implementation."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, eps=eps)


def to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Numpy -> tensor without a copy where possible (read-only arrays, e.g. wire buffers, are copied).

    Without ``dtype`` the array keeps its own (uint8 frames travel to the device as bytes, 4x
    less than float32, and are widened there). Records (a Dict observation's) travel as their
    bytes (``zmqrl.types.as_bytes``), which the keyed networks read (``zmqrl.agents.keyed_nets``)."""
    array = as_bytes(array)
    if not array.flags.writeable:
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype) if dtype is not None else tensor.to(device)


def on_device(
    arrays: Mapping[str, np.ndarray], device: torch.device, dtypes: Mapping[str, torch.dtype]
) -> dict[str, torch.Tensor]:
    """``arrays`` by name as tensors on ``device``, each in its ``dtypes`` entry if it has one."""
    return {name: to_device(a, device, dtypes.get(name)) for name, a in arrays.items()}


def check_importance(importance: np.ndarray, size: int) -> None:
    """Refuse prioritized replay's importance weights unless they are ``(size,)``: ``(B, 1)``
    would broadcast against the rows' losses to ``(B, B)`` without a word."""
    if np.shape(importance) != (size,):
        raise ValueError(f"importance must have shape ({size},), got {np.shape(importance)}")


def hidden_layers(
    in_dim: int, hidden: Sequence[int], activation: type[nn.Module]
) -> tuple[nn.Sequential, int]:
    """Hidden layers with activations after each; returns the stack and its output width."""
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        layers += [nn.Linear(width, size), activation()]
        width = size
    return nn.Sequential(*layers), width


def mlp(
    in_dim: int, hidden: Sequence[int], out_dim: int, activation: type[nn.Module] = nn.ReLU
) -> nn.Sequential:
    """A plain MLP: ``Linear -> act`` per hidden size, then a linear output layer (no activation)."""
    torso, width = hidden_layers(in_dim, hidden, activation)
    return nn.Sequential(*torso, nn.Linear(width, out_dim))


@torch.no_grad()
def init_linear_(module: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every ``nn.Linear`` (and ``nn.LSTMCell``) with torch's default distribution, from
    ``generator``.

    ``nn.Linear`` initialises from the global RNG, which any library may also consume; drawing from
    a private generator makes "same seed, same config -> same initial weights" hold regardless of
    what else the process did. The distribution is torch's default (kaiming-uniform with a=sqrt(5)
    reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike).
    """
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            bound = 1.0 / math.sqrt(layer.in_features) if layer.in_features > 0 else 0.0
            layer.weight.uniform_(-bound, bound, generator=generator)
            if layer.bias is not None:
                layer.bias.uniform_(-bound, bound, generator=generator)
        elif isinstance(layer, nn.LSTMCell):  # torch's default: U(-1/sqrt(H), 1/sqrt(H)) for all
            bound = 1.0 / math.sqrt(layer.hidden_size)
            for param in layer.parameters():
                param.uniform_(-bound, bound, generator=generator)


class QNetwork(nn.Module):
    """Maps a batch of observations ``(B, *obs_shape)`` to action values ``(B, n_actions)``.

    Observations are cast to float32 inside ``forward`` so that callers can hand over the env's
    native dtype: uint8 frames cross to the device as bytes and are widened there. The ``"mlp"``
    torso flattens them first; the CNNs (``"nature_cnn"``, ``"minatar_cnn"``) keep ``(B, C, H, W)``
    and scale the values themselves.

    With ``dueling`` the torso feeds a value head V(s) and an advantage head A(s, a), combined as
    ``Q = V + A - mean_a A``: subtracting the mean makes the split identifiable (Wang et al., 2016).

    With ``masked`` (a masked run: each row ends with its legal actions) the values of illegal
    actions are ``MASKED_VALUE`` (``zmqrl.agents.masks``), so every max and argmax is over legal ones.
    """

    torso: nn.Module
    head: nn.Linear  # without dueling
    value: nn.Linear  # with dueling
    advantage: nn.Linear

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        hidden: Sequence[int],
        n_actions: int,
        dueling: bool = False,
        activation: type[nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        torso: str = "mlp",
        masked: bool = False,
        inputs: tuple[Field, ...] = (),
    ) -> None:
        super().__init__()
        self.masked = masked
        self.inputs = inputs  # a Dict observation's keys (zmqrl.agents.keyed): records' bytes in
        self.mask_field = mask_field(inputs)  # where records hold legal actions (None: rows end with them)
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        if torso not in TORSOS:
            raise ValueError(f"torso must be one of {', '.join(TORSOS)}, got {torso!r}")
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.dueling = dueling
        self.torso_kind = torso
        if generator is not None:
            # Build without touching the global RNG (the layers are re-drawn from `generator` below).
            with torch.random.fork_rng(devices=[]):
                self._build(hidden, n_actions, activation, generator)
            # The CNN drew its own layers from `generator` (with its own scheme); only the heads
            # are re-drawn here. The MLP is re-drawn whole, torso first, as it always was.
            init_linear_(self if torso == "mlp" else self._heads(), generator)
        else:
            self._build(hidden, n_actions, activation, None)

    def _build(
        self,
        hidden: Sequence[int],
        n_actions: int,
        activation: type[nn.Module],
        generator: torch.Generator | None,
    ) -> None:
        net = dqn_net(self.torso_kind, hidden, n_actions, self.dueling, self.inputs)
        build_acting(self, net, self.obs_shape, activation, generator)

    def _heads(self) -> nn.ModuleList:
        return nn.ModuleList([self.value, self.advantage] if self.dueling else [self.head])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = torso_features(self.torso, self.torso_kind, obs)
        if not self.dueling:
            q = self.head(features)
        else:
            value = self.value(features)
            advantage = self.advantage(features)
            q = value + advantage - advantage.mean(dim=1, keepdim=True)
        return mask_torch(q, obs, self.mask_field) if self.masked else q


def build_acting(
    module: nn.Module,
    net: ActingNet,
    obs_shape: tuple[int, ...],
    activation: type[nn.Module] = nn.ReLU,
    generator: torch.Generator | None = None,
) -> None:
    """Give ``module`` the layers of the table ``net`` (``zmqrl.agents.layers``): ``module.torso``,
    ``module.core`` (an ``nn.LSTMCell``) when the table has one, then one ``nn.Linear`` per head,
    named as the table names it, so its state dict is exactly ``net.layout(obs_shape)``, the
    layout the numpy policies load. A keyed table's torso is a ``KeyedTorso`` (its CNNs drawn from
    ``generator`` by themselves, its MLP here)."""
    if net.inputs:
        keyed = KeyedTorso(net.inputs, net.torso, net.hidden, activation, generator)
        if generator is not None:
            init_linear_(keyed.dense(), generator)
        module.torso = keyed
    elif net.torso != MLP:
        from zmqrl.agents.conv import CONV_NETS  # only pixel runs pay for (and need) the conv module

        module.torso = CONV_NETS[net.torso](obs_shape, generator=generator)
    else:
        module.torso, _ = hidden_layers(math.prod(obs_shape), net.hidden, activation)
    width = net.torso_width(obs_shape)
    if net.core:  # registered between torso and heads, as the table's layout lists it
        module.core = nn.LSTMCell(width, net.core)
        width = net.core
    for name, out in net.heads:
        setattr(module, name, nn.Linear(width, out))


def torso_features(torso: nn.Module, kind: str, obs: torch.Tensor) -> torch.Tensor:
    """The features of ``build_acting``'s ``torso`` (of table torso ``kind``) for observations
    ``(B, *obs_shape)`` in the env's own dtype: the MLP's of the flattened observations as
    float32; a CNN takes ``(B, C, H, W)`` as they are and widens (and scales) them itself, so uint8
    frames cross to the device as bytes. A ``KeyedTorso`` takes records' bytes ``(B, itemsize)``."""
    if isinstance(torso, KeyedTorso):
        return torso(obs)
    if kind == MLP:
        return torso(obs.reshape(obs.shape[0], -1).to(torch.float32))
    return torso(obs)


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * online``, in place; ``tau == 1`` is an exact hard copy.

    Buffers (none in QNetwork, but e.g. normalisation statistics) are always copied outright:
    averaging running statistics has no meaning.
    """
    target_params: list[torch.Tensor] = list(target.parameters())
    online_params: list[torch.Tensor] = list(online.parameters())
    if len(target_params) != len(online_params):
        raise ValueError("polyak_update: target and online networks have different parameter lists")
    if tau >= 1.0:
        torch._foreach_copy_(target_params, online_params)
    else:
        torch._foreach_lerp_(target_params, online_params, tau)
    for target_buffer, online_buffer in zip(target.buffers(), online.buffers(), strict=True):
        target_buffer.copy_(online_buffer)
