"""DQN (Mnih et al., 2015) with optional double-Q targets (van Hasselt et al., 2016) and dueling heads.

The learner calls ``update`` on n-step batches and publishes ``export_weights``; actors hold a copy
of the same agent, ``import_weights`` what is published and call ``act``. The n-step return and its
discount are computed by the actors' step processor, so ``update`` never sees ``gamma`` or ``n``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.nets import NumpyQForward, QNetwork, polyak_update, resolve_device
from zmqrl.types import TransitionBatch, Weights


def _adam(params: Any, lr: float, eps: float) -> torch.optim.Adam:
    """Adam with the fused kernel where this torch build has it (~20% faster steps for small
    CPU networks, where per-tensor Python overhead dominates), else the default implementation."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, eps=eps)


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Numpy -> tensor without a copy where possible (read-only arrays, e.g. wire buffers, are copied)."""
    if not array.flags.writeable:
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype) if dtype is not None else tensor.to(device)


class DQNAgent:
    """Online and target Q-networks, an Adam optimiser, epsilon-greedy acting and versioned weights.

    ``epsilon`` is a plain attribute: whoever owns the schedule (the actor) sets it between calls.
    """

    def __init__(
        self,
        config: DQNConfig,
        obs_shape: tuple[int, ...],
        n_actions: int,
        *,
        epsilon: float = 0.0,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.device = resolve_device(device if device is not None else config.device)
        # Private generators: seeding must not depend on, or disturb, the process-global RNGs.
        init_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.rng = np.random.default_rng(seed)

        self.online = QNetwork(
            self.obs_shape, config.hidden_sizes, n_actions, config.dueling, generator=init_generator
        ).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = _adam(self.online.parameters(), lr=config.lr, eps=config.adam_eps)

        self.epsilon = float(epsilon)
        self.updates = 0
        self._version = 0
        self._dirty = True  # the initial weights have never been exported
        self._on_cpu = self.device.type == "cpu"
        # CPU acting goes through a numpy view of the online weights: ~4x less overhead per call.
        self._numpy_q = NumpyQForward(self.online) if self._on_cpu else None

    @property
    def weights_version(self) -> int:
        """Version of the weights the agent acts with now (0: initial, never synced)."""
        return self._version

    # ----------------------------------------------------------------------------------- acting

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Epsilon-greedy (``explore=True``) or greedy int64 actions ``(B,)`` for obs ``(B, *obs_shape)``.

        Each row explores independently. When every row explores, the network is not evaluated.
        """
        if explore and self.epsilon > 0.0:
            explore_rows = self.rng.random(obs.shape[0]) < self.epsilon
            n_random = int(np.count_nonzero(explore_rows))
            if n_random == obs.shape[0]:
                return self.rng.integers(self.n_actions, size=n_random, dtype=np.int64)
            actions = self._greedy(obs)
            if n_random:
                actions[explore_rows] = self.rng.integers(self.n_actions, size=n_random, dtype=np.int64)
            return actions
        return self._greedy(obs)

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        if self._numpy_q is not None:
            return self._numpy_q(obs).argmax(axis=1).astype(np.int64, copy=False)
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

    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not obs.flags.writeable:  # torch warns on read-only arrays; obs is tiny, so copy
            obs = obs.copy()
        tensor = torch.from_numpy(obs)
        return tensor if self._on_cpu else tensor.to(self.device, non_blocking=True)

    # --------------------------------------------------------------------------------- learning

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One Adam step on the Huber TD loss; returns pre-step metrics as python floats.

        ``batch.discount`` already holds ``gamma**k`` (0 on termination), so it is not multiplied
        by gamma again here. Metrics are gathered with a single device->host transfer.
        """
        cfg = self.config
        obs = _to_device(batch.obs, self.device)  # cast to float32 inside the network, on the device
        actions = _to_device(batch.action, self.device, torch.int64)
        rewards = _to_device(batch.reward, self.device, torch.float32)
        next_obs = _to_device(batch.next_obs, self.device)
        discounts = _to_device(batch.discount, self.device, torch.float32)

        with torch.no_grad():
            if cfg.double:
                next_actions = self.online(next_obs).argmax(dim=1, keepdim=True)
                target_q = self.target(next_obs).gather(1, next_actions).squeeze(1)
            else:
                target_q = self.target(next_obs).max(dim=1).values
            td_target = rewards + discounts * target_q

        q_taken = self.online(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.huber_loss(q_taken, td_target, delta=cfg.huber_delta)

        if cfg.lr_final is not None:
            self._set_lr(self.current_lr())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.online.parameters() if p.grad is not None]
        if cfg.max_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        else:
            grad_norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
            grad_norm = torch.linalg.vector_norm(grad_norms)
        self.optimizer.step()

        self.updates += 1
        if self.updates % cfg.target_update_interval == 0:
            polyak_update(self.target, self.online, cfg.tau)
        self._dirty = True

        with torch.no_grad():
            td_abs = (td_target - q_taken).abs().mean()
            values = torch.stack([loss, q_taken.mean(), td_abs, grad_norm, target_q.mean()]).tolist()
        return dict(zip(("loss", "q_mean", "td_abs_mean", "grad_norm", "target_q_mean"), values, strict=True))

    def current_lr(self) -> float:
        """Learning rate for the next update: ``lr``, annealed linearly to ``lr_final`` if set.

        Annealing lets a policy that has learned settle instead of oscillating (DQN on
        CartPole is prone to late collapses at a constant, large step size)."""
        cfg = self.config
        if cfg.lr_final is None:
            return cfg.lr
        frac = min(1.0, self.updates / cfg.lr_decay_updates)
        return cfg.lr + frac * (cfg.lr_final - cfg.lr)

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------------------------ weight sync

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Parameter name -> (shape, dtype) of what ``export_weights`` sends, for wire validation."""
        return {name: (tuple(t.shape), "float32") for name, t in self.online.state_dict().items()}

    def export_weights(self) -> Weights:
        """The online network as float32 C-contiguous numpy copies, stamped with the version.

        The version is bumped only when the weights changed since the last export (or were never
        exported), so the first export is version 1 and repeated exports without updates agree.
        """
        if self._dirty:
            self._version += 1
            self._dirty = False
        arrays = {
            name: np.array(t.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)
            for name, t in self.online.state_dict().items()
        }
        return Weights(self._version, arrays)

    def continue_versions_after(self, floor: int) -> None:
        """Learner side, after a restart: the next export gets a version above ``floor`` (the
        highest ever published in this run), so actors never mistake new weights for old."""
        if floor >= self._version:
            self._version = floor
            self._dirty = True

    def import_weights(self, weights: Weights) -> bool:
        """Load ``weights`` if strictly newer; all names and shapes are checked before anything is loaded.

        Returns False (and changes nothing) for an older or equal version, so a late or duplicated
        publish cannot roll an actor back. The target net is overwritten too, keeping the pair
        consistent; actors never use it.
        """
        if weights.version <= self._version:
            return False
        own = self.online.state_dict()
        for name, tensor in own.items():
            if name not in weights.arrays:
                raise ValueError(f"import_weights: missing parameter {name!r}")
            got = tuple(np.shape(weights.arrays[name]))
            if got != tuple(tensor.shape):
                raise ValueError(f"import_weights: {name!r} has shape {got}, expected {tuple(tensor.shape)}")
        for name in weights.arrays:
            if name not in own:
                raise ValueError(f"import_weights: unexpected parameter {name!r}")
        with torch.no_grad():
            for name, tensor in own.items():
                # torch.tensor copies, so read-only wire buffers are fine and never aliased.
                tensor.copy_(torch.tensor(weights.arrays[name], dtype=torch.float32))
        self.target.load_state_dict(own)
        self._version = int(weights.version)
        self._dirty = False
        return True

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
            "version": self._version,
            "dirty": self._dirty,
            "epsilon": self.epsilon,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``; the optimiser keeps its saved hyperparameters (torch convention)."""
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self._version = int(state["version"])
        self._dirty = bool(state["dirty"])
        self.epsilon = float(state["epsilon"])
        self.rng.bit_generator.state = state["rng"]
