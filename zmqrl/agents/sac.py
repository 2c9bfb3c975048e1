"""Soft actor-critic (Haarnoja et al., 2018) with twin critics and automatic entropy tuning.

The learner trains a tanh-squashed Gaussian policy, two Q critics and their Polyak-averaged
targets (the networks are in ``zmqrl.agents.sac_nets``); actors hold only the policy
(``export_weights`` gives nothing else) and act with it.
Everything inside the agent works in the squashed space ``[-1, 1]^act_dim``: replay holds env
actions, which ``update`` maps back linearly, so the critics see inputs of the same scale on
every env and ``target_entropy = -act_dim`` means the same thing whatever the env's bounds
(Stable-Baselines3's convention; CleanRL instead adds ``log(scale)`` to the log-probability).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from zmqrl.agents.capture import any_flag, captured_update, pack, transition_dtypes, transition_inputs
from zmqrl.agents.configs import SACConfig
from zmqrl.agents.layers import sac_policy_net
from zmqrl.agents.nets import check_importance, fused_adam, polyak_update, resolve_device, to_device
from zmqrl.agents.numpy_policies import LOG_STD_MAX as LOG_STD_MAX  # the policy's log-std bounds
from zmqrl.agents.numpy_policies import LOG_STD_MIN as LOG_STD_MIN
from zmqrl.agents.numpy_policies import (
    PublishedModule,
    SquashedActions,
    parameter_views,
    sac_act_dim,
    sac_policy_outputs,
    squashed_action_bounds,
)
from zmqrl.agents.sac_nets import SquashedGaussianPolicy, TwinQNetwork
from zmqrl.agents.updates import DeferredUpdate, Flag, any_found, guarded_step, step_unless
from zmqrl.spec import SampleSpec
from zmqrl.types import BATCH_FIELDS, TransitionBatch

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
_METRICS = ("critic_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "entropy", "td_abs_mean")
# Device dtypes of a batch's columns (observations keep theirs).
_INPUT_DTYPES = transition_dtypes(torch.float32)


class _CriticStep(NamedTuple):
    """What an update's critic step leaves for its metrics (detached), and the alpha it used."""

    critic_loss: torch.Tensor
    q1: torch.Tensor  # (B,) each critic's values of the batch's actions
    q2: torch.Tensor
    q1_error: torch.Tensor  # (B,) each critic's Q - TD target
    q2_error: torch.Tensor
    alpha: torch.Tensor


