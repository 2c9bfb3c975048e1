"""The contracts that the rest of zmqrl is written against, and nothing else.

This module imports neither torch nor zmq: roles, tests and other languages' ports can read the
whole system's shape here. The intended call loops::

    # actor process                                  # learner process
    agent = make_agent(cfg, spec)                    agent = make_agent(cfg, spec)
    while running:                                   publish(agent.export_weights())
        if (w := weights_sub.latest()):              while updates < max_updates:
            agent.import_weights(w)                      batch = replay.sample(batch_size)
        a = agent.act(obs[None], explore=True)[0]        metrics = agent.update(batch)
        obs2, r, term, trunc, _ = env.step(a)            if updates % sync_interval == 0:
        for t in steps.step(obs, a, r, term,                 publish(agent.export_weights())
                            trunc, obs2): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zmqrl.types import TransitionBatch, Weights


@runtime_checkable
class Agent(Protocol):
    """A policy that can be trained (learner side) and mirrored (actor side).

    The *sync-model* contract: ``export_weights`` returns the acting network's parameters stamped
    with a version that increases whenever the parameters changed since the previous export;
    ``import_weights`` loads a snapshot only if its version is newer than what the agent holds, so
    a late or duplicated publish can never roll an actor back.
    """

    @property
    def weights_version(self) -> int:
        """Version of the weights the agent acts with now (0: initial, never synced)."""
        ...

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Actions for a batch of observations ``(B, *obs_shape)``; explore=False is greedy."""
        ...

    epsilon: float | np.ndarray
    """Probability that ``act(explore=True)`` takes a uniformly random action (set by the actor):
    one for every row, or one per row of ``obs`` (a vector actor's sub-envs)."""

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> dict[str, float]:
        """One gradient step on ``batch``; returns scalar metrics (e.g. ``loss``, ``q_mean``).

        ``importance``: per-row loss weights ``(B,)`` from prioritized replay (None: all 1)."""
        ...

    @property
    def last_td_errors(self) -> np.ndarray:
        """``|TD error|`` per row ``(B,)`` float32 of the batch of the last ``update``: the new
        priorities of the rows it was sampled from."""
        ...

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """Actor side (Ape-X): ``|TD error|`` of fresh transitions under this copy's weights, or
        None when the copy cannot compute them (e.g. SAC actors hold no critic)."""
        ...

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, dtype) of what ``export_weights`` sends, for wire validation."""
        ...

    def export_weights(self) -> Weights:
        """Snapshot of the acting weights (numpy, CPU) with their version."""
        ...

    def import_weights(self, weights: Weights) -> bool:
        """Load ``weights`` if newer than the current version; return whether it was loaded."""
        ...

    def continue_versions_after(self, floor: int) -> None:
        """Learner side, after a restart: number the next export above ``floor``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training (networks, optimiser, counters, version)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``."""
        ...


@runtime_checkable
class ReplayBuffer(Protocol):
    """Bounded storage of transitions that the learner samples from."""

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    def add(self, batch: TransitionBatch) -> None:
        """Insert a batch, overwriting the oldest items when full."""
        ...

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch drawn from what is stored (uniformly, for the plain buffer)."""
        ...


@runtime_checkable
class PrioritizedBuffer(ReplayBuffer, Protocol):
    """Replay that samples in proportion to priority and corrects the bias with importance weights."""

    def add_with_priorities(self, batch: TransitionBatch, priorities: np.ndarray | None) -> None:
        """Insert with initial priorities (None: the largest priority seen so far)."""
        ...

    def sample_prioritized(
        self, batch_size: int, beta: float
    ) -> tuple[TransitionBatch, np.ndarray, np.ndarray]:
        """``(batch, indices, importance weights normalised to max 1)``."""
        ...

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities (e.g. ``|TD error|``) for rows returned by ``sample_prioritized``."""
        ...


@runtime_checkable
class StepProcessor(Protocol):
    """Turns single env steps into n-step transitions; pure, no I/O."""

    def step(
        self,
        obs: np.ndarray,
        action: np.ndarray | int,
        reward: float,
        terminated: bool,
        truncated: bool,
        next_obs: np.ndarray,
    ) -> list[tuple[np.ndarray, np.ndarray | int, float, np.ndarray, float]]:
        """Feed one step; return the transitions it completes as
        ``(obs, action, n_step_reward, bootstrap_obs, discount)`` tuples."""
        ...

    def reset(self) -> None:
        """Forget any partial window (e.g. after an env reset forced from outside)."""
        ...
