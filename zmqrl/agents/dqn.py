"""DQN (Mnih et al., 2015) with optional double-Q targets (van Hasselt et al., 2016) and dueling heads.

The learner calls ``update`` on n-step batches and publishes ``export_weights``; actors hold a copy
of the same network (``NumpyDQNPolicy``, or this agent for the Nature CNN), ``load_weights`` what
is published and call ``act``. The n-step return and its
discount are computed by the actors' step processor, so ``update`` never sees ``gamma`` or ``n``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from zmqrl.agents.capture import captured_update, run_update, transition_dtypes, transition_inputs
from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.keyed import obs_fields
from zmqrl.agents.layers import dqn_net
from zmqrl.agents.losses import dqn_loss
from zmqrl.agents.nets import QNetwork, annealed_lr, fused_adam, on_device, polyak_update, resolve_device
from zmqrl.agents.numpy_policies import PublishedModule, dqn_q_values, parameter_views
from zmqrl.agents.updates import DeferredUpdate, Flag, Metrics, backward_step
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch, as_bytes

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
_METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm", "target_q_mean")
# Device dtypes of a batch's columns (observations keep theirs).
_INPUT_DTYPES = transition_dtypes(torch.int64)


class DQNAgent:
    """Online and target Q-networks, an Adam optimiser and greedy acting (epsilon-random rows are
    the actor's explorer's)."""

    def __init__(
        self,
        config: DQNConfig,
        spec: SampleSpec,
        *,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        config.check()
        if spec.num_actions is None:
            raise ValueError("DQN needs a Discrete action space (spec.num_actions)")
        n_actions = spec.num_actions
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self.n_actions = n_actions
        self._device = resolve_device(device if device is not None else config.device)
        # Private generator: seeding must not depend on, or disturb, the process-global RNGs.
        init_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        inputs = obs_fields(spec)  # a Dict observation's keys (zmqrl.agents.keyed), or ()

        self.online = QNetwork(
            self.obs_shape,
            config.hidden_sizes,
            n_actions,
            config.dueling,
            generator=init_generator,
            torso=config.torso,
            masked=spec.action_mask,
            inputs=inputs,
        ).to(self._device)
        self._masked = spec.action_mask
        self._net = dqn_net(config.torso, config.hidden_sizes, n_actions, config.dueling, inputs)  # the table
        self._target = copy.deepcopy(self.online).requires_grad_(False)
        # True after an import until the target is first used: see the ``target`` property.
        self._target_behind = False
        self.optimizer = fused_adam(self.online.parameters(), lr=config.lr, eps=config.adam_eps)

        self.updates = 0
        self._sync = PublishedModule(self.online)  # export and load of what actors get
        self._params = list(self.online.parameters())
        self._one_pass = config.double and config.torso == "mlp"  # see _online_q
        # True while target == online exactly (fresh, just loaded or hard-copied): an actor's
        # initial_priorities then needs one forward pass over obs and next_obs together, not two.
        self._target_is_online = True
        self._on_cpu = self._device.type == "cpu"
        # CPU acting runs NumpyDQNPolicy's forward code on views of the network's weights (see
        # parameter_views), for the MLP and the small MinAtar CNN. The Nature CNN's convolutions stay
        # with torch: fast there, and the dispatch overhead negligible next to them.
        mirror = self._on_cpu and self._net.numpy_acting
        self._online_arrays = parameter_views(self.online) if mirror else None
        self._target_arrays = parameter_views(self.target) if mirror else None
        # The update as one CUDA graph (agent.capture; zmqrl.agents.capture), or None: eager.
        self._captured = captured_update(
            config.capture, self._learn, self._device, [self.optimizer], _INPUT_DTYPES
        )

    @property
    def device(self) -> str:
        """Where updates run (``cpu``, ``cuda``, ``cuda:1``), for the learner's log."""
        return str(self._device)

    @property
    def target(self) -> QNetwork:
        """The target Q-network. ``load_weights`` makes it equal to the online network, but the
        copy is made here, on first use after the load: an actor that only acts never uses it
        (its ``initial_priorities`` take the target to be the online net), and copying the Nature
        CNN's weights on every load cost an actor more than the load itself."""
        if self._target_behind:
            self._target.load_state_dict(self.online.state_dict())
            self._target_behind = False
        return self._target

    # ----------------------------------------------------------------------------------- acting

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Greedy int64 actions ``(B,)`` for obs ``(B, *obs_shape)``, whatever ``explore`` says:
        DQN explores only by the epsilon-random rows of the actor's explorer."""
        if self._online_arrays is not None:
            return self._numpy_q_values(self._online_arrays, obs).argmax(axis=1).astype(np.int64, copy=False)
        with torch.inference_mode():
            q = self.online(self._obs_tensor(obs))
            actions = q.argmax(dim=1)
        return actions.cpu().numpy()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Online-network action values ``(B, n_actions)`` as float32 numpy, computed by torch.

        The reference for ``act``'s numpy path; the two agree up to float rounding (exact ties aside).
        """
        with torch.inference_mode():
            q = self.online(self._obs_tensor(obs))
        return q.cpu().numpy()

    def _numpy_q_values(self, arrays: dict[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
        """The Q-network's values in numpy, as ``NumpyDQNPolicy.q_values`` computes them."""
        return dqn_q_values(self._net, arrays, obs, self._masked)

    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        obs = as_bytes(obs)  # records cross as their bytes (the keyed torso reads them)
        if not obs.flags.writeable:  # torch warns on read-only arrays; obs is tiny, so copy
            obs = obs.copy()
        tensor = torch.from_numpy(obs)
        return tensor if self._on_cpu else tensor.to(self._device, non_blocking=True)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> DeferredUpdate:
        """One Adam step on the Huber TD loss (``zmqrl.agents.losses.dqn_loss``); returns its
        pre-step metrics and the rows' ``|td_target - q_taken|`` (the new priorities), computed
        when first read, in a single device->host transfer.

        A loss or gradient holding NaN or infinity skips the step (``zmqrl.agents.updates``): no
        parameter, optimiser state, target network or update count changes, and the result's
        ``skipped`` is True.

        ``batch.discount`` already holds ``gamma**k`` (0 on termination), so it is not multiplied
        by gamma again here. ``importance`` (prioritized replay's bias correction, ``(B,)``) weights
        each row's loss.
        """
        if self.config.lr_final is not None:
            self._set_lr(self.current_lr())
        self.target  # noqa: B018  (a load_weights' copy, made before the update reads the target)
        inputs = transition_inputs(batch, importance)
        result = run_update(self._learn, inputs, _METRICS, self._captured, self._device, _INPUT_DTYPES)
        self._after_step(result.skipped)
        return result

    def _learn(self, x: Mapping[str, torch.Tensor], captured: bool) -> tuple[list[Flag], Metrics]:
        """The update on the device inputs ``x`` (``zmqrl.agents.capture.UpdateStep``): the
        networks' values, the loss and the guarded step."""
        q, next_online = self._online_q(x["obs"], x["next_obs"])
        with torch.no_grad():
            next_target = self.target(x["next_obs"])
            if self.config.double and next_online is None:
                next_online = self.online(x["next_obs"])
        out = dqn_loss(q, x["action"], x["reward"], x["discount"], next_target, next_online,
                       self.config.huber_delta, x.get("importance"))  # fmt: skip
        found, grad_norm = backward_step(
            self.optimizer, out.loss, self._params, self.config.max_grad_norm, captured=captured
        )
        loss = out.loss.detach()

        def metrics() -> tuple[list[torch.Tensor], torch.Tensor]:
            td_abs = out.td_error.abs()
            return [loss, out.old_val.mean(), td_abs.mean(), grad_norm, out.target_max.mean()], td_abs

        return [found], metrics

    def _after_step(self, skipped: bool) -> None:
        """Count a step taken and move the target network when due (a skipped one does neither)."""
        if skipped:
            return
        cfg = self.config
        self.updates += 1
        self._target_is_online = False
        if self.updates % cfg.target_update_interval == 0:
            polyak_update(self.target, self.online, cfg.tau)
            self._target_is_online = cfg.tau >= 1.0

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray:
        """``|TD error|`` per row ``(B,)`` float32 under the current weights, with ``update``'s target.

        Ape-X actors send these with fresh transitions so that replay need not give every new row
        the largest priority seen. No gradient; on CPU with the MLP or MinAtar CNN torso it runs in
        numpy. An actor's target equals its online net (both are overwritten by ``load_weights``),
        so one forward pass over ``obs`` and ``next_obs`` together serves both nets.
        """
        if self._online_arrays is not None and self._target_arrays is not None:
            return self._numpy_priorities(batch, self._online_arrays, self._target_arrays)
        with torch.inference_mode():
            x = on_device(batch._asdict(), self._device, _INPUT_DTYPES)
            obs, next_obs, next_online = x["obs"], x["next_obs"], None
            if self._target_is_online:  # the online argmax, valued by the same net, is the max
                q_both = self.online(torch.cat([obs, next_obs]))
                q, next_target = q_both[: batch.size], q_both[batch.size :]
            else:
                q, next_target = self.online(obs), self.target(next_obs)
                next_online = self.online(next_obs) if self.config.double else None
            out = dqn_loss(q, x["action"], x["reward"], x["discount"], next_target, next_online)
            return out.td_error.abs().cpu().numpy()

    def _numpy_priorities(
        self, batch: TransitionBatch, online: dict[str, np.ndarray], target: dict[str, np.ndarray]
    ) -> np.ndarray:
        n = batch.size
        rows = np.arange(n)
        q_both = self._numpy_q_values(online, np.concatenate([batch.obs, batch.next_obs]))
        q_taken, next_q = q_both[rows, batch.action], q_both[n:]
        if self._target_is_online:  # the online argmax, valued by the same net, is the max
            target_q = next_q.max(axis=1)
        else:
            target_values = self._numpy_q_values(target, batch.next_obs)
            picked = next_q.argmax(axis=1) if self.config.double else target_values.argmax(axis=1)
            target_q = target_values[rows, picked]
        td_target = batch.reward + batch.discount * target_q
        return np.abs(td_target - q_taken).astype(np.float32, copy=False)

    def _online_q(
        self, obs: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The online net's Q-values of ``obs`` (for the gradient) and, when double DQN needs them,
        of ``next_obs`` (detached; None: not computed here).

        With the MLP torso both come from one forward pass over the two batches stacked: what a
        small net's update costs is Python's per-call overhead, not arithmetic (docs/performance.md,
        "Figures behind the agents' code"). A CNN keeps two passes: stacked, its backward pass would
        run the convolutions over twice the rows.
        """
        if not self._one_pass:
            return self.online(obs), None
        n = obs.shape[0]
        both = self.online(torch.cat([obs, next_obs]))
        return both[:n], both[n:].detach()

    def current_lr(self) -> float:
        """Learning rate for the next update: ``lr``, annealed linearly to ``lr_final`` if set.

        Annealing lets a policy that has learned settle instead of oscillating (DQN on
        CartPole is prone to late collapses at a constant, large step size)."""
        cfg = self.config
        return annealed_lr(cfg.lr, cfg.lr_final, cfg.lr_decay_updates, self.updates)

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------------------------ weight sync

    def export_weights(self) -> dict[str, np.ndarray]:
        """The online Q-network as float32 numpy copies."""
        return self._sync.export()

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act with ``arrays`` (all names and shapes checked first; ValueError changes nothing)."""
        self._sync.load(arrays)
        self._target_behind = True  # copied from the online net when first used (see ``target``)
        self._target_is_online = True

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as tensors and python scalars (safe for ``weights_only`` loads).

        Like ``nn.Module.state_dict``, tensors are live references: save it before training further.
        """
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``; the optimiser keeps its saved hyperparameters (torch convention).

        States of earlier releases also hold ``version``, ``dirty``, ``epsilon`` and ``rng``: the
        learner's checkpoint reads the version; the rest no longer means anything to the agent."""
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self._target_is_online = False  # not known to hold; the slower exact path is always right
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        if self._captured is not None:
            self._captured.reset()  # the optimiser's state tensors are new: capture again
