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
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from zmqrl.agents.capture import captured_update, run_update, transition_dtypes, transition_inputs
from zmqrl.agents.configs import SACConfig
from zmqrl.agents.keyed import obs_fields
from zmqrl.agents.keyed_nets import flat_width
from zmqrl.agents.layers import sac_policy_net
from zmqrl.agents.losses import sac_actor_loss, sac_alpha_loss, sac_critic_loss
from zmqrl.agents.nets import fused_adam, polyak_update, resolve_device
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
from zmqrl.agents.updates import DeferredUpdate, Flag, Metrics, guarded_step, step_unless
from zmqrl.spec import SampleSpec
from zmqrl.types import BATCH_FIELDS, TransitionBatch, as_bytes

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
_METRICS = ("critic_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "entropy", "td_abs_mean")
# Device dtypes of a batch's columns (observations keep theirs).
_INPUT_DTYPES = transition_dtypes(torch.float32)


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

        inputs = obs_fields(spec)  # a Dict observation's keys (zmqrl.agents.keyed), or ()
        obs_dim = flat_width(inputs) if inputs else math.prod(self.obs_shape)
        hidden = config.hidden_sizes
        self.policy = SquashedGaussianPolicy(obs_dim, act_dim, hidden, init_generator, inputs).to(
            self._device
        )
        self.critic = TwinQNetwork(obs_dim, act_dim, hidden, init_generator, inputs).to(self._device)
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
        self._net = sac_policy_net(config.hidden_sizes, act_dim, inputs)  # the policy's table, for numpy
        # The update as CUDA graphs (agent.capture; zmqrl.agents.capture), or None: eager.
        optimizers = [self.critic_optimizer, self.policy_optimizer]
        optimizers += [self.alpha_optimizer] if self.alpha_optimizer is not None else []
        noise = [self._noise] if self._device.type == "cuda" else []
        self._captured = captured_update(
            config.capture, self._learn, self._device, optimizers, _INPUT_DTYPES, noise
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
        obs = as_bytes(obs)  # records cross as their bytes (the keyed torso reads them)
        if not obs.flags.writeable:  # torch warns on read-only arrays; obs is tiny, so copy
            obs = obs.copy()
        return torch.from_numpy(obs).to(self._device, non_blocking=True)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> DeferredUpdate:
        """One critic step, then (every ``policy_update_interval`` updates, as many) policy and alpha
        steps (``zmqrl.agents.losses``); returns the metrics and the rows' TD errors, computed when
        first read (in one device->host transfer).

        ``batch.discount`` already holds ``gamma**k`` (0 on termination). ``importance`` weights the
        critic loss per row (prioritized replay); the result's ``td_errors`` are the mean over the
        two critics of ``|Q_i - target|`` per row.

        A step whose loss or gradients hold NaN or infinity is skipped (``zmqrl.agents.updates``),
        and then the update also leaves the critic targets and its count alone and says
        ``skipped`` (the other steps, each checked on its own, may have been taken).
        """
        # A graph per variant when captured: with the policy and alpha steps, and without.
        step = self._learn if self._policy_turn() else self._learn_critic
        inputs = transition_inputs(batch, importance)
        result = run_update(step, inputs, _METRICS, self._captured, self._device, _INPUT_DTYPES)
        if not result.skipped:
            self.updates += 1
            if self.updates % self.config.target_update_interval == 0:
                polyak_update(self.critic_target, self.critic, self.config.tau)
        return result

    def _policy_turn(self) -> bool:
        """Whether this update takes the (delayed) policy and alpha steps."""
        return (self.updates + 1) % self.config.policy_update_interval == 0

    def _learn_critic(self, x: Mapping[str, torch.Tensor], captured: bool) -> tuple[list[Flag], Metrics]:
        """The update without its policy step (``policy_update_interval`` > 1, not its turn)."""
        return self._learn(x, captured, policy_turn=False)

    def _learn(
        self, x: Mapping[str, torch.Tensor], captured: bool, policy_turn: bool = True
    ) -> tuple[list[Flag], Metrics]:
        """The update on the device inputs ``x`` (``zmqrl.agents.capture.UpdateStep``): the critic
        step, then on ``policy_turn`` as many policy and alpha steps as ``policy_update_interval``.
        ``captured``: the policy's stats are written in place."""
        cfg = self.config
        obs, env_actions, rewards, next_obs, discounts = (x[name] for name in BATCH_FIELDS)
        actions = (env_actions - self._shift_t) / self._scale_t
        alpha = self.log_alpha.detach().exp()

        with torch.no_grad():  # the backup's next action, fresh from the current policy
            next_actions, next_log_prob = self.policy.sample(next_obs, self._noise)
            next_q1_target, next_q2_target = self.critic_target(next_obs, next_actions)
        q1, q2 = self.critic(obs, actions)
        critic = sac_critic_loss(
            q1, q2, rewards, discounts, next_q1_target, next_q2_target, next_log_prob, alpha,
            importance=x.get("importance"),
        )
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic.loss.backward()
        found, _ = guarded_step(
            self.critic_optimizer, critic.loss, self._critic_params, cfg.max_grad_norm, captured=captured
        )
        flags = [found]

        used_alpha = alpha
        if policy_turn:
            # Delayed policy steps catch up on the ones skipped (as in CleanRL's TD3-style loop).
            for _ in range(cfg.policy_update_interval):
                alpha = self._policy_and_alpha_step(obs, alpha, flags, captured)
        critic_loss, q1, q2 = critic.loss.detach(), q1.detach(), q2.detach()
        policy_stats = self._policy_stats  # this update's (a later one replaces it when eager)

        def metrics() -> tuple[list[torch.Tensor], torch.Tensor]:
            td_abs = 0.5 * (critic.q1_error.abs() + critic.q2_error.abs())
            actor_loss, alpha_loss, entropy = policy_stats
            q_mean = 0.5 * (q1.mean() + q2.mean())
            return [critic_loss, actor_loss, used_alpha, alpha_loss, q_mean, entropy, td_abs.mean()], td_abs

        return flags, metrics

    def _policy_and_alpha_step(
        self, obs: torch.Tensor, alpha: torch.Tensor, flags: list[Flag], captured: bool
    ) -> torch.Tensor:
        """One policy step, then one alpha step (if autotuned); returns the alpha to use next and
        appends their skip flag (``zmqrl.agents.updates``) to ``flags``."""
        pi_actions, log_prob = self.policy.sample(obs, self._noise)
        # The critics are frozen for the policy's backward pass, which then builds no gradients
        # for their weights.
        self.critic.requires_grad_(False)
        q1_pi, q2_pi = self.critic(obs, pi_actions)
        self.critic.requires_grad_(True)
        actor_loss = sac_actor_loss(q1_pi, q2_pi, log_prob, alpha)
        # The alpha loss's gradient in log(alpha) is the loss itself: checked with the policy
        # step's, one check serves both steps.
        if self.alpha_optimizer is not None:
            alpha_loss = sac_alpha_loss(self.log_alpha, log_prob, self.target_entropy)
        else:
            alpha_loss = torch.zeros((), device=self._device)
        # Skipped too if the critic step was (flags[0]): its batch is not one to learn from.
        self.policy_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        found, _ = guarded_step(
            self.policy_optimizer, actor_loss, self._policy_params, self.config.max_grad_norm,
            also=alpha_loss, after=flags[0], captured=captured,
        )
        flags.append(found)
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            step_unless(self.alpha_optimizer, found)
            alpha = self.log_alpha.detach().exp()
        stats = torch.stack([actor_loss.detach(), alpha_loss.detach(), -log_prob.detach().mean()])
        if captured:  # in place: a graph reads the stats where it captured them
            self._policy_stats.copy_(stats)
        else:
            self._policy_stats = stats
        return alpha

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
