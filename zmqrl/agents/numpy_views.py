"""Numpy views of a CPU network's parameters, so a torch agent acts through the actors' numpy code.

For one observation (or one row per sub-env), torch's per-op dispatch and module-call overhead
dwarf a small MLP's arithmetic: ~30 µs against ~8 µs for DQN's 2x256 Q-network, ~37 µs against
~15 µs for SAC's policy. On the CPU the agents therefore run ``zmqrl.agents.numpy_policies``'
forward functions (those the torch-free actors run) on these views, which gives the same
numbers as the numpy policies and keeps a single copy of that code.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def parameter_views(module: nn.Module) -> dict[str, np.ndarray]:
    """``module``'s parameters by state-dict name (``torso.0.weight``, ...) as numpy arrays that
    share the tensors' memory.

    In-place changes (optimiser steps, ``copy_``, ``load_state_dict``) are seen at once; a
    parameter *replaced* by a new tensor (moving the module to another device,
    ``load_state_dict(assign=True)``) would not be: take the views once the network is final.
    """
    params = dict(module.named_parameters())
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params.values()):
        raise ValueError("numpy views need float32 parameters on the CPU")
    return {name: p.detach().numpy() for name, p in params.items()}
