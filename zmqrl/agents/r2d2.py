"""Recurrent DQN on replayed sequences (R2D2, Kapturowski et al., 2019): the learner's side.

Each sampled window (``zmqrl.types.SequenceBatch``) starts from the core state its actor acted
with; the update unrolls the online and the target network from that state, the first ``burn_in``
positions without gradient (they only bring the state up to date with the network being trained),
and takes the loss of ``zmqrl.agents.losses.r2d2_loss`` on the rest: n-step double-Q targets inside
the window. Windows never cross an episode's end, so no state is reset inside the unroll; padding
positions (before an episode's first step, after its last) leave the state as it was. Each
window's new priority is the paper's mix of its max and mean |TD error|. A masked run's networks
set the Q-values of each position's illegal actions (those of its own observation row) to
``zmqrl.agents.masks.MASKED_VALUE``, so greedy acting and the target's argmax and max see legal
actions only; a terminal observation with none is read only times a zero discount.

Actors act with ``zmqrl.agents.r2d2_policy.NumpyR2D2Policy``; this agent acts the same way in
torch (the reference the tests hold the numpy policy to, what ``load_policy`` may use, and the
actors' policy under the Nature CNN, which numpy would run many times slower).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from zmqrl.agents.appo_policy import CoreActing, CoreState
from zmqrl.agents.capture import run_update
from zmqrl.agents.keyed import mask_field
from zmqrl.agents.layers import MLP, ActingNet
from zmqrl.agents.losses import r2d2_loss
from zmqrl.agents.masks import mask_torch
from zmqrl.agents.nets import (
    annealed_lr,
    build_acting,
    check_importance,
    fused_adam,
    init_linear_,
    resolve_device,
    torso_features,
)
from zmqrl.agents.numpy_policies import PublishedModule
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.agents.r2d2_policy import Q_HEAD, r2d2_net
from zmqrl.agents.updates import DeferredUpdate, Flag, Metrics, backward_step
from zmqrl.spec import SampleSpec
from zmqrl.types import SEQUENCE_PADDING, SequenceBatch, as_bytes

# Names of update()'s metrics, in the order they are stacked for the one device->host transfer.
_METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm", "target_q_mean")
# Device dtypes of a batch's columns (observations keep theirs).
_INPUT_DTYPES = {
    "action": torch.int64,
    "reward": torch.float32,
    "terminated": torch.bool,
    "mask": torch.uint8,
    "core_state": torch.float32,
    "importance": torch.float32,
}


class R2D2Net(nn.Module):
    """The table ``r2d2_net`` as torch modules: ``torso``, ``core`` (``nn.LSTMCell``), ``head``."""

    torso: nn.Module
    core: nn.LSTMCell
    head: nn.Linear

    def __init__(
        self, table: ActingNet, obs_shape: tuple[int, ...], generator: torch.Generator, masked: bool = False
    ) -> None:
        super().__init__()
        self.masked = masked  # Q-values of each row's illegal actions are MASKED_VALUE (agents/masks.py)
        self.mask_field = mask_field(table.inputs)  # where records hold them (None: rows end with them)
        self.torso_kind = table.torso
        cnn = table.torso != MLP
        with torch.random.fork_rng(devices=[]):  # the global RNG untouched: layers come from `generator`
            build_acting(self, table, obs_shape, nn.ReLU, generator if cnn else None)
        # The MLP is re-drawn whole, as it always was; a CNN torso (plain or keyed, with its MLP)
        # drew its own layers from `generator` (zmqrl.agents.conv), so only core and head are
        # drawn here, as QNetwork and APPO's tables do.
        init_linear_(nn.ModuleList([self.core, self.head]) if cnn else self, generator)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return torso_features(self.torso, self.torso_kind, obs)

    def step(
        self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Q-values ``(B, A)`` of one step from ``state``, and the new state."""
        h, c = self.core(self.features(obs), state)
        return self.masked_q(getattr(self, Q_HEAD)(h), obs), (h, c)

    def masked_q(self, q: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Q-values ``(..., A)`` of the rows ``obs`` ``(..., *obs_shape)``, a masked net's with each
        row's illegal actions at MASKED_VALUE (the head reads ``h``; the legal actions are the row's)."""
        if not self.masked:
            return q
        rows = obs.reshape(-1, *obs.shape[q.dim() - 1 :])
        flat = mask_torch(q.reshape(-1, q.shape[-1]), rows, self.mask_field)
        return flat.reshape(q.shape)


def unroll(
    net: R2D2Net, obs: torch.Tensor, state: torch.Tensor, advance: torch.Tensor, burn_in: int
) -> torch.Tensor:
    """Q-values ``(R, L + 1 - burn_in, A)`` at the positions after burn-in, of windows ``obs``
    ``(R, L + 1, *obs_shape)`` unrolled from ``state`` ``(R, 2, H)``. The first ``burn_in``
    positions run without gradient and give only their state, which moves on at the positions
    where ``advance`` ``(R, L)`` (real steps) and stays where it was on padding (before an
    episode's first step)."""
    rows, length = obs.shape[:2]
    h, c = state[:, 0], state[:, 1]
    keep = advance.unsqueeze(-1)
    with torch.no_grad():
        if burn_in:
            x = net.features(obs[:, :burn_in].flatten(0, 1)).reshape(rows, burn_in, -1)
            for t in range(burn_in):
                h_new, c_new = net.core(x[:, t], (h, c))
                h, c = torch.where(keep[:, t], h_new, h), torch.where(keep[:, t], c_new, c)
    x = net.features(obs[:, burn_in:].flatten(0, 1)).reshape(rows, length - burn_in, -1)
    # After the burn-in the state needs no holding: padding there only follows an episode's last
    # step, and the one output read past it (the bootstrap at the observation right after that
    # step) is computed from the state the step left. So the learned part runs as one fused LSTM
    # call over the cell's own weights (what an update's backward pass spends its time in), not
    # one cell call per position.
    core = net.core
    weights = [core.weight_ih, core.weight_hh, core.bias_ih, core.bias_hh]
    outs, _, _ = torch.lstm(x, (h[None], c[None]), weights, True, 1, 0.0, net.training, False, True)
    head: nn.Linear = getattr(net, Q_HEAD)
    return net.masked_q(head(outs), obs[:, burn_in:])


class R2D2Agent(CoreActing):
    """Online and target recurrent Q-networks, Adam, and greedy acting with a state per row."""

    def __init__(
        self, config: R2D2Config, spec: SampleSpec, *, device: str | None = None, seed: int | None = None
    ) -> None:
        config.check()
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self._device = resolve_device(device if device is not None else config.device)
        generator = torch.Generator().manual_seed(0 if seed is None else seed)
        self.table = r2d2_net(config, spec)  # what NumpyR2D2Policy runs (numpy_acting: whether it can)
        net = R2D2Net(self.table, self.obs_shape, generator, spec.action_mask)
        self.online = net.to(self._device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = fused_adam(self.online.parameters(), lr=config.lr, eps=config.adam_eps)
        self.updates = 0
        self._params = list(self.online.parameters())
        self._sync = PublishedModule(self.online)
        self._core: CoreState | None = CoreState(config.core_size)

    @property
    def device(self) -> str:
        return str(self._device)

    # ----------------------------------------------------------------------------------- acting

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Online Q-values ``(B, A)`` float32 of one step; the acting state advances (the torch
        reference of ``NumpyR2D2Policy.q_values``)."""
        assert self._core is not None
        state = self._core.rows(len(obs))
        with torch.inference_mode():
            x = torch.as_tensor(as_bytes(np.array(obs)), device=self._device)  # records: their bytes
            h0 = torch.as_tensor(state[:, 0], device=self._device)
            c0 = torch.as_tensor(state[:, 1], device=self._device)
            q, (h, c) = self.online.step(x, (h0, c0))
            state[:, 0], state[:, 1] = h.cpu().numpy(), c.cpu().numpy()
            return q.cpu().numpy()

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Greedy int64 actions ``(B,)`` (the actor's explorer adds random rows)."""
        return self.q_values(obs).argmax(axis=1).astype(np.int64, copy=False)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: SequenceBatch, importance: np.ndarray | None = None) -> DeferredUpdate:
        """One Adam step on a batch of windows; the result's ``td_errors`` are the windows' new
        priorities ``(R,)``. A non-finite loss or gradient skips the step (nothing changes)."""
        if self.config.lr_final is not None:
            lr = annealed_lr(self.config.lr, self.config.lr_final, self.config.lr_decay_updates, self.updates)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        arrays: dict[str, np.ndarray] = dict(batch._asdict())
        if importance is not None:
            check_importance(importance, batch.rows)
            arrays["importance"] = np.asarray(importance)
        result = run_update(self._learn, arrays, _METRICS, None, self._device, _INPUT_DTYPES)
        if not result.skipped:
            self.updates += 1
            if self.updates % self.config.target_update_interval == 0:
                self.target.load_state_dict(self.online.state_dict())
        return result

    def _learn(self, x: Mapping[str, torch.Tensor], captured: bool) -> tuple[list[Flag], Metrics]:
        cfg = self.config
        burn_in = cfg.burn_in
        advance = x["mask"] != SEQUENCE_PADDING
        q = unroll(self.online, x["obs"], x["core_state"], advance, burn_in)
        with torch.no_grad():
            target_q = unroll(self.target, x["obs"], x["core_state"], advance, burn_in)
        out = r2d2_loss(
            q,
            target_q,
            q.detach() if cfg.double else None,
            x["action"][:, burn_in:],
            x["reward"][:, burn_in:],
            x["terminated"][:, burn_in:],
            advance[:, burn_in:],
            cfg.gamma,
            cfg.n_step,
            cfg.priority_eta,
            cfg.huber_delta,
            x.get("importance"),
        )
        found, grad_norm = backward_step(
            self.optimizer, out.loss, self._params, cfg.max_grad_norm, captured=captured
        )
        loss = out.loss.detach()

        def metrics() -> tuple[list[torch.Tensor], torch.Tensor]:
            learned = advance[:, burn_in:]
            count = learned.sum().clamp(min=1)
            q_mean = (out.old_val * learned).sum() / count
            td_mean = out.td_error.abs().sum() / count
            target_mean = (out.td_target * learned).sum() / count
            values = [loss, q_mean, td_mean, grad_norm, target_mean]
            return values, out.priorities

        return [found], metrics

    # ------------------------------------------------------------------------------ weight sync

    def export_weights(self) -> dict[str, np.ndarray]:
        """The online network as float32 numpy copies (what ``NumpyR2D2Policy`` loads)."""
        return self._sync.export()

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act with ``arrays`` (every name and shape checked first; ValueError changes nothing)."""
        self._sync.load(arrays)
        self.target.load_state_dict(self.online.state_dict())

    # ------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
