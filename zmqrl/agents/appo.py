"""Asynchronous PPO on V-trace targets (APPO); with ``clip: null``, IMPALA (Espeholt et al., 2018).

Actors sample from the policy network alone (``NumpyAPPOPolicy``; this agent on the CPU for the
Nature CNN, see ``zmqrl.agents.builtin.make_appo_policy``) and send rollouts with the
log-probability of every action they took; the learner trains the policy and a separate value
network on batches of them (``update``), and publishes the policy (``export_weights``).

One update, in order:

1. Values of every observation of the batch (``obs``, ``R x (T+1)``, and the ``final_obs`` the
   truncated steps were cut at) and the current policy's log-probabilities of the actions taken.
2. A truncated step's reward gets ``gamma * V(final_obs)``, its bootstrap (the next observation
   in its row is the next episode's); a terminated step bootstraps nothing. Every done step's
   discount is 0, the others' ``gamma``.
3. V-trace (``zmqrl.agents.vtrace``) with the current policy as target and the actors' as
   behaviour: value targets ``vs`` and advantages, once per batch, before any step (all epochs
   train towards the same targets, as PPO computes its advantages once per batch).
4. ``epochs`` passes of ``minibatches`` Adam steps each (at most one per rollout), on shuffled
   slices of the batch's rollouts (rows):
   PPO's clipped surrogate with ratio ``pi_new / mu`` (``clip: null``: IMPALA's ``-logp * adv``),
   ``vf_coef * 0.5 (V - vs)^2``, ``-ent_coef * entropy``, one global gradient-norm clip.

When ``minibatches`` is 1, the first epoch's step back-propagates through the forward pass of
step 1 (computed with gradient, its outputs detached for the targets): the same numbers, one
forward pass fewer (measured on a CPU, CartPole's 64x64 networks, 1024 steps: 3.0 -> 2.5 ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from zmqrl.agents.appo_nets import APPOPolicyNet, ValueNet
from zmqrl.agents.appo_policy import APPOActions, appo_net, policy_heads
from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.nets import annealed_lr, fused_adam, resolve_device, to_device
from zmqrl.agents.numpy_policies import PublishedModule, parameter_views
from zmqrl.agents.updates import DeferredUpdate, Flag, any_found, guarded_step
from zmqrl.agents.vtrace import LOG_RATIO_LIMIT, VTraceReturns, vtrace
from zmqrl.spec import SampleSpec
from zmqrl.types import Batch, RolloutBatch

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
# The first seven are means over the update's minibatch steps (each measured before its step).
_STEP_METRICS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "ratio_mean",
    "grad_norm",
)
_METRICS = (*_STEP_METRICS, "rho_mean", "advantage_mean", "value_mean", "lr", "skipped_minibatches")
# Stream of the seed's generator that shuffles rollouts into minibatches (apart from acting's).
SHUFFLE_STREAM = 2
# Added to the advantages' standard deviation before dividing by it (a constant minibatch).
ADVANTAGE_EPS = 1e-8


class _Rollouts(NamedTuple):
    """A RolloutBatch's columns as tensors on the agent's device."""

    obs: torch.Tensor  # (R, T + 1, *obs_shape)
    actions: torch.Tensor  # (R, T) int64 or (R, T, act_dim) float32
    behaviour: torch.Tensor  # (R, T) the actors' log-probabilities
    rewards: torch.Tensor  # (R, T)
    terminated: torch.Tensor  # (R, T) bool
    truncated: torch.Tensor  # (R, T) bool
    final_obs: torch.Tensor  # (K, *obs_shape)


class _FirstPass(NamedTuple):
    """The forward pass over a whole batch and the targets computed from it."""

    logp: torch.Tensor  # (R * T,) the current policy's log-probabilities of the actions
    entropy: torch.Tensor  # (R * T,)
    values: torch.Tensor  # (R, T) V(obs[:, :T])
    targets: VTraceReturns


class APPOAgent:
    """Policy and value networks under one Adam optimiser; acts by sampling the policy."""

    def __init__(
        self,
        config: APPOConfig,
        spec: SampleSpec,
        *,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self._net = appo_net(config, spec)  # the policy's table (checks the spec), for numpy acting
        self._device = resolve_device(device if device is not None else config.device)
        # Private generators: seeding must not depend on, or disturb, the process-global RNGs.
        init_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.rng = np.random.default_rng(seed)  # acting draws, in NumpyAPPOPolicy's order
        self._shuffle = np.random.default_rng(None if seed is None else [seed, SHUFFLE_STREAM])

        self._actions = APPOActions(spec)
        bounds = (self._actions.low, self._actions.high)
        policy = APPOPolicyNet(self._net, self.obs_shape, config.log_std_init, init_generator, bounds)
        self.policy = policy.to(self._device)
        self.value = ValueNet(self._net, self.obs_shape, init_generator).to(self._device)
        self._params = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = fused_adam(self._params, lr=config.lr, eps=config.adam_eps)
        self.updates = 0
        self._sync = PublishedModule(self.policy)  # export and load of what actors get
        # CPU acting runs NumpyAPPOPolicy's forward code on views of the policy (see parameter_views)
        # where the table says numpy is cheap; the Nature CNN's convolutions stay with torch.
        numpy_acting = self._device.type == "cpu" and self._net.numpy_acting
        self._policy_arrays = parameter_views(self.policy) if numpy_acting else None

    @property
    def device(self) -> str:
        """Where updates run (``cpu``, ``cuda``, ``cuda:1``), for the learner's log."""
        return str(self._device)

    # ----------------------------------------------------------------------------------- acting

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, None)`` or ``(mean, log_std)`` as float32 numpy: through numpy on views of
        the policy on a CPU (as ``NumpyAPPOPolicy``) for the MLP and MinAtar CNN, through torch
        elsewhere (observations cross in their own dtype: uint8 frames are widened on the device)."""
        if self._policy_arrays is not None:
            return policy_heads(self._net, self._policy_arrays, obs)
        with torch.inference_mode():
            out, log_std = self.policy(to_device(np.asarray(obs), self._device))
        return out.cpu().numpy(), None if log_std is None else log_std.cpu().numpy()

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions for obs ``(B, *obs_shape)`` and their log-probabilities ``(B,)`` float32."""
        return self._actions.sample(self.rng, *self.policy_outputs(obs))

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Sampled actions (``explore``) or the greedy ones (argmax, or the clipped mean)."""
        if explore:
            return self.sample(obs)[0]
        return self._actions.greedy(*self.policy_outputs(obs))

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: Batch, importance: np.ndarray | None = None) -> DeferredUpdate:
        """Train on ``batch`` (rollouts; see the module docstring for the steps); returns the
        metrics, computed when first read in one device->host transfer, and zero ``td_errors``
        ``(R,)`` (nothing is prioritized on-policy).

        Non-finite numbers (``zmqrl.agents.updates``): when the batch or its targets hold a NaN
        or infinity (a reward, an observation, a log-probability) every step is refused and the
        update changes nothing. Otherwise a minibatch whose own loss or gradient is not finite
        (the networks' own overflow) has its step refused, and the steps before it stay taken.
        Either way the result says ``skipped``, the update count stays, and
        ``skipped_minibatches`` counts the refused steps.
        """
        if importance is not None:
            raise ValueError("APPOAgent takes no importance weights (on-policy rollouts are not prioritized)")
        cfg, dev = self.config, self._device
        data = self._tensors(batch)
        rows, steps = data.rewards.shape
        lr = self.current_lr()
        if cfg.lr_final is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        slices = min(cfg.minibatches, rows)
        reuse = slices == 1
        # Steps 1-3, with gradient only when the first step reuses the forward pass.
        first = self._first_pass(data, grad=reuse)
        targets = first.targets
        bad_data = self._nonfinite(data, targets)

        # 4. The steps, each on a slice of the rows (all of them when slices == 1).
        flags: list[Flag] = []
        stats: list[torch.Tensor] = []
        for epoch in range(cfg.epochs):
            picks: list[torch.Tensor | slice] = [slice(None)]
            if slices > 1:
                picks = list(torch.from_numpy(self._shuffle.permutation(rows)).to(dev).tensor_split(slices))
            for picked in picks:
                if reuse and epoch == 0:
                    now = (first.logp, first.entropy, first.values)
                else:
                    mb_obs = data.obs[picked, :steps].flatten(0, 1)
                    now = (
                        *self.policy.log_prob_entropy(mb_obs, data.actions[picked].flatten(0, 1)),
                        self.value(mb_obs),
                    )
                found, step_stats = self._step(
                    *now,
                    data.behaviour[picked].reshape(-1),
                    targets.vs[picked].reshape(-1),
                    targets.pg_advantages[picked].reshape(-1),
                    bad_data,
                )
                flags.append(found)
                stats.append(step_stats)

        # The update's one host read of the flags (on an accelerator each step was refused, or
        # not, on the device): the learner must know, and a refused update does not count.
        skipped = any_found(flags)
        if not skipped:
            self.updates += 1

        values = first.values.detach()

        def metrics() -> tuple[list[torch.Tensor], torch.Tensor]:
            means = torch.stack(stats).mean(dim=0)
            refused = torch.stack([torch.as_tensor(f, dtype=torch.float32, device=dev) for f in flags]).sum()
            extra = [targets.rhos.mean(), targets.pg_advantages.mean(), values.mean()]
            scalars = [*means.unbind(), *extra, torch.tensor(lr, device=dev), refused]
            return scalars, torch.zeros(rows, device=dev)  # no priorities on-policy

        return DeferredUpdate(_METRICS, metrics, skipped=skipped)

    def targets(self, batch: RolloutBatch) -> VTraceReturns:
        """V-trace targets of ``batch`` under the current networks, exactly as ``update`` computes
        them before its steps (steps 1-3 of the module docstring)."""
        return self._first_pass(self._tensors(batch), grad=False).targets

    def _tensors(self, batch: Batch) -> _Rollouts:
        """``batch``'s columns on the device, after the checks the update relies on."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"APPOAgent trains on RolloutBatch, got {type(batch).__name__}")
        if int(np.count_nonzero(batch.truncated)) != len(batch.final_obs):
            raise ValueError(
                f"final_obs has {len(batch.final_obs)} rows, one per truncated step is "
                f"{np.count_nonzero(batch.truncated)}"
            )
        dev = self._device
        return _Rollouts(
            obs=to_device(batch.obs, dev),
            actions=to_device(batch.action, dev, torch.int64 if self.policy.discrete else torch.float32),
            behaviour=to_device(batch.logp, dev, torch.float32),
            rewards=to_device(batch.reward, dev, torch.float32),
            terminated=to_device(batch.terminated, dev, torch.bool),
            truncated=to_device(batch.truncated, dev, torch.bool),
            final_obs=to_device(batch.final_obs, dev),
        )

    @torch.no_grad()
    def _nonfinite(self, data: _Rollouts, targets: VTraceReturns) -> Flag:
        """Whether the batch's float columns or its targets hold a NaN or infinity (or sum past
        float32's range), as a :data:`zmqrl.agents.updates.Flag`: then no step is taken.

        Checked as a whole, before any step: a bad value poisons only the minibatches that hold
        its row (an infinite observation saturates tanh, finite forward, NaN gradient), so the
        steps on the other rows would otherwise change the weights of an update that says
        ``skipped``.
        """
        columns = [targets.vs, targets.pg_advantages, data.behaviour, data.obs, data.final_obs, data.actions]
        sums = [t.sum().to(torch.float32) for t in columns if t.is_floating_point() and t.numel()]
        total = torch.stack(sums).sum()
        return not math.isfinite(total.item()) if total.device.type == "cpu" else ~torch.isfinite(total)

    def _first_pass(self, data: _Rollouts, grad: bool) -> _FirstPass:
        """Steps 1-3: one forward pass of both networks over the whole batch (with gradient if
        ``grad``, for the first step to reuse), and the V-trace targets from it."""
        cfg = self.config
        rows, steps = data.rewards.shape
        with torch.set_grad_enabled(grad):
            # 1. Values of every observation (obs and final_obs in one pass), and the current
            # policy's log-probabilities of the actions taken.
            all_values = self.value(torch.cat([data.obs.flatten(0, 1), data.final_obs]))
            row_values = all_values[: rows * (steps + 1)].reshape(rows, steps + 1)
            logp, entropy = self.policy.log_prob_entropy(
                data.obs[:, :steps].flatten(0, 1), data.actions.flatten(0, 1)
            )
        with torch.no_grad():
            values = row_values.detach()
            # 2. Truncations bootstrap from final_obs (row-major, as RolloutBatch orders them).
            bootstraps = torch.zeros_like(data.rewards)
            bootstraps[data.truncated] = all_values[rows * (steps + 1) :].detach()
            rewards = data.rewards + cfg.gamma * bootstraps * (~data.terminated)  # termination wins
            discounts = cfg.gamma * (~(data.terminated | data.truncated)).to(torch.float32)
            # 3. V-trace, the current policy as target.
            targets = vtrace(
                data.behaviour,
                logp.detach().reshape(rows, steps),
                rewards,
                discounts,
                values[:, :steps],
                values[:, steps],
                cfg.rho_bar,
                cfg.c_bar,
                cfg.pg_rho_bar,
            )
        return _FirstPass(logp, entropy, row_values[:, :steps], targets)

    def _step(
        self,
        logp: torch.Tensor,
        entropy: torch.Tensor,
        values: torch.Tensor,
        behaviour: torch.Tensor,
        vs: torch.Tensor,
        advantages: torch.Tensor,
        bad_data: Flag,
    ) -> tuple[Flag, torch.Tensor]:
        """One Adam step on a minibatch's loss, refused if it or a gradient is not finite or the
        batch was not (``bad_data``); returns the refusal flag and the step's metrics."""
        cfg = self.config
        log_ratio = (logp - behaviour).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        ratio = log_ratio.exp()
        if cfg.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + ADVANTAGE_EPS)
        if cfg.clip is None:  # IMPALA: the advantages already carry the truncated importance weights
            policy_loss = -(logp * advantages).mean()
        else:
            clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)
            policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
        value_loss = 0.5 * (values.reshape(-1) - vs).square().mean()
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self._params if p.grad is not None]
        found, grad_norm = guarded_step(self.optimizer, loss, params, cfg.max_grad_norm, after=bad_data)
        with torch.no_grad():
            if grad_norm is None:  # clipping off: the metric, kept unread
                grad_norm = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
                )
            approx_kl = ((ratio - 1.0) - log_ratio).mean()  # Schulman's k3 estimator of KL(mu || pi)
            if cfg.clip is None:
                clip_fraction = torch.zeros((), device=ratio.device)
            else:
                clip_fraction = ((ratio - 1.0).abs() > cfg.clip).to(torch.float32).mean()
            step_stats = torch.stack(
                [policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction, ratio.mean(), grad_norm]
            ).detach()
        return found, step_stats

    def current_lr(self) -> float:
        """Learning rate for the next update: ``lr``, annealed linearly to ``lr_final`` over
        ``lr_decay_updates`` updates if set (as DQN's)."""
        cfg = self.config
        return annealed_lr(cfg.lr, cfg.lr_final, cfg.lr_decay_updates, self.updates)

    # ------------------------------------------------------------------------------ weight sync

    def export_weights(self) -> dict[str, np.ndarray]:
        """The policy (the value network stays on the learner) as float32 numpy copies."""
        return self._sync.export()

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act with ``arrays`` (all names and shapes checked first; ValueError changes nothing).
        The value network is untouched."""
        self._sync.load(arrays)

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume identically, as tensors and python scalars (safe for
        ``weights_only`` loads). Like ``nn.Module.state_dict``, tensors are live references."""
        return {
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "rng": self.rng.bit_generator.state,
            "shuffle": self._shuffle.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``, in place (the acting views stay valid); the optimiser keeps
        its saved hyperparameters (torch convention)."""
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
        self._shuffle.bit_generator.state = state["shuffle"]
