"""V-trace (Espeholt et al., 2018): off-policy corrected value targets and policy-gradient advantages.

An on-policy learner trains on rollouts that actors sampled with weights a few versions old. V-trace
corrects for that lag with truncated importance weights ``pi / mu`` between the policy being trained
(``target``) and the one that acted (``behaviour``): the value targets ``vs`` follow the target
policy (exactly so while ``rho_bar`` does not truncate), and the advantages weight each step's
policy gradient. With ``pi == mu`` and the bars at 1 they reduce to the n-step bootstrapped return
(TD(lambda=1) cut at episode ends), and the advantages to ``r + gamma * vs' - v``.

Tensors are batch-major ``(R, T)``: one row per rollout, as ``zmqrl.types.RolloutBatch`` holds
them. The recursion runs backwards over the T steps, each one vectorized over the R rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# The log importance ratio is clamped to +-this before ``exp``: a hostile or extreme behaviour
# log-probability (e.g. -1e30) would otherwise make the ratio inf or 0 and, through 0 * inf, NaN
# targets. exp(20) ~ 5e8 is far beyond any truncation bar, so no real ratio is changed.
LOG_RATIO_LIMIT = 20.0


class VTraceReturns(NamedTuple):
    """V-trace's outputs, each ``(R, T)``, computed without gradient."""

    vs: torch.Tensor  # value targets
    pg_advantages: torch.Tensor  # min(pg_rho_bar, pi/mu) * (r + discount * vs' - v)
    rhos: torch.Tensor  # min(rho_bar, pi/mu): the clipped importance weights, for metrics


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
) -> VTraceReturns:
    """V-trace targets for ``R`` rollouts of ``T`` steps.

    ``behaviour_logp``, ``target_logp``: log-probabilities ``(R, T)`` of the actions taken, under
    the policy that acted (mu) and the one trained (pi). ``rewards`` ``(R, T)``; ``discounts``
    ``(R, T)``: ``gamma * (1 - done)`` per step (a truncated step's bootstrap belongs in its reward:
    the next value in the row is the next episode's). ``values`` ``(R, T)``: V(x_t);
    ``bootstrap`` ``(R,)``: V(x_T), the value after the last step.

    With ``rho_t = min(rho_bar, pi/mu)``, ``c_t = min(c_bar, pi/mu)`` and
    ``delta_t = rho_t (r_t + discount_t v_{t+1} - v_t)``::

        vs_t = v_t + delta_t + discount_t c_t (vs_{t+1} - v_{t+1}),   vs_T = v_T = bootstrap
        pg_advantage_t = min(pg_rho_bar, pi/mu) (r_t + discount_t vs_{t+1} - v_t)
    """
    if values.ndim != 2 or bootstrap.shape != values.shape[:1]:
        raise ValueError(
            f"values must be (R, T) and bootstrap (R,), got {values.shape} and {bootstrap.shape}"
        )
    for name, tensor in (
        ("behaviour_logp", behaviour_logp),
        ("target_logp", target_logp),
        ("rewards", rewards),
        ("discounts", discounts),
    ):
        if tensor.shape != values.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(values.shape)}")
    ratios = (target_logp - behaviour_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
    rhos = ratios.clamp(max=rho_bar)
    cs = ratios.clamp(max=c_bar)
    next_values = torch.cat([values[:, 1:], bootstrap[:, None]], dim=1)
    deltas = rhos * (rewards + discounts * next_values - values)
    decayed = discounts * cs  # how much of vs_{t+1} - v_{t+1} flows back into step t

    corrections = torch.empty_like(values)  # vs_t - v_t
    correction = torch.zeros_like(bootstrap)  # vs_T - v_T = 0
    for t in range(values.shape[1] - 1, -1, -1):
        correction = deltas[:, t] + decayed[:, t] * correction
        corrections[:, t] = correction
    vs = values + corrections

    next_vs = torch.cat([vs[:, 1:], bootstrap[:, None]], dim=1)
    pg_advantages = ratios.clamp(max=pg_rho_bar) * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs, pg_advantages, rhos)
