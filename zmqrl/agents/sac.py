"""Soft actor-critic (Haarnoja et al., 2018) with twin critics and automatic entropy tuning.

The learner trains a tanh-squashed Gaussian policy, two Q critics and their Polyak-averaged
targets; actors hold only the policy (``export_weights`` sends nothing else) and act with it.
Everything inside the agent works in the squashed space ``[-1, 1]^act_dim``: replay holds env
actions, which ``update`` maps back linearly, so the critics see inputs of the same scale on
every env and ``target_entropy = -act_dim`` means the same thing whatever the env's bounds
(Stable-Baselines3's convention; CleanRL instead adds ``log(scale)`` to the log-probability).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.configs import SACConfig
from zmqrl.agents.nets import (
    fused_adam,
    hidden_layers,
    init_linear_,
    mlp,
    polyak_update,
    resolve_device,
    to_device,
)
from zmqrl.agents.sync import PublishedModule
from zmqrl.types import TransitionBatch, Weights

# Bounds of the policy's log standard deviation: below -5 the policy is deterministic for any
# practical purpose and the log-probability explodes; above 2 the squashed actions are all +-1.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
_METRICS = ("critic_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "entropy", "td_abs_mean")


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
    """``obs -> (mean, log_std)`` of a diagonal Gaussian whose samples are squashed by tanh into [-1, 1]."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden: list[int], generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[], enabled=generator is not None):
            self.torso, width = hidden_layers(obs_dim, hidden, nn.ReLU)
            self.mean = nn.Linear(width, act_dim)
            self.log_std = nn.Linear(width, act_dim)
        if generator is not None:
            init_linear_(self, generator)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.torso(obs.reshape(obs.shape[0], -1).to(torch.float32))
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
    MLPs it is.)"""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden: list[int], generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[], enabled=generator is not None):
            self.q1 = mlp(obs_dim + act_dim, hidden, 1)
            self.q2 = mlp(obs_dim + act_dim, hidden, 1)
        if generator is not None:
            init_linear_(self, generator)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.reshape(obs.shape[0], -1).to(torch.float32), action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)


class NumpyPolicyForward:
    """A numpy mirror of a CPU ``SquashedGaussianPolicy``'s forward pass, for the actor's hot path.

    As for ``NumpyQForward``: for one observation, torch's per-op overhead dwarfs the arithmetic.
    The arrays are views of the parameters' memory, so optimiser steps and ``copy_`` /
    ``load_state_dict`` are seen at once; a parameter *replaced* by a new tensor would not be.
    """

    def __init__(self, policy: SquashedGaussianPolicy) -> None:
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in policy.parameters()):
            raise ValueError("NumpyPolicyForward mirrors float32 CPU networks only")
        self.torso = [self._view(layer) for layer in policy.torso if isinstance(layer, nn.Linear)]
        self.mean = self._view(policy.mean)
        self.log_std = self._view(policy.log_std)

    @staticmethod
    def _view(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
        """(weight transposed, bias) as numpy views sharing the tensors' memory."""
        return layer.weight.detach().numpy().T, layer.bias.detach().numpy()

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, clamped log_std)``, each ``(B, act_dim)`` float32, for obs ``(B, *obs_shape)``."""
        x = obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)
        for weight_t, bias in self.torso:
            x = x @ weight_t + bias
            np.maximum(x, 0.0, out=x)
        mean = x @ self.mean[0] + self.mean[1]
        log_std = np.clip(x @ self.log_std[0] + self.log_std[1], LOG_STD_MIN, LOG_STD_MAX)
        return mean, log_std


class SACAgent:
    """Policy, twin critics with targets, entropy weight, three Adam optimisers and versioned weights.

    ``epsilon`` is a plain attribute, as for DQN: the probability that ``act(explore=True)`` takes
    a uniformly random action in ``[low, high]`` (the actors' random warm-up sets it to 1, then 0).
    """

    def __init__(
        self,
        config: SACConfig,
        obs_shape: tuple[int, ...],
        act_dim: int,
        *,
        action_low: np.ndarray | None = None,
        action_high: np.ndarray | None = None,
        epsilon: float | np.ndarray = 0.0,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        config.check()
        if act_dim < 1:
            raise ValueError(f"act_dim must be >= 1, got {act_dim}")
        self.config = config
        self.obs_shape = tuple(obs_shape)
        self.act_dim = act_dim
        self.action_low, self.action_high = _action_bounds(action_low, action_high, act_dim)
        self.device = resolve_device(device if device is not None else config.device)
        # Private generators: seeding must not depend on, or disturb, the process-global RNGs.
        init_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.rng = np.random.default_rng(seed)  # acting: exploration noise and random actions
        self._noise = torch.Generator(device=self.device)  # learning: the policy's reparameterised samples
        if seed is not None:
            self._noise.manual_seed(seed + 1)
        else:
            self._noise.seed()

        obs_dim = math.prod(self.obs_shape)
        self.policy = SquashedGaussianPolicy(obs_dim, act_dim, config.hidden_sizes, init_generator).to(
            self.device
        )
        self.critic = TwinQNetwork(obs_dim, act_dim, config.hidden_sizes, init_generator).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.policy_optimizer = fused_adam(self.policy.parameters(), lr=config.actor_lr)
        self.critic_optimizer = fused_adam(self.critic.parameters(), lr=config.critic_lr)
        self.target_entropy = float(config.target_entropy if config.target_entropy is not None else -act_dim)
        # alpha is learned as log(alpha), which keeps it positive under unconstrained Adam steps.
        self.log_alpha = torch.tensor(
            math.log(config.alpha), device=self.device, requires_grad=config.autotune
        )
        self.alpha_optimizer = fused_adam([self.log_alpha], lr=config.alpha_lr) if config.autotune else None

        # env action = scale * squashed + shift, and back; kept on the device for update().
        self._scale = (self.action_high - self.action_low) / 2.0
        self._shift = (self.action_high + self.action_low) / 2.0
        self._scale_t = torch.as_tensor(self._scale, device=self.device)
        self._shift_t = torch.as_tensor(self._shift, device=self.device)

        # One probability for every row, or one per row (a vector actor's sub-envs on their rungs).
        self.epsilon: float | np.ndarray = epsilon
        self.updates = 0
        self._sync = PublishedModule(self.policy)  # version and dirty flag of what actors get
        self._td_errors = np.zeros(0, dtype=np.float32)
        # actor_loss, alpha_loss, entropy of the latest policy step (NaN until the first one): the
        # metrics of an update that skips the policy step (policy_update_interval > 1) repeat them.
        self._policy_stats = torch.full((3,), float("nan"), device=self.device)
        # CPU acting goes through a numpy view of the policy: for one observation ~15 µs a call
        # instead of ~37 µs through torch (2x256 hidden; most of torch's is per-op overhead).
        self._numpy_policy = NumpyPolicyForward(self.policy) if self.device.type == "cpu" else None

    @property
    def weights_version(self) -> int:
        """Version of the weights the agent acts with now (0: initial, never synced)."""
        return self._sync.version

    @property
    def alpha(self) -> float:
        """The entropy weight the next update will use."""
        return float(self.log_alpha.detach().exp())

    # ----------------------------------------------------------------------------------- acting

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Float32 actions ``(B, act_dim)`` in ``[low, high]`` for obs ``(B, *obs_shape)``.

        ``explore=True`` samples the squashed Gaussian, except that each row independently is a
        uniformly random action with probability ``epsilon``; ``explore=False`` is ``tanh(mean)``.
        When every row is random, the network is not evaluated.
        """
        n = obs.shape[0]
        n_random = 0
        eps = self.epsilon
        # np.any costs ~1 µs per call: keep the scalar test for the single-env actor's hot path.
        if explore and (eps > 0.0 if isinstance(eps, float) else bool(np.any(eps > 0.0))):
            random_rows = self.rng.random(n) < self.epsilon
            n_random = int(np.count_nonzero(random_rows))
            if n_random == n:
                return self._uniform_actions(n)
        mean, log_std = self._policy_outputs(obs)
        if explore:
            noise = self.rng.standard_normal(mean.shape, dtype=np.float32)
            squashed = np.tanh(mean + np.exp(log_std) * noise)
        else:
            squashed = np.tanh(mean)
        # Clip: the affine map may round one ulp past a bound the env checks.
        actions = np.clip(squashed * self._scale + self._shift, self.action_low, self.action_high)
        if n_random:
            actions[random_rows] = self._uniform_actions(n_random)
        return actions

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, clamped log_std)`` of the pre-tanh Gaussian as float32 numpy, computed by torch.

        The reference for ``act``'s numpy path; the two agree up to float rounding."""
        with torch.inference_mode():
            mean, log_std = self.policy(self._obs_tensor(obs))
        return mean.cpu().numpy(), log_std.cpu().numpy()

    def _policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._numpy_policy is not None:
            return self._numpy_policy(obs)
        return self.policy_outputs(obs)

    def _uniform_actions(self, n: int) -> np.ndarray:
        return self.rng.uniform(self.action_low, self.action_high, size=(n, self.act_dim)).astype(np.float32)

    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not obs.flags.writeable:  # torch warns on read-only arrays; obs is tiny, so copy
            obs = obs.copy()
        return torch.from_numpy(obs).to(self.device, non_blocking=True)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> dict[str, float]:
        """One critic step, then (every ``policy_update_interval`` updates, as many) policy and alpha
        steps; returns metrics as python floats, gathered with one device->host transfer.

        ``batch.discount`` already holds ``gamma**k`` (0 on termination). ``importance`` weights the
        critic loss per row (prioritized replay); ``last_td_errors`` is then the mean over the two
        critics of ``|Q_i - target|`` per row.
        """
        cfg = self.config
        obs = to_device(batch.obs, self.device)
        actions = (to_device(batch.action, self.device, torch.float32) - self._shift_t) / self._scale_t
        rewards = to_device(batch.reward, self.device, torch.float32)
        next_obs = to_device(batch.next_obs, self.device)
        discounts = to_device(batch.discount, self.device, torch.float32)
        alpha = self.log_alpha.detach().exp()

        # Critic: soft Bellman backup with the smaller target critic and a fresh next action.
        with torch.no_grad():
            next_actions, next_log_prob = self.policy.sample(next_obs, self._noise)
            next_q_target = torch.min(*self.critic_target(next_obs, next_actions))
            soft_next_value = next_q_target - alpha * next_log_prob
            td_target = rewards + discounts * soft_next_value
        q1, q2 = self.critic(obs, actions)
        q1_error, q2_error = q1 - td_target, q2 - td_target
        row_loss = q1_error.square() + q2_error.square()
        if importance is None:
            critic_loss = row_loss.mean()
        else:
            critic_loss = (self._importance_tensor(importance, batch.size) * row_loss).mean()
        self._step(self.critic_optimizer, critic_loss, self.critic)

        used_alpha = alpha
        self.updates += 1
        if self.updates % cfg.policy_update_interval == 0:
            # Delayed policy steps catch up on the ones skipped (as in CleanRL's TD3-style loop).
            for _ in range(cfg.policy_update_interval):
                alpha = self._policy_and_alpha_step(obs, alpha)
            self._sync.dirty = True
        if self.updates % cfg.target_update_interval == 0:
            polyak_update(self.critic_target, self.critic, cfg.tau)

        with torch.no_grad():
            td_abs = 0.5 * (q1_error.abs() + q2_error.abs())
            actor_loss, alpha_loss, entropy = self._policy_stats
            q_mean = 0.5 * (q1.mean() + q2.mean())
            stats = torch.stack(
                [critic_loss, actor_loss, used_alpha, alpha_loss, q_mean, entropy, td_abs.mean()]
            )
            host = torch.cat([stats, td_abs]).cpu().numpy()
        self._td_errors = host[len(_METRICS) :]
        return dict(zip(_METRICS, host[: len(_METRICS)].tolist(), strict=True))

    def _policy_and_alpha_step(self, obs: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """One policy step, then one alpha step (if autotuned); returns the alpha to use next."""
        # Policy: maximise the soft value min Q(s, a~pi) - alpha * log pi(a|s); the critics are
        # frozen for this backward pass, which then builds no gradients for their weights.
        pi_actions, log_prob = self.policy.sample(obs, self._noise)
        self.critic.requires_grad_(False)
        q_pi = torch.min(*self.critic(obs, pi_actions))
        self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob - q_pi).mean()
        self._step(self.policy_optimizer, actor_loss, self.policy)

        # Alpha: grow when the policy's entropy (-log pi) is below target, shrink when above.
        log_prob = log_prob.detach()
        if self.alpha_optimizer is not None:
            alpha_loss = (-self.log_alpha.exp() * (log_prob + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
            alpha = self.log_alpha.detach().exp()
        else:
            alpha_loss = torch.zeros((), device=self.device)
        self._policy_stats = torch.stack([actor_loss.detach(), alpha_loss.detach(), -log_prob.mean()])
        return alpha

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, net: nn.Module) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.config.max_grad_norm)
        optimizer.step()

    def _importance_tensor(self, importance: np.ndarray, size: int) -> torch.Tensor:
        if np.shape(importance) != (size,):  # (B, 1) would broadcast to (B, B) without a word
            raise ValueError(f"importance must have shape ({size},), got {np.shape(importance)}")
        return to_device(np.asarray(importance), self.device, torch.float32)

    @property
    def last_td_errors(self) -> np.ndarray:
        """Mean over the two critics of ``|Q_i - target|`` per row ``(B,)`` float32 of the last
        ``update``'s batch, before its step (empty before the first update)."""
        return self._td_errors

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """None: actors hold the policy only, not the critics a TD error needs."""
        return None

    # ------------------------------------------------------------------------------ weight sync

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Parameter name -> (shape, dtype) of what ``export_weights`` sends: the policy only."""
        return self._sync.spec()

    def export_weights(self) -> Weights:
        """The policy (the critics stay on the learner) as float32 numpy copies, stamped with the
        version (see ``zmqrl.agents.sync``: bumped only when the policy changed since the last export)."""
        return self._sync.export()

    def continue_versions_after(self, floor: int) -> None:
        """Learner side, after a restart: number the next export above ``floor``."""
        self._sync.continue_after(floor)

    def import_weights(self, weights: Weights) -> bool:
        """Load ``weights`` if strictly newer (all names and shapes checked first); False changes
        nothing, so a late or duplicated publish cannot roll an actor back. Critics are untouched."""
        return self._sync.load(weights)

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as tensors and python scalars (safe for ``weights_only`` loads).

        Like ``nn.Module.state_dict``, tensors are live references: save it before training further.
        """
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict()
            if self.alpha_optimizer is not None
            else None,
            "log_alpha": self.log_alpha.detach().clone(),
            "policy_stats": self._policy_stats.clone(),
            "updates": self.updates,
            "version": self._sync.version,
            "dirty": self._sync.dirty,
            "epsilon": float(np.mean(self.epsilon)),
            "rng": self.rng.bit_generator.state,
            "noise_device": self.device.type,
            "noise": self._noise.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``; the optimisers keep their saved hyperparameters (torch convention).

        The learning-noise generator is restored only onto the same kind of device it was saved
        from (a CUDA generator's state means nothing to a CPU one, e.g. when evaluating on CPU).
        """
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.alpha_optimizer is not None and state["alpha_optimizer"] is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
            self._policy_stats.copy_(state["policy_stats"])
        self.updates = int(state["updates"])
        self._sync.version = int(state["version"])
        self._sync.dirty = bool(state["dirty"])
        self.epsilon = float(state["epsilon"])
        self.rng.bit_generator.state = state["rng"]
        if state["noise_device"] == self.device.type:
            self._noise.set_state(state["noise"].cpu())


def _action_bounds(
    low: np.ndarray | None, high: np.ndarray | None, act_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Float32 ``(act_dim,)`` bounds (None: -1 / +1), checked finite and ordered: the policy's tanh
    output is mapped affinely onto them, which an infinite or empty interval would make meaningless."""
    bounds = []
    for name, value, default in (("action_low", low, -1.0), ("action_high", high, 1.0)):
        array = np.full(act_dim, default, np.float32) if value is None else np.asarray(value, np.float32)
        if array.shape != (act_dim,):
            raise ValueError(f"{name} must have shape ({act_dim},), got {array.shape}")
        if not np.all(np.isfinite(array)):
            raise ValueError(
                f"{name} must be finite for SAC (the tanh policy is rescaled onto it), got {array}"
            )
        bounds.append(array)
    if not np.all(bounds[0] < bounds[1]):
        raise ValueError(
            f"action_low must be < action_high in every dimension, got {bounds[0]} and {bounds[1]}"
        )
    return bounds[0], bounds[1]