def _metric_tensors(out: _CriticStep, policy_stats: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """An update's metrics in ``_METRICS`` order and its rows' TD errors (the mean over the two
    critics of ``|Q_i - target|``); ``policy_stats``: the latest policy step's."""
    td_abs = 0.5 * (out.q1_error.abs() + out.q2_error.abs())
    actor_loss, alpha_loss, entropy = policy_stats
    q_mean = 0.5 * (out.q1.mean() + out.q2.mean())
    return [out.critic_loss, actor_loss, out.alpha, alpha_loss, q_mean, entropy, td_abs.mean()], td_abs


class SACAgent:
    """Policy, twin critics with targets, entropy weight and three Adam optimisers; actions are
    rescaled onto the spec's action bounds (the actors' random warm-up is their explorer's)."""

    def __init__(
        self,
        config: SACConfig,
        spec: SampleSpec,
        *,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self.act_dim = act_dim = sac_act_dim(spec)
        self.action_low, self.action_high = squashed_action_bounds(spec)
        self._device = resolve_device(device if device is not None else config.device)
        # Private generators: seeding must not depend on, or disturb, the process-global RNGs.
        init_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.rng = np.random.default_rng(seed)  # acting: exploration noise and random actions
        self._noise = torch.Generator(device=self._device)  # learning: the policy's reparameterised samples
        if seed is not None:
            self._noise.manual_seed(seed + 1)
        else:
            self._noise.seed()

        obs_dim = math.prod(self.obs_shape)
        self.policy = SquashedGaussianPolicy(obs_dim, act_dim, config.hidden_sizes, init_generator).to(
            self._device
        )
        self.critic = TwinQNetwork(obs_dim, act_dim, config.hidden_sizes, init_generator).to(self._device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self._critic_params = list(self.critic.parameters())
        self._policy_params = list(self.policy.parameters())
        self.policy_optimizer = fused_adam(self.policy.parameters(), lr=config.actor_lr)
        self.critic_optimizer = fused_adam(self.critic.parameters(), lr=config.critic_lr)
        self.target_entropy = float(config.target_entropy if config.target_entropy is not None else -act_dim)
        # alpha is learned as log(alpha), which keeps it positive under unconstrained Adam steps.
        self.log_alpha = torch.tensor(
            math.log(config.alpha), device=self._device, requires_grad=config.autotune
        )
        self.alpha_optimizer = fused_adam([self.log_alpha], lr=config.alpha_lr) if config.autotune else None

        # env action = scale * squashed + shift, and back; kept on the device for update().
        self._actions = SquashedActions(self.action_low, self.action_high, config)
        self._scale_t = torch.as_tensor(self._actions.scale, device=self._device)
        self._shift_t = torch.as_tensor(self._actions.shift, device=self._device)

        self.updates = 0
        self._sync = PublishedModule(self.policy)  # export and load of what actors get
        # actor_loss, alpha_loss, entropy of the latest policy step (NaN until the first one): the
        # metrics of an update that skips the policy step (policy_update_interval > 1) repeat them.
        self._policy_stats = torch.full((3,), float("nan"), device=self._device)
        # CPU acting runs NumpySACPolicy's forward code on views of the policy (see parameter_views).
        self._policy_arrays = parameter_views(self.policy) if self._device.type == "cpu" else None
        self._net = sac_policy_net(config.hidden_sizes, act_dim)  # the policy's table, for numpy
        # The update as CUDA graphs (agent.capture; zmqrl.agents.capture), or None: eager.
        optimizers = [self.critic_optimizer, self.policy_optimizer]
        optimizers += [self.alpha_optimizer] if self.alpha_optimizer is not None else []
        noise = [self._noise] if self._device.type == "cuda" else []
        self._captured = captured_update(
            config.capture, self._static_update, self._device, optimizers, _INPUT_DTYPES, noise
        )

    @property
    def device(self) -> str:
        """Where updates run (``cpu``, ``cuda``, ``cuda:1``), for the learner's log."""
        return str(self._device)

    @property
    def alpha(self) -> float:
        """The entropy weight the next update will use."""
        return float(self.log_alpha.detach().exp())

    # ----------------------------------------------------------------------------------- acting

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Float32 actions ``(B, act_dim)`` in ``[low, high]`` for obs ``(B, *obs_shape)``:
        ``explore=True`` samples the squashed Gaussian, ``explore=False`` is ``tanh(mean)``."""
        return self._actions(self.rng, obs, explore, self._policy_outputs)

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, clamped log_std)`` of the pre-tanh Gaussian as float32 numpy, computed by torch.

        The reference for ``act``'s numpy path; the two agree up to float rounding."""
        with torch.inference_mode():
            mean, log_std = self.policy(self._obs_tensor(obs))
        return mean.cpu().numpy(), log_std.cpu().numpy()

    def _policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``policy_outputs``, through numpy on the CPU (as ``NumpySACPolicy.policy_outputs``)."""
        arrays = self._policy_arrays
        if arrays is None:
            return self.policy_outputs(obs)
        return sac_policy_outputs(self._net, arrays, obs)

    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not obs.flags.writeable:  # torch warns on read-only arrays; obs is tiny, so copy
            obs = obs.copy()
        return torch.from_numpy(obs).to(self._device, non_blocking=True)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> DeferredUpdate:
        """One critic step, then (every ``policy_update_interval`` updates, as many) policy and alpha
        steps; returns the metrics and the rows' TD errors, computed when first read (in one
        device->host transfer).

        ``batch.discount`` already holds ``gamma**k`` (0 on termination). ``importance`` weights the
        critic loss per row (prioritized replay); the result's ``td_errors`` are the mean over the
        two critics of ``|Q_i - target|`` per row.

        A step whose loss or gradients hold NaN or infinity is skipped (``zmqrl.agents.updates``),
        and then the update also leaves the critic targets and its count alone and says
        ``skipped`` (the other steps, each checked on its own, may have been taken).
        """
        if self._captured is not None:
            return self._captured_update(batch, importance)
        columns = [to_device(a, self._device, _INPUT_DTYPES.get(n)) for n, a in batch._asdict().items()]
        weights = None
        if importance is not None:
            check_importance(importance, batch.size)
            weights = to_device(np.asarray(importance), self._device, torch.float32)
        flags, out = self._train(columns, weights, self._policy_turn())
        # The update's one host read of the flags (on an accelerator each step above was skipped,
        # or not, on the device): a non-finite step leaves the targets and the count alone, and
        # the learner knows.
        skipped = any_found(flags)
        self._after_step(skipped)
        policy_stats = self._policy_stats
        return DeferredUpdate(_METRICS, lambda: _metric_tensors(out, policy_stats), skipped=skipped)

    def _captured_update(self, batch: TransitionBatch, importance: np.ndarray | None) -> DeferredUpdate:
        """``update`` as one CUDA graph (``zmqrl.agents.capture``): one graph with the policy and
        alpha steps, one without (``policy_update_interval`` > 1), each replayed on its turn."""
        assert self._captured is not None
        step = self._static_update if self._policy_turn() else self._static_critic_update
        host = self._captured.run(transition_inputs(batch, importance), step)
        skipped = bool(host[0])
        self._after_step(skipped)
        return DeferredUpdate.of_values(_METRICS, host[1:], skipped=skipped)

    def _static_update(self, x: Mapping[str, torch.Tensor], policy_turn: bool = True) -> torch.Tensor:
        """The captured update on the static inputs ``x``, with its policy and alpha steps on
        ``policy_turn``: the eager update's steps, flags kept on the device, outputs packed."""
        columns = [x[name] for name in BATCH_FIELDS]
        flags, out = self._train(columns, x.get("importance"), policy_turn, captured=True)
        found = any_flag(flags)
        scalars, td_abs = _metric_tensors(out, self._policy_stats)
        return pack(found, scalars, td_abs)

    def _static_critic_update(self, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The captured update without a policy step (``policy_update_interval`` > 1, not its turn)."""
        return self._static_update(x, policy_turn=False)

    def _policy_turn(self) -> bool:
        """Whether this update takes the (delayed) policy and alpha steps."""
        return (self.updates + 1) % self.config.policy_update_interval == 0

    def _train(
        self,
        columns: Sequence[torch.Tensor],
        weights: torch.Tensor | None,
        policy_turn: bool,
        captured: bool = False,
    ) -> tuple[list[Flag], _CriticStep]:
        """The critic step on the batch's ``columns`` (``BATCH_FIELDS`` order, on the device),
        its rows' losses weighted by ``weights`` if given, then on ``policy_turn`` as many policy
        and alpha steps as ``policy_update_interval``; returns their skip flags and the critic
        step's tensors. ``captured``: flags stay on the device, the policy's stats are written
        in place."""
        cfg = self.config
        obs, env_actions, rewards, next_obs, discounts = columns
        actions = (env_actions - self._shift_t) / self._scale_t
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
        critic_loss = row_loss.mean() if weights is None else (weights * row_loss).mean()
        flags = [self._step(self.critic_optimizer, critic_loss, self.critic, captured=captured)]

        used_alpha = alpha
        if policy_turn:
            # Delayed policy steps catch up on the ones skipped (as in CleanRL's TD3-style loop).
            for _ in range(cfg.policy_update_interval):
                alpha = self._policy_and_alpha_step(obs, alpha, flags, captured)
        detached = (critic_loss.detach(), q1.detach(), q2.detach(), q1_error.detach(), q2_error.detach())
        return flags, _CriticStep(*detached, used_alpha)

    def _after_step(self, skipped: bool) -> None:
        """Count a step taken and move the critic targets when due (a skipped one does neither)."""
        if not skipped:
            self.updates += 1
            if self.updates % self.config.target_update_interval == 0:
                polyak_update(self.critic_target, self.critic, self.config.tau)

    def _policy_and_alpha_step(
        self, obs: torch.Tensor, alpha: torch.Tensor, flags: list[Flag], captured: bool
    ) -> torch.Tensor:
        """One policy step, then one alpha step (if autotuned); returns the alpha to use next and
        appends their skip flag (``zmqrl.agents.updates``) to ``flags``."""
        # Policy: maximise the soft value min Q(s, a~pi) - alpha * log pi(a|s); the critics are
        # frozen for this backward pass, which then builds no gradients for their weights.
        pi_actions, log_prob = self.policy.sample(obs, self._noise)
        self.critic.requires_grad_(False)
        q_pi = torch.min(*self.critic(obs, pi_actions))
        self.critic.requires_grad_(True)
        actor_loss = (alpha * log_prob - q_pi).mean()
        # Alpha: grow when the policy's entropy (-log pi) is below target, shrink when above. Its
        # loss is -alpha * mean(gap), whose gradient in log(alpha) is the loss itself: checked
        # with the policy step's, one check serves both steps.
        log_prob = log_prob.detach()
        if self.alpha_optimizer is not None:
            alpha_loss = (-self.log_alpha.exp() * (log_prob + self.target_entropy)).mean()
        else:
            alpha_loss = torch.zeros((), device=self._device)
        # Skipped too if the critic step was (flags[0]): its batch is not one to learn from.
        found = self._step(
            self.policy_optimizer, actor_loss, self.policy, also=alpha_loss, after=flags[0], captured=captured
        )
        flags.append(found)
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            step_unless(self.alpha_optimizer, found)
            alpha = self.log_alpha.detach().exp()
        stats = torch.stack([actor_loss.detach(), alpha_loss.detach(), -log_prob.mean()])
        if captured:  # in place: a graph reads the stats where it captured them
            self._policy_stats.copy_(stats)
        else:
            self._policy_stats = stats
        return alpha

    def _step(
        self,
        optimizer: torch.optim.Optimizer,
        loss: torch.Tensor,
        net: nn.Module,
        also: torch.Tensor | None = None,
        after: Flag = False,
        captured: bool = False,
    ) -> Flag:
        """Back-propagate ``loss`` into ``net`` and step, unless ``loss``, a gradient or ``also``
        is not finite or ``after`` is set; returns the flag as
        :func:`zmqrl.agents.updates.guarded_step` does."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = self._critic_params if net is self.critic else self._policy_params
        found, _ = guarded_step(
            optimizer, loss, params, self.config.max_grad_norm, also=also, after=after, captured=captured
        )
        return found

    # ------------------------------------------------------------------------------ weight sync

    def export_weights(self) -> dict[str, np.ndarray]:
        """The policy (the critics stay on the learner) as float32 numpy copies."""
        return self._sync.export()

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act with ``arrays`` (all names and shapes checked first; ValueError changes nothing).
        Critics are untouched."""
        self._sync.load(arrays)

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
            "rng": self.rng.bit_generator.state,
            "noise_device": self._device.type,
            "noise": self._noise.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``; the optimisers keep their saved hyperparameters (torch convention).
        States of earlier releases also hold ``version``, ``dirty`` and ``epsilon``: the learner's
        checkpoint reads the version; the rest no longer means anything to the agent.

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
        if self._captured is not None:
            self._captured.reset()  # the optimisers' state tensors are new: capture again
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
            self._policy_stats.copy_(state["policy_stats"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
        if state["noise_device"] == self._device.type:
            self._noise.set_state(state["noise"].cpu())
