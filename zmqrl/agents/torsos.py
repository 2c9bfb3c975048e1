"""The convolutional torsos as data, and their forward pass in numpy: no torch here.

Why data: three places need a CNN's layers, and only one of them may import torch. The learner
builds the torch modules from these tables (``zmqrl.agents.conv``); the config check tells a
too-small frame apart before anything starts (``zmqrl.agents.builtin``); and a torch-free actor
runs the same layers in numpy (``zmqrl.agents.numpy_policies``). One table keeps the three from
drifting apart.

The numpy forward is im2col: every ``k x k`` window of the input becomes a row (one gather through
a cached index), so a convolution is one matrix product. For MinAtar's single 3x3 convolution on
10x10 grids that is several times faster than torch's modules (docs/performance.md, "Figures
behind the agents' code"). For the Nature CNN on 84x84 frames the copies grow large: its actors
keep acting with torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

# OpenBLAS (numpy's BLAS) splits a matrix product over threads once m * n * k reaches 65536 * 4.
# Actors run next to a learner on few cores: there the hand-off to other threads costs far more
# than a small product on one (docs/performance.md, "Figures behind the agents' code"). Products
# are therefore cut into row blocks below the threshold (see small_matmul).
_BLAS_SINGLE_THREAD_MACS = 65536 * 4 - 1


@dataclass(frozen=True)
class ConvTorso:
    """A stack of ReLU convolutions, flattened, then one ReLU linear layer of ``hidden`` units.

    ``layers`` holds ``(out_channels, kernel_size, stride)`` per convolution (square kernels, no
    padding); inputs are multiplied by ``scale`` first (1/255 for uint8 pixels, 1 for 0/1 grids).
    """

    name: str  # the agent.torso value that selects it
    layers: tuple[tuple[int, int, int], ...]
    hidden: int
    scale: float
    numpy_acting: bool  # whether actors run it in numpy (cheap) rather than torch

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """Spatial size after the convolutions (either may come out < 1: too small an input)."""
        for _, kernel, stride in self.layers:
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        return height, width

    def flat_features(self, obs_shape: tuple[int, ...]) -> int:
        """Width of the flattened convolution output for ``(C, H, W)`` inputs."""
        height, width = self.output_hw(int(obs_shape[1]), int(obs_shape[2]))
        return self.layers[-1][0] * height * width

    def layout(self, prefix: str, obs_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """Parameter names and shapes as the torch module's state_dict lists them
        (``torso.convs.0.weight``, ..., ``torso.fc.0.weight``): the wire names of its weights."""
        shapes: dict[str, tuple[int, ...]] = {}
        channels = int(obs_shape[0])
        for i, (out_channels, kernel, _) in enumerate(self.layers):
            # Each convolution is followed by a ReLU in the Sequential, hence index 2 * i.
            shapes[f"{prefix}.convs.{2 * i}.weight"] = (out_channels, channels, kernel, kernel)
            shapes[f"{prefix}.convs.{2 * i}.bias"] = (out_channels,)
            channels = out_channels
        shapes[f"{prefix}.fc.0.weight"] = (self.hidden, self.flat_features(obs_shape))
        shapes[f"{prefix}.fc.0.bias"] = (self.hidden,)
        return shapes


# The DQN Nature paper's torso (Mnih et al., 2015), for stacked 84x84 Atari frames.
NATURE_CNN = ConvTorso(
    name="nature_cnn",
    layers=((32, 8, 4), (64, 4, 2), (64, 3, 1)),
    hidden=512,
    scale=1.0 / 255.0,
    numpy_acting=False,
)
# The MinAtar paper's torso (Young & Tian, 2019): one 3x3 convolution with 16 channels at stride 1
# on the 10x10 grid, then 128 units. Grids hold 0/1 already, so there is nothing to scale.
MINATAR_CNN = ConvTorso(name="minatar_cnn", layers=((16, 3, 1),), hidden=128, scale=1.0, numpy_acting=True)

CONV_TORSOS: dict[str, ConvTorso] = {torso.name: torso for torso in (NATURE_CNN, MINATAR_CNN)}


def cnn_problem(torso_name: str, obs_shape: tuple[int, ...]) -> str | None:
    """Why the CNN ``torso_name`` cannot take these observations, or None: it needs (C, H, W)
    frames at least as big as its kernels and strides allow (36x36 for the Nature CNN, 3x3 for
    the MinAtar one). The config checks of DQN and APPO say it before a run starts (with the
    config keys that fix it), and APPO's tables refuse such a spec with it."""
    if len(obs_shape) != 3 or min(obs_shape) < 1:
        return (
            f"agent.torso '{torso_name}' needs image observations (C, H, W); this env's observations "
            f"have shape {tuple(obs_shape)}: use agent.torso 'mlp', or env.preprocess 'atari'"
        )
    height, width = CONV_TORSOS[torso_name].output_hw(obs_shape[1], obs_shape[2])
    if min(height, width) < 1:
        fix = (
            "raise env.atari.screen_size (84 is the standard)"
            if torso_name == "nature_cnn"
            else "use a torso made for them"
        )
        return f"agent.torso '{torso_name}' needs larger frames than {obs_shape[1]}x{obs_shape[2]}: {fix}"
    return None


