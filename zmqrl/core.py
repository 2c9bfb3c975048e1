"""The contracts that the rest of zmqrl is written against, and nothing else.

This module imports neither torch nor zmq: roles, tests and other languages' ports can read the
whole system's shape here. The intended call loops::

    # actor process                                  # learner process
    policy = plugin.make_policy(...)                 agent = plugin.make_learner(...)
    while running:                                   publish(agent.export_weights())
        if (w := weights_sub.latest()):              while updates < max_updates:
            policy.import_weights(w)                     drawn = replay.sample(batch_size, updates)
        a = policy.act(obs[None], explore=True)[0]       metrics = agent.update(drawn.batch,
        obs2, r, term, trunc, _ = env.step(a)                                   drawn.importance)
        for t in steps.step(obs, a, r, term,             replay.update_priorities(drawn.ids, ...)
                            trunc, obs2): ...            if updates % sync_interval == 0:
                                                             publish(agent.export_weights())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from zmqrl.types import TransitionBatch, Weights


@runtime_checkable
class Policy(Protocol):
    """The acting side of an agent: what an actor and the evaluator hold.

    The *sync-model* contract, receiving half: ``import_weights`` loads a snapshot only if its
    version is newer than what the policy holds, so a late or duplicated publish can never roll an
    actor back. A policy need not import torch (actors then start in a fraction of a second).
    """

    epsilon: float | np.ndarray
    """Probability that ``act(explore=True)`` takes a uniformly random action (set by the actor):
    one for every row, or one per row of ``obs`` (a vector actor's sub-envs)."""

    @property
    def weights_version(self) -> int:
        """Version of the weights the policy acts with now (0: initial, never synced)."""
        ...

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Actions for a batch of observations ``(B, *obs_shape)``; explore=False is greedy."""
        ...

    def weights_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, dtype) of the weights this policy imports, for wire validation."""
        ...

    def import_weights(self, weights: Weights) -> bool:
        """Load ``weights`` if newer than the current version; return whether it was loaded."""
        ...

    def initial_priorities(self, batch: TransitionBatch) -> np.ndarray | None:
        """Ape-X: ``|TD error|`` of fresh transitions under this copy's weights, or None when the
        policy cannot compute them (e.g. SAC actors hold no critic)."""
        ...


@runtime_checkable
class LearningAgent(Policy, Protocol):
    """The learning side of an agent: what the learner holds (it also acts, to evaluate).

    The *sync-model* contract, publishing half: ``export_weights`` returns the acting network's
    parameters stamped with a version that increases whenever they changed since the previous
    export, in exactly the layout the agent's :class:`Policy` imports.
    """

    @property
    def device(self) -> str:
        """Where updates run (e.g. ``cpu``, ``cuda:0``), for the learner's log."""
        ...

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> Mapping[str, float]:
        """One gradient step on ``batch``; returns scalar metrics (e.g. ``loss``, ``q_mean``).

        ``importance``: per-row loss weights ``(B,)`` from prioritized replay (None: all 1). The
        learner reads the metrics only every ``learner.log_interval`` updates, so a mapping that
        computes them on first read (``zmqrl.agents.deferred``) saves their cost on the others."""
        ...

    @property
    def last_td_errors(self) -> np.ndarray:
        """``|TD error|`` per row ``(B,)`` float32 of the batch of the last ``update``: the new
        priorities of the rows it was sampled from (read only with prioritized replay)."""
        ...

    def export_weights(self) -> Weights:
        """Snapshot of the acting weights (numpy, CPU) with their version."""
        ...

    def continue_versions_after(self, floor: int) -> None:
        """After a learner restart: number the next export above ``floor``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training (networks, optimiser, counters, version)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``."""
        ...


class Sampled(NamedTuple):
    """One draw from replay: the batch, and what the learner needs to correct and re-prioritise it."""

    batch: TransitionBatch
    importance: np.ndarray | None  # (B,) loss weights, max 1 (prioritized); None: uniform draw
    ids: np.ndarray | None  # (B,) row ids to hand back to ``update_priorities``; None: uniform
    metrics: dict[str, float]  # e.g. ``per_beta``, ``per_importance_min``; empty for uniform


@runtime_checkable
class Replay(Protocol):
    """Bounded storage of transitions that the learner samples from, whatever its kind.

    Uniform, prioritized and shared-frame buffers are all built by the configuration
    (``zmqrl.replay.make_replay``) behind this one interface, so the learner never asks which it
    has. Every mutation is all-or-nothing and safe to call from the ingest thread while the
    training thread samples.
    """

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes held (or reserved) by the buffer's arrays."""
        ...

    @property
    def total_added(self) -> int:
        """Transitions ever added (including those since overwritten)."""
        ...

    def add(self, batch: TransitionBatch, priorities: np.ndarray | None = None) -> None:
        """Insert a batch, overwriting the oldest rows when full. ``priorities``: the actor's initial
        ones (Ape-X), used by prioritized buffers (None: the largest seen), ignored otherwise."""
        ...

    def sample(self, batch_size: int, updates: int) -> Sampled:
        """A batch for the learner's update number ``updates`` (schedules such as prioritized
        replay's importance exponent follow it)."""
        ...

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """Give the rows of a ``Sampled`` their new priorities (no-op for uniform buffers; rows
        overwritten since they were sampled are skipped)."""
        ...

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch:
        """The newest ``max_rows`` transitions, oldest first (for checkpoints)."""
        ...

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot`` (into an empty buffer)."""
        ...

    def rng_state(self) -> dict[str, object]: ...

    def set_rng_state(self, state: dict[str, object]) -> None: ...

    def stats(self) -> dict[str, float | int]:
        """Kind-specific counters for reports (e.g. ``clipped_priorities``); may be empty."""
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
