"""A linear Q-learner in numpy: the smallest agent that satisfies both halves of the agent contract.

It exists to prove that an algorithm zmqrl does not ship plugs in through the registry alone: its
own config dataclass, ``LearningAgent`` (update, priorities, export, checkpoint state) and
``Policy`` (act, import) in one class, and an :class:`AgentPlugin` object that configs name as
``agent.kind: tests.plugins.linear_q:PLUGIN``. It does not need to learn CartPole well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.agents.configs import AgentConfigBase
from zmqrl.agents.registry import AgentPlugin
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch, Weights

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

    def __init__(
        self,
        config: LinearQConfig,
        obs_dim: int,
        n_actions: int,
        seed: int | None,
        epsilon: float | np.ndarray,
    ) -> None:
        self.config = config
        self.n_actions = n_actions
        self.rng = np.random.default_rng(seed)
        self.weight = np.zeros((n_actions, obs_dim), np.float32)
        self.bias = np.zeros(n_actions, np.float32)
        self.epsilon: float | np.ndarray = epsilon
        self.updates = 0
        self._version = 0
        self._dirty = True
        self._td_errors = np.zeros(0, np.float32)

    # -------------------------------------------------------------------------------- acting

    @property
    def weights_version(self) -> int:
        return self._version

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return obs.reshape(obs.shape[0], -1).astype(np.float32) @ self.weight.T + self.bias

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        actions = self.q_values(obs).argmax(axis=1).astype(np.int64)
        if explore:
            random_rows = self.rng.random(obs.shape[0]) < self.epsilon
            actions[random_rows] = self.rng.integers(self.n_actions, size=int(random_rows.sum()))
        return actions

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"weight": (self.weight.shape, "float32"), "bias": (self.bias.shape, "float32")}

    def import_weights(self, weights: Weights) -> bool:
        if weights.version <= self._version:
            return False
        for name, (shape, _) in self.weights_spec().items():
            if np.shape(weights.arrays.get(name)) != shape:
                raise ValueError(f"import_weights: {name!r} missing or not of shape {shape}")
        self.weight = np.array(weights.arrays["weight"], np.float32)
        self.bias = np.array(weights.arrays["bias"], np.float32)
        self._version = int(weights.version)
        self._dirty = False
        return True

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray:
        return np.abs(self._td(batch)).astype(np.float32)

    # ------------------------------------------------------------------------------ learning

    @property
    def device(self) -> str:
        return "cpu"

    def _td(self, batch: TransitionBatch) -> np.ndarray:
        q_taken = self.q_values(batch.obs)[np.arange(batch.size), batch.action]
        return batch.reward + batch.discount * self.q_values(batch.next_obs).max(axis=1) - q_taken

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> dict[str, float]:
        td = self._td(batch)
        self._td_errors = np.abs(td).astype(np.float32)
        step = np.clip(td, -TD_CLIP, TD_CLIP) * (1.0 if importance is None else importance)
        obs = batch.obs.reshape(batch.size, -1).astype(np.float32)
        grad_w = np.zeros_like(self.weight)
        grad_b = np.zeros_like(self.bias)
        np.add.at(grad_w, batch.action, step[:, None] * obs)
        np.add.at(grad_b, batch.action, step)
        self.weight += self.config.lr * grad_w / batch.size
        self.bias += self.config.lr * grad_b / batch.size
        self.updates += 1
        self._dirty = True
        return {"loss": float(np.mean(0.5 * td**2)), "td_abs_mean": float(np.mean(np.abs(td)))}

    @property
    def last_td_errors(self) -> np.ndarray:
        return self._td_errors

    def export_weights(self) -> Weights:
        if self._dirty:
            self._version += 1
            self._dirty = False
        return Weights(self._version, {"weight": self.weight.copy(), "bias": self.bias.copy()})

    def continue_versions_after(self, floor: int) -> None:
        if floor >= self._version:
            self._version = floor
            self._dirty = True

    def state_dict(self) -> dict[str, Any]:
        # Plain lists and ints: checkpoints are read with torch.load(weights_only=True), which
        # refuses numpy arrays.
        return {
            "weight": self.weight.tolist(),
            "bias": self.bias.tolist(),
            "updates": self.updates,
            "version": self._version,
            "dirty": self._dirty,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weight = np.array(state["weight"], np.float32)
        self.bias = np.array(state["bias"], np.float32)
        self.updates = int(state["updates"])
        self._version = int(state["version"])
        self._dirty = bool(state["dirty"])
        self.rng.bit_generator.state = state["rng"]


def check(
    config: LinearQConfig,
    spec: SampleSpec,
    device: str | None,
    action_low: np.ndarray | None,
    action_high: np.ndarray | None,
) -> str | None:
    if spec.num_actions is None:
        return "agent.kind 'linear_q' needs a Discrete action space"
    if (device or config.device) != "cpu":
        return f"agent.device: linear_q runs on the cpu only, got {device or config.device!r}"
    return None


def make_learner(
    config: LinearQConfig,
    spec: SampleSpec,
    *,
    seed: int | None,
    device: str | None,
    action_low: np.ndarray | None,
    action_high: np.ndarray | None,
) -> LinearQAgent:
    assert spec.num_actions is not None  # check()
    return LinearQAgent(config, int(np.prod(spec.obs_shape)), spec.num_actions, seed, epsilon=0.0)


def make_policy(
    config: LinearQConfig,
    spec: SampleSpec,
    *,
    seed: int | None,
    epsilon: float | np.ndarray,
    action_low: np.ndarray | None,
    action_high: np.ndarray | None,
) -> LinearQAgent:
    assert spec.num_actions is not None  # check()
    return LinearQAgent(config, int(np.prod(spec.obs_shape)), spec.num_actions, seed, epsilon=epsilon)


PLUGIN = AgentPlugin(
    name="linear_q",
    config_class=LinearQConfig,
    make_learner=make_learner,
    make_policy=make_policy,
    check=check,
    fingerprint_fields=("kind", "n_step", "gamma"),
    description="linear Q-learning in numpy (a test double for the agent contract)",
)
