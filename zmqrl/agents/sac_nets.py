"""SAC's networks: the tanh-squashed Gaussian policy, its log-probability, and the twin Q critics.

``zmqrl.agents.sac`` trains them; actors run the policy alone (``NumpySACPolicy`` mirrors its
forward pass in numpy, in the same parameter layout).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.keyed import Field
from zmqrl.agents.keyed_nets import flat_obs
from zmqrl.agents.layers import MLP, sac_policy_net
from zmqrl.agents.nets import build_acting, init_linear_, mlp, torso_features
from zmqrl.agents.numpy_policies import LOG_STD_MAX, LOG_STD_MIN

# Bounds of the policy's log standard deviation (LOG_STD_MIN, LOG_STD_MAX, shared with the
# numpy policy): below -5 the policy is deterministic for any practical purpose and the
# log-probability explodes; above 2 the squashed actions are all +-1.
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def squashed_gaussian_log_prob(
    noise: torch.Tensor, log_std: torch.Tensor, pre_tanh: torch.Tensor
) -> torch.Tensor:
    """``log pi(tanh(u))`` summed over action dimensions, for ``u = mean + exp(log_std) * noise``.

    The Gaussian term uses ``noise`` itself rather than ``(u - mean) / std``, which loses precision
    when std is small. The change of variables subtracts ``log(1 - tanh(u)^2)``, rewritten as
    ``2 * (log 2 - u - softplus(-2u))``: exact, and finite where ``tanh(u)`` rounds to +-1.
    """
    gaussian = -0.5 * noise.square() - log_std - _HALF_LOG_2PI
    log_det_jacobian = 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
    return (gaussian - log_det_jacobian).sum(dim=-1)


class SquashedGaussianPolicy(nn.Module):
    """``obs -> (mean, log_std)`` of a diagonal Gaussian whose samples are squashed by tanh into [-1, 1].

    Its layers are the table ``zmqrl.agents.layers.sac_policy_net``, which actors run in numpy.
    ``inputs``: a Dict observation's keys (records' bytes in, every key flattened; ``obs_dim`` is
    then unused)."""

    torso: nn.Module
    mean: nn.Linear
    log_std: nn.Linear

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: list[int],
        generator: torch.Generator | None = None,
        inputs: tuple[Field, ...] = (),
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[], enabled=generator is not None):
            build_acting(self, sac_policy_net(hidden, act_dim, inputs), (obs_dim,))
        if generator is not None:
            init_linear_(self, generator)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torso_features(self.torso, MLP, obs)
        return self.mean(features), self.log_std(features).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised squashed actions ``(B, act_dim)`` in [-1, 1] and their log-probs ``(B,)``."""
        mean, log_std = self(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        pre_tanh = mean + log_std.exp() * noise
        return torch.tanh(pre_tanh), squashed_gaussian_log_prob(noise, log_std, pre_tanh)


class TwinQNetwork(nn.Module):
    """Two independent ``Q(s, a)`` MLPs on ``concat(obs, action)``; the min of the pair curbs the
    overestimation a single critic's maximisation by the policy would feed on (Fujimoto et al., 2018).

    (Stacking the pair into batched matmuls was measured: no faster on CPU at 256x256, so two plain
    MLPs it is.) ``inputs``: a Dict observation's keys; the critics read every key flattened
    (``keyed_nets.flat_obs``), ``obs_dim`` wide."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: list[int],
        generator: torch.Generator | None = None,
        inputs: tuple[Field, ...] = (),
    ) -> None:
        super().__init__()
        self.inputs = inputs
        with torch.random.fork_rng(devices=[], enabled=generator is not None):
            self.q1 = mlp(obs_dim + act_dim, hidden, 1)
            self.q2 = mlp(obs_dim + act_dim, hidden, 1)
        if generator is not None:
            init_linear_(self, generator)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([flat_obs(obs, self.inputs), action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)
