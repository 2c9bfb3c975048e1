"""Export and load of the one network an agent publishes, as named float32 numpy arrays.

DQN publishes its online Q-network, SAC only its policy; both need the same rules, kept here once:
exports are C-contiguous float32 copies, and a load checks every name and shape before it
changes anything, then copies straight into the parameters' memory. Which snapshot is newer is
not decided here: the weights client (``zmqrl.transport.weights_versions``) does that.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from zmqrl.agents.numpy_policies import imported_array


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
