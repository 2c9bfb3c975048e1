"""A linear Q-learner in numpy: the smallest agent that satisfies both halves of the agent contract.

It exists to prove that an algorithm zmqrl does not ship plugs in through the registry alone: its
own config dataclass, ``LearningAgent`` (update, export, checkpoint state) and ``Policy`` (act,
load) in one class, Ape-X initial priorities beside it, and an :class:`AgentPlugin` object that
configs name as ``agent.kind: tests.plugins.linear_q:PLUGIN``. It does not need to learn CartPole
well. Versions, epsilon and action bounds are not its business (transport, the actor's explorer
and the SampleSpec own them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.agents.configs import AgentConfigBase
from zmqrl.agents.registry import AgentPlugin, PriorityFn
from zmqrl.core import Policy, Updated
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

# TD errors are clipped to this before the gradient step: a linear Q-function on unscaled
# observations diverges otherwise, and an agent that publishes NaNs would be a poor test double.
TD_CLIP = 1.0


@dataclass
class LinearQConfig(AgentConfigBase):
    """Hyperparameters of the linear Q-learner (no target network, no optimiser state)."""

    kind: str = "linear_q"  # this plugin's name
    lr: float = 1e-3  # SGD step size on the clipped TD error
    n_step: int = 1  # length of the n-step return window (actors' n-step processor)
    batch_size: int = 32  # transitions per gradient step
    device: str = "cpu"  # numpy only: anything else is refused by check()

    def check(self) -> None:
        super().check()
        if not self.lr > 0.0:
            raise ValueError(f"agent.lr: must be > 0, got {self.lr}")


class LinearQAgent:
    """``Q(s) = W s + b``, one row of ``W`` per action, trained by SGD on the one-step TD error."""

    def __init__(self, config: LinearQConfig, obs_dim: int, n_actions: int) -> None:
        self.config = config
        self.n_actions = n_actions
        self.weight = np.zeros((n_actions, obs_dim), np.float32)
        self.bias = np.zeros(n_actions, np.float32)
        self.updates = 0

    # -------------------------------------------------------------------------------- acting

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return obs.reshape(obs.shape[0], -1).astype(np.float32) @ self.weight.T + self.bias

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        return self.q_values(obs).argmax(axis=1).astype(np.int64)

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, own in (("weight", self.weight), ("bias", self.bias)):
            if name not in arrays or np.shape(arrays[name]) != own.shape:
                raise ValueError(f"load_weights: {name!r} missing or not of shape {own.shape}")
        if set(arrays) != {"weight", "bias"}:
            raise ValueError(
                f"load_weights: unexpected parameters {sorted(set(arrays) - {'weight', 'bias'})}"
            )
        self.weight = np.array(arrays["weight"], np.float32)
        self.bias = np.array(arrays["bias"], np.float32)

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray:
        return np.abs(self._td(batch)).astype(np.float32)

    # ------------------------------------------------------------------------------ learning

    def _td(self, batch: TransitionBatch) -> np.ndarray:
        q_taken = self.q_values(batch.obs)[np.arange(batch.size), batch.action]
        return batch.reward + batch.discount * self.q_values(batch.next_obs).max(axis=1) - q_taken

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> Updated:
        td = self._td(batch)
        step = np.clip(td, -TD_CLIP, TD_CLIP) * (1.0 if importance is None else importance)
        obs = batch.obs.reshape(batch.size, -1).astype(np.float32)
        grad_w = np.zeros_like(self.weight)
        grad_b = np.zeros_like(self.bias)
        np.add.at(grad_w, batch.action, step[:, None] * obs)
        np.add.at(grad_b, batch.action, step)
        self.weight += self.config.lr * grad_w / batch.size
        self.bias += self.config.lr * grad_b / batch.size
        self.updates += 1
        metrics = {"loss": float(np.mean(0.5 * td**2)), "td_abs_mean": float(np.mean(np.abs(td)))}
        return Updated(metrics, np.abs(td).astype(np.float32))

    def export_weights(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight.copy(), "bias": self.bias.copy()}

    def state_dict(self) -> dict[str, Any]:
        # Plain lists and ints: checkpoints are read with torch.load(weights_only=True), which
        # refuses numpy arrays.
        return {"weight": self.weight.tolist(), "bias": self.bias.tolist(), "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weight = np.array(state["weight"], np.float32)
        self.bias = np.array(state["bias"], np.float32)
        self.updates = int(state["updates"])


def check(config: LinearQConfig, spec: SampleSpec, device: str | None) -> str | None:
    if spec.num_actions is None:
        return "agent.kind 'linear_q' needs a Discrete action space"
    if (device or config.device) != "cpu":
        return f"agent.device: linear_q runs on the cpu only, got {device or config.device!r}"
    return None


def make_learner(
    config: LinearQConfig, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LinearQAgent:
    assert spec.num_actions is not None  # check()
    return LinearQAgent(config, int(np.prod(spec.obs_shape)), spec.num_actions)


def make_policy(config: LinearQConfig, spec: SampleSpec, *, seed: int | None) -> LinearQAgent:
    assert spec.num_actions is not None  # check()
    return LinearQAgent(config, int(np.prod(spec.obs_shape)), spec.num_actions)


def make_priorities(policy: Policy) -> PriorityFn:
    assert isinstance(policy, LinearQAgent)  # what make_policy built
    return policy.initial_priorities


PLUGIN = AgentPlugin(
    name="linear_q",
    config_class=LinearQConfig,
    make_learner=make_learner,
    make_policy=make_policy,
    check=check,
    fingerprint_fields=("kind", "n_step", "gamma"),
    description="linear Q-learning in numpy (a test double for the agent contract)",
    make_priorities=make_priorities,
)
