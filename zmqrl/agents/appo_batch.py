"""APPO's batch on the device and what an update computes from it before any step: steps 1-3 of
``zmqrl.agents.appo`` (values, the current policy's log-probabilities, V-trace targets), and the
check that the batch and its targets are finite.

Written for both ways an update runs: eagerly, and as a CUDA graph (``zmqrl.agents.capture``),
which needs every shape fixed by the batch's signature and no host read. Hence two choices:

- A truncated step's bootstrap is gathered by index (``final_index``: the row of ``final_obs``
  each truncated step was cut at, computed on the host) rather than by a boolean mask, whose
  number of rows the device would have to tell the host. A captured update pads ``final_obs``
  to a capacity (:func:`final_capacity`), so a batch with one more truncation meets the same graph.
- The non-finite check returns a device flag when ``captured``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from zmqrl.agents.appo_nets import APPOPolicyNet, ValueNet
from zmqrl.agents.appo_rnn import RecurrentValue, recurrent_outputs
from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.keyed import Field
from zmqrl.agents.keyed_nets import field_tensor
from zmqrl.agents.updates import Flag
from zmqrl.agents.vtrace import VTraceReturns, vtrace
from zmqrl.types import Batch, RolloutBatch

# Names of a batch's columns on the device (RolloutBatch's, and the gather index of the bootstraps).
COLUMNS = (
    "obs",
    "action",
    "logp",
    "reward",
    "terminated",
    "truncated",
    "final_obs",
    "final_index",
    "core_state",
    "final_step",
)
# Device dtypes of the columns that have a fixed one (observations keep theirs; actions: see
# `column_dtypes`).
DTYPES = {
    "logp": torch.float32,
    "reward": torch.float32,
    "terminated": torch.bool,
    "truncated": torch.bool,
    "final_index": torch.int64,
    "core_state": torch.float32,
    "final_step": torch.int64,
}


class Rollouts(NamedTuple):
    """A RolloutBatch's columns as tensors on the agent's device."""

    obs: torch.Tensor  # (R, T + 1, *obs_shape)
    actions: torch.Tensor  # (R, T) int64 or (R, T, act_dim) float32
    behaviour: torch.Tensor  # (R, T) the actors' log-probabilities
    rewards: torch.Tensor  # (R, T)
    terminated: torch.Tensor  # (R, T) bool
    truncated: torch.Tensor  # (R, T) bool
    final_obs: torch.Tensor  # (K, *obs_shape), or (capacity, ...) padded with zeros
    final_index: torch.Tensor  # (R, T) int64: the final_obs row of each truncated step (else 0)
    core_state: torch.Tensor  # (R, 2, H) each row's start state; (R, 2, 0) for a feed-forward policy
    final_step: torch.Tensor  # (K,) int64: the flat step (r * T + t) of each final_obs row (padded: 0)


class FirstPass(NamedTuple):
    """The forward pass over a whole batch and the targets computed from it."""

    logp: torch.Tensor  # (R * T,) the current policy's log-probabilities of the actions
    entropy: torch.Tensor  # (R * T,)
    values: torch.Tensor  # (R, T) V(obs[:, :T])
    targets: VTraceReturns


def column_dtypes(discrete: bool) -> dict[str, torch.dtype]:
    """The device dtype of each column with a fixed one."""
    return {**DTYPES, "action": torch.int64 if discrete else torch.float32}


def final_capacity(truncations: int, rows: int) -> int:
    """``final_obs`` rows of a captured update: ``rows`` times the smallest power of two that
    holds ``truncations`` (one truncation per rollout is the common case: one graph serves it)."""
    capacity = rows
    while capacity < truncations:
        capacity *= 2
    return capacity


def rollout_arrays(batch: Batch, core_size: int = 0) -> dict[str, np.ndarray]:
    """``batch``'s columns by name (``COLUMNS``) after the checks the update relies on, with the
    bootstraps' gather indices; ``core_size``: the recurrent policy's state width (0: none)."""
    if not isinstance(batch, RolloutBatch):
        raise TypeError(f"APPOAgent trains on RolloutBatch, got {type(batch).__name__}")
    truncated = np.asarray(batch.truncated, dtype=bool)
    count = int(np.count_nonzero(truncated))
    if count != len(batch.final_obs):
        raise ValueError(f"final_obs has {len(batch.final_obs)} rows, one per truncated step is {count}")
    # Row-major, as RolloutBatch orders final_obs; steps not truncated point at row 0 (unused).
    final_index = np.maximum(np.cumsum(truncated.reshape(-1)) - 1, 0).reshape(truncated.shape)
    columns = batch._asdict()
    rows = len(batch.reward)
    state = batch.core_state
    if core_size:
        if state is None or state.shape != (rows, 2, core_size):
            got = None if state is None else state.shape
            want = (rows, 2, core_size)
            raise ValueError(f"a recurrent agent's rollouts carry core_state {want}, got {got}")
    elif state is not None:
        raise ValueError(f"a feed-forward agent's rollouts carry no core_state, got {state.shape}")
    else:
        columns["core_state"] = np.zeros((rows, 2, 0), np.float32)
    final_step = np.flatnonzero(truncated.reshape(-1)).astype(np.int64)
    columns.update(truncated=truncated, final_index=final_index, final_step=final_step)
    return {name: columns[name] for name in COLUMNS}


def padded(arrays: dict[str, np.ndarray], capacity: int) -> dict[str, np.ndarray]:
    """``arrays`` with ``final_obs`` padded by zero rows to ``capacity`` (a captured update's)."""
    final_obs = arrays["final_obs"]
    if len(final_obs) == capacity:
        return arrays
    rows = np.zeros((capacity, *final_obs.shape[1:]), dtype=final_obs.dtype)
    rows[: len(final_obs)] = final_obs
    steps = np.zeros(capacity, np.int64)
    steps[: len(final_obs)] = arrays["final_step"]
    return {**arrays, "final_obs": rows, "final_step": steps}


def as_rollouts(columns: dict[str, torch.Tensor]) -> Rollouts:
    """The device columns by name (``COLUMNS``) as a :class:`Rollouts`."""
    return Rollouts(*(columns[name] for name in COLUMNS))


def first_pass(
    policy: APPOPolicyNet, value: ValueNet | RecurrentValue, cfg: APPOConfig, data: Rollouts, grad: bool
) -> FirstPass:
    """Steps 1-3 (``zmqrl.agents.appo``): one forward pass of both networks over the whole batch
    (with gradient if ``grad``, for the first step to reuse), and the V-trace targets from it."""
    rows, steps = data.rewards.shape
    with torch.set_grad_enabled(grad):
        # 1. Values of every observation (obs and final_obs in one pass), and the current
        # policy's log-probabilities of the actions taken (a recurrent policy: from each row's
        # unroll, zmqrl.agents.appo_rnn).
        if policy.recurrent:
            row_values, final_values, logp, entropy = recurrent_outputs(policy, value, data)  # type: ignore[arg-type]
        else:
            all_values = value(torch.cat([data.obs.flatten(0, 1), data.final_obs]))
            row_values = all_values[: rows * (steps + 1)].reshape(rows, steps + 1)
            final_values = all_values[rows * (steps + 1) :]
            obs, actions = data.obs[:, :steps].flatten(0, 1), data.actions.flatten(0, 1)
            logp, entropy = policy.log_prob_entropy(obs, actions)
    with torch.no_grad():
        values = row_values.detach()
        # 2. Truncations bootstrap from final_obs; where() keeps a padded row's value out.
        final_values = final_values.detach()
        if final_values.numel():
            bootstraps = torch.where(data.truncated, final_values[data.final_index], 0.0)
        else:
            bootstraps = torch.zeros_like(data.rewards)
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
    return FirstPass(logp, entropy, row_values[:, :steps], targets)


@torch.no_grad()
def nonfinite(
    data: Rollouts, targets: VTraceReturns, captured: bool = False, inputs: tuple[Field, ...] = ()
) -> Flag:
    """Whether the batch's float columns or its targets hold a NaN or infinity (or sum past
    float32's range), as a :data:`zmqrl.agents.updates.Flag` (a device tensor when ``captured``
    or on an accelerator): then no step is taken.

    Checked as a whole, before any step: a bad value poisons only the minibatches that hold
    its row (an infinite observation saturates tanh, finite forward, NaN gradient), so the
    steps on the other rows would otherwise change the weights of an update that says
    ``skipped``.

    Records (``inputs``: a Dict observation's keys) arrive as their bytes, so their float keys are
    read out of them (views) to be checked as a plain observation is.
    """
    columns = [targets.vs, targets.pg_advantages, data.behaviour, data.obs, data.final_obs, data.actions]
    columns.append(data.core_state)
    for field in inputs:
        if field.dtype.startswith("float"):
            columns += [field_tensor(data.obs, field), field_tensor(data.final_obs, field)]
    sums = [t.sum().to(torch.float32) for t in columns if t.is_floating_point() and t.numel()]
    total = torch.stack(sums).sum()
    if total.device.type == "cpu" and not captured:
        return not math.isfinite(total.item())
    return ~torch.isfinite(total)
