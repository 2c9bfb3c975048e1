"""The sync-model contract's bookkeeping, for the one network an agent publishes.

DQN publishes its online Q-network, SAC only its policy; both need the same rules, kept here once:
the version increases only when the parameters changed since the last export (so republishing is
free for actors), an import applies only a strictly newer version (a late or duplicated publish can
never roll an actor back), and every name and shape is checked before anything is loaded.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from zmqrl.types import Weights


class PublishedModule:
    """Versioned export/import of ``module``'s parameters as float32 numpy arrays."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.version = 0  # 0: initial, never exported or imported
        self.dirty = True  # changed since the last export (the initial weights never were exported)

    def spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Parameter name -> (shape, dtype) of what ``export`` sends, for wire validation."""
        return {name: (tuple(t.shape), "float32") for name, t in self.module.state_dict().items()}

    def export(self) -> Weights:
        """C-contiguous float32 copies, stamped with the version (bumped only if dirty)."""
        if self.dirty:
            self.version += 1
            self.dirty = False
        arrays = {
            name: np.array(t.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)
            for name, t in self.module.state_dict().items()
        }
        return Weights(self.version, arrays)

    def continue_after(self, floor: int) -> None:
        """Learner side, after a restart: the next export gets a version above ``floor`` (the
        highest ever published in this run), so actors never mistake new weights for old."""
        if floor >= self.version:
            self.version = floor
            self.dirty = True

    def load(self, weights: Weights) -> bool:
        """Load ``weights`` if strictly newer, after checking every name and shape; returns whether
        it loaded (False changes nothing)."""
        if weights.version <= self.version:
            return False
        own = self.module.state_dict()
        for name, tensor in own.items():
            if name not in weights.arrays:
                raise ValueError(f"import_weights: missing parameter {name!r}")
            got = tuple(np.shape(weights.arrays[name]))
            if got != tuple(tensor.shape):
                raise ValueError(f"import_weights: {name!r} has shape {got}, expected {tuple(tensor.shape)}")
        for name in weights.arrays:
            if name not in own:
                raise ValueError(f"import_weights: unexpected parameter {name!r}")
        with torch.no_grad():
            for name, tensor in own.items():
                # torch.tensor copies, so read-only wire buffers are fine and never aliased.
                tensor.copy_(torch.tensor(weights.arrays[name], dtype=torch.float32))
        self.version = int(weights.version)
        self.dirty = False
        return True
