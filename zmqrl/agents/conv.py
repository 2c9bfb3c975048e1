"""The convolutional torso of the DQN Nature paper (Mnih et al., 2015), for stacked Atari frames.

Kept apart from the MLP building blocks in ``nets.py`` so that CartPole-sized runs never pay for it;
a Q-network puts its heads on ``NatureCNN.out_features``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Pixel values arrive as uint8 in [0, 255]; the network sees them in [0, 1].
PIXEL_SCALE = 1.0 / 255.0

# (out_channels, kernel_size, stride) of the three convolutions, as in the paper.
CONV_LAYERS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))

# Width of the fully connected layer after the convolutions.
HIDDEN_FEATURES = 512


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


class NatureCNN(nn.Module):
    """``(B, C, H, W)`` frames -> ``(B, 512)`` features: three ReLU convolutions and a ReLU linear layer.

    ``obs_shape`` is ``(C, H, W)``, channel-first (e.g. ``(4, 84, 84)`` for four stacked grey frames).
    ``forward`` takes uint8 or float pixels in [0, 255] and scales them by 1/255 itself, so replay can
    keep (and ship to the device) uint8 frames, a quarter of the bytes of float32.

    The flattened size after the convolutions (3136 for 84x84) is measured with a dry run, so other
    screen sizes work without arithmetic that could drift from the layers.
    """

    out_features: int = HIDDEN_FEATURES

    def __init__(self, obs_shape: tuple[int, ...], generator: torch.Generator | None = None) -> None:
        super().__init__()
        if len(obs_shape) != 3 or any(int(d) < 1 for d in obs_shape):
            raise ValueError(f"NatureCNN needs obs_shape (C, H, W) with positive sizes, got {obs_shape}")
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in obs_shape)
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
        for out_channels, kernel, stride in CONV_LAYERS:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride=stride), nn.ReLU()]
            channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():  # zeros consume no randomness, so this is safe outside fork_rng too
            try:
                flat = int(self.convs(torch.zeros(1, *self.obs_shape)).shape[1])
            except RuntimeError as exc:  # e.g. a screen too small for an 8x8 kernel at stride 4
                raise ValueError(
                    f"obs_shape {self.obs_shape} is too small for the Nature CNN: {exc}"
                ) from None
        self.fc = nn.Sequential(nn.Linear(flat, HIDDEN_FEATURES), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"NatureCNN expected observations (B, {', '.join(map(str, self.obs_shape))}), "
                f"got {tuple(obs.shape)} (frames must be channel-first)"
            )
        # Not in place: a float input is the caller's tensor.
        x = obs.to(torch.float32) * PIXEL_SCALE
        return self.fc(self.convs(x))
