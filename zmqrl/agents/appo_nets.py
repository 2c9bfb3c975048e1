"""APPO's torch networks: the policy (built from the same table the numpy policy runs) with its
log-probabilities and entropy, and the value network (the policy's torso, its own parameters).

``zmqrl.agents.appo`` trains them; actors run the policy alone in numpy
(``zmqrl.agents.appo_policy``, whose formulas these mirror line for line), or this module's
policy on the CPU for the Nature CNN. Observations arrive in the env's dtype: the MLP flattens
them to float32, the CNNs widen (and scale) uint8 frames themselves (``nets.torso_features``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.appo_policy import HALF_LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, shape_initial_policy
from zmqrl.agents.keyed import mask_field
from zmqrl.agents.layers import CORE, LOG_STD, LOGITS, MEAN, MLP, TANH, VALUE, ActingNet, appo_value_net
from zmqrl.agents.masks import mask_torch
from zmqrl.agents.nets import build_acting, init_linear_, torso_features
from zmqrl.agents.numpy_policies import parameter_views


def _activation(net: ActingNet) -> type[nn.Module]:
    return nn.Tanh if net.activation == TANH else nn.ReLU


def build_from_table(
    module: nn.Module, net: ActingNet, obs_shape: tuple[int, ...], generator: torch.Generator | None
) -> None:
    """Give ``module`` the layers of ``net`` (``build_acting``), drawn from ``generator`` when one
    is given (the global RNG untouched): the MLP whole, with torch's default distribution; a CNN
    draws its own torso from it (``zmqrl.agents.conv``), then the heads are drawn, as
    ``QNetwork`` does, after the LSTM core if there is one (a recurrent policy's)."""
    with torch.random.fork_rng(devices=[], enabled=generator is not None):
        build_acting(module, net, obs_shape, _activation(net), generator)
    if generator is not None:
        core = [getattr(module, CORE)] if net.core else []
        heads = nn.ModuleList([*core, *(getattr(module, name) for name, _ in net.heads)])
        init_linear_(module if net.torso == MLP else heads, generator)


class APPOPolicyNet(nn.Module):
    """``obs -> (logits, None)`` or ``(mean, log_std)``, in the layout of ``net``
    (``zmqrl.agents.layers.appo_policy_net``): what ``export_weights`` publishes."""

    torso: nn.Module
    action_low: torch.Tensor  # (act_dim,) buffers, see __init__
    action_high: torch.Tensor

    def __init__(
        self,
        net: ActingNet,
        obs_shape: tuple[int, ...],
        log_std_init: float,
        generator: torch.Generator | None = None,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
        masked: bool = False,
    ) -> None:
        super().__init__()
        self.net = net
        self.masked = masked  # logits of each row's illegal actions are MASKED_VALUE (agents/masks.py)
        self.mask_field = mask_field(net.inputs)  # where records hold them (None: rows end with them)
        build_from_table(self, net, obs_shape, generator)
        for name, width in net.free:  # set by shape_initial_policy below
            self.register_parameter(name, nn.Parameter(torch.zeros(width)))
        # Built on the CPU, so the numpy rule that scales the numpy policy's first weights applies.
        shape_initial_policy(parameter_views(self), net, log_std_init)
        self.discrete = any(name == LOGITS for name, _ in net.heads)
        # The continuous actions' bounds (+-inf where there is none; appo_policy.action_bounds):
        # buffers so they follow the module to its device, not persistent so the state dict (the
        # published weights) stays the numpy policy's layout.
        low, high = bounds if bounds is not None else (np.zeros(0, np.float32), np.zeros(0, np.float32))
        self.register_buffer("action_low", torch.as_tensor(low, dtype=torch.float32), persistent=False)
        self.register_buffer("action_high", torch.as_tensor(high, dtype=torch.float32), persistent=False)

    @property
    def recurrent(self) -> bool:
        """Whether an LSTM core sits between torso and heads (``self.core``; see appo_rnn)."""
        return bool(self.net.core)

    def cell(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the LSTM core (``self.core``, an ``nn.LSTMCell``): ``(h, c)`` after ``x``."""
        core: nn.LSTMCell = getattr(self, "core")  # noqa: B009 (built by build_acting when recurrent)
        h, c = core(x, state)
        return h, c

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The torso's features ``(B, width)`` of observations ``(B, *obs_shape)``."""
        return torso_features(self.torso, self.net.torso, obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.recurrent:
            raise TypeError("a recurrent policy steps from a state: use zmqrl.agents.appo_rnn")
        return self.masked_outputs(self.features(obs), obs)

    def outputs(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The heads on ``features`` (the torso's, or the core's ``h``): ``(logits, None)`` or
        ``(mean, clamped log_std)``."""
        if self.discrete:
            return getattr(self, LOGITS)(features), None
        mean = getattr(self, MEAN)(features)
        spread = getattr(self, LOG_STD)  # a head (log_std "state"), or a free vector ("param")
        log_std = spread(features) if isinstance(spread, nn.Module) else spread.expand_as(mean)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def log_prob_entropy(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities ``(B,)`` of ``actions`` (int64 ``(B,)`` or float32 ``(B, act_dim)``)
        and the policy's entropies ``(B,)`` at ``obs`` (a masked policy's over its legal actions)."""
        return self.head_log_prob_entropy(self.features(obs), actions, obs)

    def masked_outputs(
        self, features: torch.Tensor, obs: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``outputs`` on ``features`` (the torso's, or a recurrent core's ``h``) of the rows
        ``obs``, whose legal actions a masked policy's logits obey: the heads of a recurrent
        policy read ``h``, but the legal actions are those of the row it acts on."""
        out, log_std = self.outputs(features)
        if not self.masked:
            return out, log_std
        if obs is None:
            raise ValueError("a masked policy's logits need the rows their legal actions come from")
        return mask_torch(out, obs, self.mask_field), log_std

    def head_log_prob_entropy(
        self, features: torch.Tensor, actions: torch.Tensor, obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``log_prob_entropy``, from the features the heads read (a recurrent core's ``h``) of
        the rows ``obs`` (needed by a masked policy: see ``masked_outputs``)."""
        out, log_std = self.masked_outputs(features, obs)
        if log_std is None:
            return categorical_logp_entropy(out, actions)
        logp = clipped_gaussian_logp(out, log_std, actions, self.action_low, self.action_high)
        return logp, gaussian_entropy(log_std)


def categorical_logp_entropy(
    logits: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi(a)`` ``(B,)`` of int64 ``actions`` and the entropy ``(B,)`` of softmax(logits)."""
    log_probs = F.log_softmax(logits, dim=-1)
    logp = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    return logp, -(log_probs.exp() * log_probs).sum(dim=-1)


def clipped_gaussian_logp(
    mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor
) -> torch.Tensor:
    """Log-probability ``(B,)`` of clipped actions under the Gaussian clipped to ``[low, high]``,
    as ``appo_policy.clipped_gaussian_logp`` computes it (see the semantics there): per dimension
    the log-density inside, ``log Phi(z)`` at (or below) ``low``, ``log Phi(-z)`` at (or above)
    ``high``, summed.

    Every branch is evaluated at the action's own ``z``, finite wherever the action is, so the
    branches ``torch.where`` discards have finite gradients too (a bound's z would be infinite on
    an unbounded side, and its zero-weighted NaN gradient would still poison the sum)."""
    z = (actions - mean) / log_std.exp()
    density = -0.5 * z.square() - log_std - HALF_LOG_2PI
    logp = torch.where(actions <= low, torch.special.log_ndtr(z), density)
    logp = torch.where(actions >= high, torch.special.log_ndtr(-z), logp)
    return logp.sum(dim=-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy ``(B,)`` of the (unclipped) diagonal Gaussian: ``sum(log_std + 0.5 + 0.5 log 2 pi)``."""
    return (log_std + (0.5 + HALF_LOG_2PI)).sum(dim=-1)


class ValueNet(nn.Module):
    """``obs -> V(obs)`` ``(B,)``: the policy's torso (same shapes, its own parameters) and one
    ``value`` unit (``zmqrl.agents.layers.appo_value_net``), trained only by the learner (actors
    never see it)."""

    torso: nn.Module

    def __init__(
        self, net: ActingNet, obs_shape: tuple[int, ...], generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.net = appo_value_net(net)
        build_from_table(self, self.net, obs_shape, generator)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return getattr(self, VALUE)(torso_features(self.torso, self.net.torso, obs)).squeeze(-1)