def small_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D arrays, in row blocks that OpenBLAS runs on the calling thread only."""
    rows = max(1, _BLAS_SINGLE_THREAD_MACS // max(1, a.shape[1] * b.shape[1]))
    if a.shape[0] <= rows:
        return a @ b
    return np.concatenate([a[start : start + rows] @ b for start in range(0, a.shape[0], rows)])


@functools.lru_cache(maxsize=32)
def window_index(channels: int, height: int, width: int, kernel: int, stride: int) -> np.ndarray:
    """For a flattened ``(C, H, W)`` input: the flat positions of every output pixel's ``k x k``
    window, ``(H' * W', C * k * k)``, each row laid out like a ``(C, k, k)`` conv weight."""
    out_h, out_w = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    c, i, j, di, dj = np.ix_(range(channels), range(out_h), range(out_w), range(kernel), range(kernel))
    flat = c * (height * width) + (i * stride + di) * width + (j * stride + dj)
    index = np.ascontiguousarray(flat.transpose(1, 2, 0, 3, 4).reshape(out_h * out_w, -1))
    index.flags.writeable = False  # shared by every call through the cache
    return index


def conv2d_relu(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """``relu(conv2d(x, weight) + bias)`` without padding, as ``torch.nn.Conv2d`` computes it.

    ``x`` is ``(B, C, H, W)`` float32, ``weight`` ``(O, C, k, k)``; returns ``(B, O, H', W')``.
    """
    batch, channels, height, width = x.shape
    out_channels, _, kernel, _ = weight.shape
    index = window_index(channels, height, width, kernel, stride)
    out_h, out_w = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    rows = x.reshape(batch, -1)[:, index].reshape(batch * out_h * out_w, -1)
    out = small_matmul(rows, weight.reshape(out_channels, -1).T) + bias
    np.maximum(out, 0.0, out=out)
    return out.reshape(batch, out_h, out_w, out_channels).transpose(0, 3, 1, 2)


def conv_features(
    obs: np.ndarray, arrays: dict[str, np.ndarray], prefix: str, torso: ConvTorso
) -> np.ndarray:
    """The torso's ``(B, hidden)`` features for observations ``(B, C, H, W)`` of any numeric dtype,
    computed in float32 from the weights in ``arrays`` (named as :meth:`ConvTorso.layout` lists)."""
    x = obs.astype(np.float32, copy=False)
    if torso.scale != 1.0:
        x = x * np.float32(torso.scale)
    for i, (_, _, stride) in enumerate(torso.layers):
        name = f"{prefix}.convs.{2 * i}"
        x = conv2d_relu(x, arrays[f"{name}.weight"], arrays[f"{name}.bias"], stride)
    # Flatten channel-major, as torch's nn.Flatten does on (B, O, H', W').
    flat = np.ascontiguousarray(x).reshape(x.shape[0], -1)
    out = small_matmul(flat, arrays[f"{prefix}.fc.0.weight"].T) + arrays[f"{prefix}.fc.0.bias"]
    np.maximum(out, 0.0, out=out)
    return out


def fan_in(shape: tuple[int, ...]) -> int:
    """Inputs per output unit of a Linear ``(out, in)`` or Conv2d ``(out, in, k, k)`` weight."""
    return math.prod(shape[1:])
