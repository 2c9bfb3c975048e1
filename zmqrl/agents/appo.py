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
forward pass fewer (docs/performance.md, "Figures behind the agents' code").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from zmqrl.agents.appo_batch import (
    Rollouts,
    as_rollouts,
    column_dtypes,
    final_capacity,
    first_pass,
    nonfinite,
    padded,
    rollout_arrays,
)
from zmqrl.agents.appo_nets import APPOPolicyNet, ValueNet
from zmqrl.agents.appo_policy import APPOActions, CoreActing, CoreState, appo_net, policy_heads
from zmqrl.agents.appo_rnn import RecurrentValue, recurrent_outputs
from zmqrl.agents.capture import captured_update, run_update
from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.losses import appo_loss
from zmqrl.agents.nets import annealed_lr, fused_adam, on_device, resolve_device, to_device
from zmqrl.agents.numpy_policies import PublishedModule, parameter_views
from zmqrl.agents.updates import DeferredUpdate, Flag, Metrics, backward_step
from zmqrl.agents.vtrace import VTraceReturns
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


class APPOAgent(CoreActing):
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
        self._masked = spec.action_mask
        policy = APPOPolicyNet(
            self._net, self.obs_shape, config.log_std_init, init_generator, bounds, masked=self._masked
        )
        self.policy = policy.to(self._device)
        # A recurrent policy's value reads its core's h (zmqrl.agents.appo_rnn).
        core = self._net.core
        value = (
            RecurrentValue(
                self.obs_shape, core, config.hidden_sizes, init_generator, config.torso, self._net.inputs
            )
            if core
            else None
        )
        self.value = (value or ValueNet(self._net, self.obs_shape, init_generator)).to(self._device)
        self._core = CoreState(self._net.core) if self._net.core else None  # acting state
        self._params = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = fused_adam(self._params, lr=config.lr, eps=config.adam_eps)
        self.updates = 0
        self._sync = PublishedModule(self.policy)  # export and load of what actors get
        # CPU acting runs NumpyAPPOPolicy's forward code on views of the policy (see parameter_views)
        # where the table says numpy is cheap; the Nature CNN's convolutions stay with torch.
        numpy_acting = self._device.type == "cpu" and self._net.numpy_acting
        self._policy_arrays = parameter_views(self.policy) if numpy_acting else None
        self._dtypes = {**column_dtypes(self.policy.discrete), "perm": torch.int64}
        # The update as one CUDA graph (agent.capture; zmqrl.agents.capture), or None: eager.
        self._captured = captured_update(
            config.capture, self._learn, self._device, [self.optimizer], self._dtypes
        )

    @property
    def device(self) -> str:
        """Where updates run (``cpu``, ``cuda``, ``cuda:1``), for the learner's log."""
        return str(self._device)

    # ----------------------------------------------------------------------------------- acting

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, None)`` or ``(mean, log_std)`` as float32 numpy: through numpy on views of
        the policy on a CPU (as ``NumpyAPPOPolicy``) for the MLP and MinAtar CNN, through torch
        elsewhere (observations cross in their own dtype: uint8 frames are widened on the device).
        A recurrent policy's acting state advances one step."""
        if self._policy_arrays is not None:
            return policy_heads(self._net, self._policy_arrays, obs, self._core, self._masked)
        with torch.inference_mode():
            x = to_device(np.asarray(obs), self._device)
            if self._core is None:
                out, log_std = self.policy(x)
            else:
                state = torch.as_tensor(self._core.rows(len(obs)), device=self._device)
                h, c = self.policy.cell(self.policy.features(x), (state[:, 0], state[:, 1]))
                self._core.state[:] = torch.stack([h, c], 1).cpu().numpy()
                out, log_std = self.policy.masked_outputs(h, x)  # h's heads, the row's legal actions
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
        cfg = self.config
        arrays = rollout_arrays(batch, self._net.core)  # checked before anything changes
        rows = len(arrays["reward"])
        if cfg.lr_final is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.current_lr()
        if min(cfg.minibatches, rows) > 1:  # step 4's shuffles: a permutation of the rows per epoch
            arrays["perm"] = np.stack([self._shuffle.permutation(rows) for _ in range(cfg.epochs)])
        if self._captured is not None:  # a graph's shapes are fixed: final_obs padded to a capacity
            arrays = padded(arrays, final_capacity(len(arrays["final_obs"]), rows))
        result = run_update(self._learn, arrays, _METRICS, self._captured, self._device, self._dtypes)
        if not result.skipped:
            self.updates += 1
        return result

    def targets(self, batch: RolloutBatch) -> VTraceReturns:
        """V-trace targets of ``batch`` under the current networks, exactly as ``update`` computes
        them before its steps (steps 1-3 of the module docstring)."""
        return first_pass(self.policy, self.value, self.config, self._tensors(batch), grad=False).targets

    def _tensors(self, batch: Batch) -> Rollouts:
        """``batch``'s columns on the device, after the checks the update relies on."""
        return as_rollouts(self._on_device(rollout_arrays(batch, self._net.core)))

    def _on_device(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return on_device(arrays, self._device, self._dtypes)

    def _learn(self, x: Mapping[str, torch.Tensor], captured: bool) -> tuple[list[Flag], Metrics]:
        """Steps 1-4 on the batch's device inputs ``x`` (``appo_batch.COLUMNS``, and ``perm``, the
        rows' order per epoch, when there are several minibatches): ``zmqrl.agents.capture``'s
        ``UpdateStep``. Returns each step's refusal flag and the update's metrics."""
        cfg = self.config
        data = as_rollouts(dict(x))
        rows, steps = data.rewards.shape
        slices = min(cfg.minibatches, rows)
        # Steps 1-3, with gradient only when the first step reuses the forward pass.
        first = first_pass(self.policy, self.value, cfg, data, grad=slices == 1)
        targets = first.targets
        bad_data = nonfinite(data, targets, captured, self._net.inputs)

        # 4. The steps, each on a slice of the rows (all of them when slices == 1).
        flags: list[Flag] = []
        stats: list[torch.Tensor] = []
        for epoch in range(cfg.epochs):
            picks = [slice(None)] if slices == 1 else list(x["perm"][epoch].tensor_split(slices))
            for picked in picks:
                if slices == 1 and epoch == 0:
                    logp, entropy, values = first.logp, first.entropy, first.values
                elif self._net.core:  # each picked row unrolled again from its start state
                    rnn = recurrent_outputs(self.policy, self.value, data, picked, finals=False)  # type: ignore[arg-type]
                    logp, entropy, values = rnn.logp, rnn.entropy, rnn.row_values[:, :steps]
                else:
                    mb_obs = data.obs[picked, :steps].flatten(0, 1)
                    logp, entropy = self.policy.log_prob_entropy(mb_obs, data.actions[picked].flatten(0, 1))
                    values = self.value(mb_obs)
                behaviour, vs = data.behaviour[picked].reshape(-1), targets.vs[picked].reshape(-1)
                advantages = targets.pg_advantages[picked].reshape(-1)
                out = appo_loss(logp, entropy, values.reshape(-1), behaviour, vs, advantages,
                                cfg.clip, cfg.vf_coef, cfg.ent_coef, cfg.normalize_advantages)  # fmt: skip
                found, grad_norm = backward_step(
                    self.optimizer, out.loss, self._params, cfg.max_grad_norm, after=bad_data,
                    captured=captured,
                )
                flags.append(found)
                with torch.no_grad():  # in _STEP_METRICS order
                    terms = [out.policy_loss, out.value_loss, out.entropy, out.approx_kl, out.clip_fraction]
                    stats.append(torch.stack([*terms, out.ratio_mean, grad_norm]))
        lr = self.optimizer.param_groups[0]["lr"]  # a device tensor while captured

        def metrics() -> tuple[list[torch.Tensor], torch.Tensor]:
            dev = self._device
            means = torch.stack(stats).mean(dim=0)
            refused = torch.stack([torch.as_tensor(f, dtype=torch.float32, device=dev) for f in flags]).sum()
            extra = [targets.rhos.mean(), targets.pg_advantages.mean(), first.values.detach().mean()]
            lr_tensor = torch.as_tensor(lr, dtype=torch.float32, device=dev)
            return [*means.unbind(), *extra, lr_tensor, refused], torch.zeros_like(first.values[:, 0])

        return flags, metrics

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
        if self._captured is not None:
            self._captured.reset()  # the optimiser's state tensors are new: capture again
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
        self._shuffle.bit_generator.state = state["shuffle"]
