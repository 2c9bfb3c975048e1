"""The contracts that the rest of zmqrl is written against, and nothing else.

This module imports neither torch nor zmq: roles, tests and other languages' ports can read the
whole system's shape here. An agent is six members: acting (``act``, ``load_weights``), learning
(``update``, ``export_weights``) and checkpoint state (``state_dict``, ``load_state_dict``).
Everything else a role needs is built beside the agent, not asked of it: weight versions and
their stamping (``zmqrl.transport.weights_channel``), epsilon exploration
(``zmqrl.actor.exploration``), Ape-X initial priorities (``zmqrl.agents.make_priorities``), the
action space and its bounds (``zmqrl.spec.SampleSpec``). The intended call loops::

    # actor process                                  # learner process
    policy = make_policy(config, spec)               agent = make_learner(config, spec)
    client = WeightsClient(policy)                   numbering = WeightsNumbering(floor)
    while running:                                   publish(numbering.stamp(agent.export_weights()))
        if (msg := weights_sub.latest()):            while updates < max_updates:
            client.offer(msg.weights)                    drawn = replay.sample(batch_size, updates)
        a = explorer.act(obs[None])[0]                   result = agent.update(drawn.batch,
        obs2, r, term, trunc, _ = env.step(a)                                  drawn.importance)
        for t in steps.step(obs, a, r, term,             replay.update_priorities(drawn.ids,
                            trunc, obs2): ...                                     result.td_errors)
                                                         numbering.changed()
                                                         if updates % sync_interval == 0:
                                                             publish(numbering.stamp(...))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from zmqrl.types import Batch, SequenceBatch, TransitionBatch


@runtime_checkable
class Policy(Protocol):
    """The acting side of an agent: what an actor and the evaluator hold.

    It knows nothing of versions (the weights client decides which snapshot is newer) nor of
    epsilon (the actor's explorer replaces rows by random actions): it acts, and it takes weights.
    A policy need not import torch (actors then start in a fraction of a second).
    """

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Actions for a batch of observations ``(B, *obs_shape)``: ``explore=True`` is the
        policy's own exploration (SAC samples its Gaussian; DQN has none and is greedy),
        ``explore=False`` its best guess."""
        ...

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act with ``arrays`` (by parameter name, as ``export_weights`` of the learning side
        gives them) from now on. All or nothing: a missing, unexpected or misshapen array raises
        ValueError and changes nothing. The arrays may be read-only views of a message's frames:
        copy what is kept."""
        ...


@runtime_checkable
class SamplingPolicy(Policy, Protocol):
    """The acting side of an on-policy agent: its actions come with their log-probabilities.

    An on-policy learner corrects for the lag between the policy that acted and the one it trains
    (V-trace), which needs the probability the acting policy gave each action it took. Acting
    with ``act(obs, explore=False)`` stays the evaluator's greedy play.
    """

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy for a batch of observations ``(B, *obs_shape)``, and the
        log-probability ``(B,)`` float32 the policy gave each (a density for continuous actions)."""
        ...


@runtime_checkable
class RecurrentPolicy(Protocol):
    """A policy with memory (APPO with ``agent.core: lstm``): ``act`` and ``sample`` read and
    advance a state per row of the batch, so the caller keeps one row per env, in the same order,
    at every call, and says when an episode starts over.

    ``recurrent`` False: the policy has the methods but no state (nothing to reset or carry)."""

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a state between calls."""
        ...

    def core_state(self) -> np.ndarray:
        """A copy of the state the next call starts from, ``(B, 2, H)`` float32 (h and c)."""
        ...

    def reset_core(self, done: np.ndarray | None = None) -> None:
        """Zero the state of the rows where ``done`` ``(B,)`` is True (all of them, and forget
        the batch size, when None): their next step is an episode's first."""
        ...


def is_recurrent(policy: object) -> bool:
    """Whether ``policy`` carries a state between calls (see :class:`RecurrentPolicy`)."""
    return isinstance(policy, RecurrentPolicy) and bool(policy.recurrent)


@runtime_checkable
class UpdateResult(Protocol):
    """What one ``update`` did. The learner reads ``metrics`` only every ``learner.log_interval``
    updates and ``td_errors`` only with prioritized replay, so an agent may compute them when
    first read (``zmqrl.agents.updates``); ``skipped`` is read after every update."""

    @property
    def metrics(self) -> Mapping[str, float]:
        """Scalar metrics of the update (e.g. ``loss``, ``q_mean``), from before its step."""
        ...

    @property
    def td_errors(self) -> np.ndarray:
        """``|TD error|`` per row ``(B,)`` float32 of the batch: the rows' new priorities."""
        ...

    @property
    def skipped(self) -> bool:
        """True when a NaN or infinity in the loss or a gradient made the update change nothing."""
        ...


@dataclass(frozen=True)
class Updated:
    """A plain :class:`UpdateResult`, for agents that compute everything at once."""

    metrics: Mapping[str, float]
    td_errors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    skipped: bool = False


@runtime_checkable
class LearningAgent(Policy, Protocol):
    """The learning side of an agent: what the learner holds (it also acts, to evaluate).

    ``export_weights`` returns the acting network's parameters in exactly the layout the agent's
    :class:`Policy` loads; the learner numbers what it publishes, so exporting has no side effect.
    """

    def update(self, batch: Batch, importance: np.ndarray | None = None) -> UpdateResult:
        """One gradient step on ``batch``: n-step transitions drawn from replay, or (an on-policy
        agent, whose plugin says ``on_policy``) rollouts taken from the learner's queue.
        ``importance``: per-row loss weights ``(B,)`` from prioritized replay (None: all 1)."""
        ...

    def export_weights(self) -> dict[str, np.ndarray]:
        """The acting weights now, as C-contiguous numpy copies on the CPU, by parameter name."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training (networks, optimiser, counters)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict`` (also of the states of earlier releases)."""
        ...


class Sampled(NamedTuple):
    """One draw from replay: the batch, and what the learner needs to correct and re-prioritise it."""

    batch: Batch  # n-step transitions from replay; rollouts from the rollout queue
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

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> None:
        """Insert a batch (of the kind this store holds: transitions for replay, rollouts for the
        rollout queue; TypeError for the other); replay overwrites its oldest rows when full.
        ``priorities``: the actor's initial ones (Ape-X), used by prioritized buffers (None: the
        largest seen), ignored otherwise."""
        ...

    def sample(self, batch_size: int, updates: int) -> Sampled:
        """A batch for the learner's update number ``updates`` (schedules such as prioritized
        replay's importance exponent follow it)."""
        ...

    def update_priorities(self, ids: np.ndarray | None, td_errors: np.ndarray) -> None:
        """Give the rows of a ``Sampled`` their new priorities (no-op for uniform buffers; rows
        overwritten since they were sampled are skipped)."""
        ...

    def snapshot(self, max_rows: int | None = None) -> TransitionBatch | SequenceBatch:
        """The newest ``max_rows`` rows (transitions; R2D2's windows), oldest first (for checkpoints)."""
        ...

    def restore(self, batch: TransitionBatch, total_added: int | None = None) -> None:
        """Refill from a ``snapshot`` (into an empty buffer; a sequence replay takes its windows)."""
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
