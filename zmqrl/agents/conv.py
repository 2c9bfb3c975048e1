"""Convolutional torsos for Q-networks: the DQN Nature CNN (84x84 Atari) and the MinAtar CNN (10x10).

Kept apart from the MLP building blocks in ``nets.py`` so that CartPole-sized runs never pay for it;
a Q-network puts its heads on ``out_features``. The layers themselves are data in
``zmqrl.agents.torsos`` (shared with the config check and the numpy actors); this module only turns
a table into torch modules.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zmqrl.agents.torsos import MINATAR_CNN, NATURE_CNN, ConvTorso

# Pixel values arrive as uint8 in [0, 255]; the Nature CNN sees them in [0, 1].
PIXEL_SCALE = NATURE_CNN.scale

# (out_channels, kernel_size, stride) of the Nature CNN's three convolutions, as in the paper.
CONV_LAYERS: tuple[tuple[int, int, int], ...] = NATURE_CNN.layers

# Width of the Nature CNN's fully connected layer after the convolutions.
HIDDEN_FEATURES = NATURE_CNN.hidden


@torch.no_grad()
def init_conv_linear_(module: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every ``nn.Conv2d`` and ``nn.Linear`` with torch's default distribution, from ``generator``.

    Layers initialise from the global RNG, which any library may also consume; drawing from a private
    generator makes "same seed -> same initial weights" hold whatever else the process did. Torch's
    default for both layer types is kaiming-uniform with a=sqrt(5), which reduces to
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike, where fan_in is
    ``in_features`` for a Linear and ``in_channels * kernel_h * kernel_w`` (per group) for a Conv2d.
    """
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            fan_in = math.prod(layer.weight.shape[1:])
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            layer.weight.uniform_(-bound, bound, generator=generator)
            if layer.bias is not None:
                layer.bias.uniform_(-bound, bound, generator=generator)


class ConvNet(nn.Module):
    """``(B, C, H, W)`` inputs -> ``(B, hidden)`` features: the ReLU convolutions of ``spec``, then a
    ReLU linear layer. Subclasses name a table (:class:`NatureCNN`, :class:`MinAtarCNN`).

    ``obs_shape`` is ``(C, H, W)``, channel-first. ``forward`` takes uint8, bool or float inputs
    and widens them to float32 (times ``spec.scale``) itself, so replay can keep (and ship to the
    device) one byte per value, a quarter of the bytes of float32.

    The flattened size after the convolutions is measured with a dry run, so other input sizes
    work without arithmetic that could drift from the layers.
    """

    spec: ConvTorso
    label: str  # how errors name the network

    def __init__(self, obs_shape: tuple[int, ...], generator: torch.Generator | None = None) -> None:
        super().__init__()
        if len(obs_shape) != 3 or any(int(d) < 1 for d in obs_shape):
            raise ValueError(
                f"{type(self).__name__} needs obs_shape (C, H, W) with positive sizes, got {obs_shape}"
            )
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in obs_shape)
        self.out_features: int = self.spec.hidden
        if generator is not None:
            # Build without touching the global RNG (the layers are re-drawn from `generator` below).
            with torch.random.fork_rng(devices=[]):
                self._build()
            init_conv_linear_(self, generator)
        else:
            self._build()

    def _build(self) -> None:
        layers: list[nn.Module] = []
        channels = self.obs_shape[0]
        for out_channels, kernel, stride in self.spec.layers:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride=stride), nn.ReLU()]
            channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():  # zeros consume no randomness, so this is safe outside fork_rng too
            try:
                flat = int(self.convs(torch.zeros(1, *self.obs_shape)).shape[1])
            except RuntimeError as exc:  # e.g. a screen too small for an 8x8 kernel at stride 4
                raise ValueError(
                    f"obs_shape {self.obs_shape} is too small for the {self.label}: {exc}"
                ) from None
        self.fc = nn.Sequential(nn.Linear(flat, self.spec.hidden), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"{type(self).__name__} expected observations (B, {', '.join(map(str, self.obs_shape))}), "
                f"got {tuple(obs.shape)} (frames must be channel-first)"
            )
        # Not in place: a float input is the caller's tensor.
        x = obs.to(torch.float32)
        if self.spec.scale != 1.0:
            x = x * self.spec.scale
        return self.fc(self.convs(x))


class NatureCNN(ConvNet):
    """The DQN Nature paper's torso (Mnih et al., 2015): ``(4, 84, 84)`` uint8 frames -> 512 features,
    pixels scaled by 1/255 inside."""

    spec = NATURE_CNN
    label = "Nature CNN"


class MinAtarCNN(ConvNet):
    """The MinAtar paper's torso (Young & Tian, 2019): ``(C, 10, 10)`` 0/1 grids -> 128 features,
    through one 3x3 convolution of 16 channels (1024 flattened values)."""

    spec = MINATAR_CNN
    label = "MinAtar CNN"


# agent.torso -> the torch module that implements it.
CONV_NETS: dict[str, type[ConvNet]] = {NATURE_CNN.name: NatureCNN, MINATAR_CNN.name: MinAtarCNN}
