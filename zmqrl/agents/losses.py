"""The losses of DQN, SAC, APPO and R2D2 as plain functions of tensors, each in its paper's order with one
named intermediate per term.

They take the networks' outputs and the batch's columns and return the loss with what the agent
reports about it; they run no network and take no step. The agents call them from both ways an
update runs, eagerly and captured (``zmqrl.agents.capture``), so the two share every number.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from zmqrl.agents.vtrace import LOG_RATIO_LIMIT

# Added to the advantages' standard deviation before dividing by it (a constant minibatch).
ADVANTAGE_EPS = 1e-8


class DQNLoss(NamedTuple):
    loss: torch.Tensor  # the (weighted) mean Huber loss, with gradient
    old_val: torch.Tensor  # (B,) Q(s, a) of the actions taken, detached
    td_target: torch.Tensor  # (B,) r + discount * target_max
    target_max: torch.Tensor  # (B,) the target net's value of the next state
    td_error: torch.Tensor  # (B,) td_target - old_val: the rows' new priorities, as |td_error|


def dqn_loss(
    q: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    next_target_q: torch.Tensor,
    next_online_q: torch.Tensor | None = None,
    huber_delta: float = 1.0,
    importance: torch.Tensor | None = None,
) -> DQNLoss:
    """DQN's TD loss (Mnih et al., 2015) on an n-step batch.

    ``q`` ``(B, A)``: the online net's values of ``obs``; ``next_target_q`` ``(B, A)``: the target
    net's of ``next_obs``. Given ``next_online_q`` (the online net's values of ``next_obs``), the
    target is double DQN's (van Hasselt et al., 2016): the online net picks the next action and
    the target net values it, which curbs the max operator's overestimation. ``discounts`` hold
    ``gamma**n`` (0 after a termination), so gamma is not applied again here.
    """
    with torch.no_grad():
        if next_online_q is None:
            target_max = next_target_q.max(dim=1).values
        else:
            next_action = next_online_q.argmax(dim=1, keepdim=True)
            target_max = next_target_q.gather(1, next_action).squeeze(1)
        td_target = rewards + discounts * target_max
    old_val = q.gather(1, actions.unsqueeze(1)).squeeze(1)
    row_loss = F.huber_loss(old_val, td_target, delta=huber_delta, reduction="none")
    loss = row_loss.mean() if importance is None else (importance * row_loss).mean()
    old_val = old_val.detach()
    return DQNLoss(loss, old_val, td_target, target_max, td_target - old_val)


class SACCriticLoss(NamedTuple):
    loss: torch.Tensor  # the twin critics' (weighted) mean squared TD error, with gradient
    td_target: torch.Tensor  # (B,) the soft Bellman backup
    q1_error: torch.Tensor  # (B,) Q1(s, a) - td_target, detached
    q2_error: torch.Tensor  # (B,) Q2(s, a) - td_target, detached


def sac_critic_loss(
    q1: torch.Tensor,
    q2: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    next_q1_target: torch.Tensor,
    next_q2_target: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor,
    importance: torch.Tensor | None = None,
) -> SACCriticLoss:
    """SAC's critic loss (Haarnoja et al., 2018): both critics regress on the soft Bellman backup
    of the smaller target critic at a fresh next action ``a' ~ pi(next_obs)`` (``next_q*_target``,
    ``next_log_prob``: its values and log-probability)."""
    with torch.no_grad():
        min_next_q = torch.min(next_q1_target, next_q2_target)
        soft_next_value = min_next_q - alpha * next_log_prob
        td_target = rewards + discounts * soft_next_value
    q1_error, q2_error = q1 - td_target, q2 - td_target
    row_loss = q1_error.square() + q2_error.square()
    loss = row_loss.mean() if importance is None else (importance * row_loss).mean()
    return SACCriticLoss(loss, td_target, q1_error.detach(), q2_error.detach())


def sac_actor_loss(
    q1_pi: torch.Tensor, q2_pi: torch.Tensor, log_prob: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    """SAC's policy loss: maximise the soft value ``min Q(s, a~pi) - alpha * log pi(a|s)``
    (``q*_pi``: the critics' values of the policy's reparameterised actions)."""
    min_q_pi = torch.min(q1_pi, q2_pi)
    return (alpha * log_prob - min_q_pi).mean()


def sac_alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """The entropy weight's loss: alpha grows while the policy's entropy (``-log_prob``) is below
    ``target_entropy`` and shrinks above it. Its gradient in ``log_alpha`` is the loss itself."""
    entropy_gap = log_prob.detach() + target_entropy
    return (-log_alpha.exp() * entropy_gap).mean()


class APPOLoss(NamedTuple):
    loss: torch.Tensor  # policy_loss + vf_coef * value_loss - ent_coef * entropy, with gradient
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor  # the mean entropy
    approx_kl: torch.Tensor  # Schulman's k3 estimator of KL(mu || pi), detached
    clip_fraction: torch.Tensor  # the share of steps whose ratio the clip moved, detached
    ratio_mean: torch.Tensor


def appo_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    behaviour_logp: torch.Tensor,
    vs: torch.Tensor,
    advantages: torch.Tensor,
    clip: float | None,
    vf_coef: float,
    ent_coef: float,
    normalize_advantages: bool = False,
) -> APPOLoss:
    """APPO's loss on one minibatch of steps (all ``(N,)``), its V-trace targets ``vs`` and
    ``advantages`` (V-trace's ``pg_advantages``) given (``zmqrl.agents.vtrace``): PPO's clipped
    surrogate (Schulman et al., 2017) on the ratio ``pi / mu`` between the policy trained
    (``logp``) and the actors' (``behaviour_logp``), or with ``clip`` None IMPALA's
    ``-logp * advantage`` (its advantages already carry the truncated importance weights);
    ``0.5 (V - vs)^2``; the entropy bonus."""
    log_ratio = (logp - behaviour_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    if normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + ADVANTAGE_EPS)
    if clip is None:
        policy_loss = -(logp * advantages).mean()
    else:
        clipped_ratio = ratio.clamp(1.0 - clip, 1.0 + clip)
        policy_loss = -torch.min(ratio * advantages, clipped_ratio * advantages).mean()
    value_loss = 0.5 * (values - vs).square().mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy_mean
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        if clip is None:
            clip_fraction = torch.zeros((), device=ratio.device)
        else:
            clip_fraction = ((ratio - 1.0).abs() > clip).to(torch.float32).mean()
        ratio_mean = ratio.mean()
    return APPOLoss(loss, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction, ratio_mean)


class R2D2Loss(NamedTuple):
    loss: torch.Tensor  # the (importance-weighted) mean Huber loss over learned steps, with gradient
    old_val: torch.Tensor  # (R, T) Q(s, a) of the actions taken, detached
    td_target: torch.Tensor  # (R, T) n-step return plus the discounted bootstrap value
    td_error: torch.Tensor  # (R, T) td_target - old_val, zero where no step is learned
    priorities: torch.Tensor  # (R,) eta * max|td| + (1 - eta) * mean|td| over each row's learned steps


def r2d2_loss(
    q: torch.Tensor,
    target_q: torch.Tensor,
    next_online_q: torch.Tensor | None,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    learned: torch.Tensor,
    gamma: float,
    n_step: int,
    eta: float,
    huber_delta: float = 1.0,
    importance: torch.Tensor | None = None,
) -> R2D2Loss:
    """R2D2's loss (Kapturowski et al., 2019) on the learned part of a batch of windows, after
    burn-in: n-step double-Q targets inside each window, without crossing its end.

    ``q`` ``(R, T + 1, A)``: the online net's values at the T learned positions and the observation
    after them; ``target_q`` the target net's, ``next_online_q`` the online net's detached (double
    Q; None: the target net's max). ``learned`` ``(R, T)``: the positions that are real steps (the
    rest padding after an episode's end). The target of step t sums the rewards of the k <= n real
    steps from t (fewer at a window's or episode's end) and bootstraps from the value at t + k with
    ``gamma ** k``, or not at all when step t + k - 1 terminated the episode.
    """
    rows, steps = rewards.shape
    with torch.no_grad():
        real = learned.to(rewards.dtype)
        ends = terminated.to(rewards.dtype)
        pad = (0, n_step)  # past the window: no step, so every sum stops there
        reward_ahead, real_ahead, end_ahead = (F.pad(x, pad) for x in (rewards, real, ends))
        positions = torch.arange(steps, device=rewards.device).expand(rows, steps)
        n_step_return = torch.zeros_like(rewards)
        discount = real.clone()  # padding reads nothing (a masked terminal row's values are -1e9)
        bootstrap_at = positions.clone()
        going = real.clone()  # 1 while the return from t still runs through real, unfinished steps
        for k in range(n_step):
            taken = going * real_ahead[:, k : k + steps]
            n_step_return += (gamma**k) * taken * reward_ahead[:, k : k + steps]
            ended = end_ahead[:, k : k + steps]
            discount = torch.where(taken > 0, (gamma ** (k + 1)) * (1.0 - ended), discount)
            bootstrap_at = torch.where(taken > 0, positions + k + 1, bootstrap_at)
            going = taken * (1.0 - ended)
        if next_online_q is None:
            bootstrap_values = target_q.max(dim=2).values
        else:
            best = next_online_q.argmax(dim=2, keepdim=True)
            bootstrap_values = target_q.gather(2, best).squeeze(2)
        bootstrap = bootstrap_values.gather(1, bootstrap_at)
        td_target = n_step_return + discount * bootstrap
    old_val = q[:, :steps].gather(2, actions.unsqueeze(2)).squeeze(2)
    step_loss = F.huber_loss(old_val, td_target, delta=huber_delta, reduction="none") * real
    if importance is not None:
        step_loss = step_loss * importance.unsqueeze(1)
    loss = step_loss.sum() / real.sum().clamp(min=1.0)
    old_val = old_val.detach()
    td_error = (td_target - old_val) * real
    td_abs = td_error.abs()
    counts = real.sum(dim=1).clamp(min=1.0)
    priorities = eta * td_abs.max(dim=1).values + (1.0 - eta) * td_abs.sum(dim=1) / counts
    return R2D2Loss(loss, old_val, td_target, td_error, priorities)
