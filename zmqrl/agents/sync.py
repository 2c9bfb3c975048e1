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

from zmqrl.agents.numpy_policies import imported_array
from zmqrl.types import Weights


class PublishedModule:
    """Versioned export/import of ``module``'s parameters as float32 numpy arrays."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.version = 0  # 0: initial, never exported or imported
        self.dirty = True  # changed since the last export (the initial weights never were exported)
        self._targets: dict[str, tuple[torch.Tensor, np.ndarray | None]] | None = None  # see _storage

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
        own = self._storage()
        sources = {name: imported_array(weights, name, tuple(t.shape)) for name, (t, _) in own.items()}
        for name in weights.arrays:
            if name not in own:
                raise ValueError(f"import_weights: unexpected parameter {name!r}")
        with torch.no_grad():
            for name, (tensor, view) in own.items():
                if view is not None:
                    # One pass, straight into the parameter's memory: a read-only or unaligned
                    # wire buffer is fine as a source, nothing of it is kept, and numbers checked
                    # above cannot fail to convert.
                    np.copyto(view, sources[name], casting="unsafe")
                else:  # torch.tensor copies, so read-only wire buffers are fine and never aliased
                    tensor.copy_(torch.tensor(sources[name], dtype=torch.float32))
        self.version = int(weights.version)
        self.dirty = False
        return True

    def _storage(self) -> dict[str, tuple[torch.Tensor, np.ndarray | None]]:
        """The module's state-dict tensors by name, each with a numpy view of its memory when it is
        a float32 CPU tensor (else None), looked up once.

        ``state_dict()`` walks the module tree (~0.25 ms for the Nature CNN), and building a tensor
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
    if tensor.device.type != "cpu" or tensor.dtype != torch.float32:
        return None
    return tensor.detach().numpy()
