"""The losses (zmqrl.agents.losses) on batches of two rows, against numbers worked out by hand in
the comments: each term of each paper's loss, what carries a gradient and what does not."""

from __future__ import annotations

import math

import pytest
import torch

from zmqrl.agents.losses import appo_loss, dqn_loss, sac_actor_loss, sac_alpha_loss, sac_critic_loss


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def approx(*values: float) -> object:
    return pytest.approx(list(values), rel=1e-6, abs=1e-6)


# Two DQN rows, two actions: row 0 took action 1 and goes on (n-step discount 0.9); row 1 took
# action 0 and terminated (discount 0).
Q = torch.tensor([[1.0, 2.0], [0.5, -1.0]], requires_grad=True)
ACTIONS = torch.tensor([1, 0])
REWARDS, DISCOUNTS = t(1.0, 0.0), t(0.9, 0.0)
NEXT_TARGET_Q = torch.tensor([[3.0, 0.0], [5.0, 7.0]])


def test_dqn_bootstraps_from_the_target_nets_max_and_takes_huber_of_the_td_error() -> None:
    out = dqn_loss(Q, ACTIONS, REWARDS, DISCOUNTS, NEXT_TARGET_Q)
    assert out.target_max.tolist() == approx(3.0, 7.0)
    assert out.td_target.tolist() == approx(1.0 + 0.9 * 3.0, 0.0)  # a termination bootstraps nothing
    assert out.old_val.tolist() == approx(2.0, 0.5)  # Q of the actions taken
    assert out.td_error.tolist() == approx(1.7, -0.5)
    # Huber (delta 1): linear past 1 (1.7 - 0.5 = 1.2), quadratic within (0.5 * 0.5**2 = 0.125).
    assert out.loss.item() == pytest.approx((1.2 + 0.125) / 2)


def test_double_dqn_lets_the_online_net_pick_the_next_action_and_the_target_net_value_it() -> None:
    next_online_q = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # picks action 1, then action 0
    out = dqn_loss(Q, ACTIONS, REWARDS, DISCOUNTS, NEXT_TARGET_Q, next_online_q)
    assert out.target_max.tolist() == approx(0.0, 5.0)  # not the target net's own max (3, 7)
    assert out.td_target.tolist() == approx(1.0, 0.0)
    assert out.loss.item() == pytest.approx((0.5 * 1.0**2 + 0.125) / 2)


def test_dqn_weights_each_row_by_its_importance_and_a_wider_huber_is_quadratic_further() -> None:
    weighted = dqn_loss(Q, ACTIONS, REWARDS, DISCOUNTS, NEXT_TARGET_Q, importance=t(0.5, 2.0))
    assert weighted.loss.item() == pytest.approx((0.5 * 1.2 + 2.0 * 0.125) / 2)
    wide = dqn_loss(Q, ACTIONS, REWARDS, DISCOUNTS, NEXT_TARGET_Q, huber_delta=2.0)
    assert wide.loss.item() == pytest.approx((0.5 * 1.7**2 + 0.125) / 2)


def test_dqns_gradient_reaches_only_the_values_of_the_actions_taken() -> None:
    q = Q.detach().clone().requires_grad_(True)
    next_target_q = NEXT_TARGET_Q.clone().requires_grad_(True)
    out = dqn_loss(q, ACTIONS, REWARDS, DISCOUNTS, next_target_q)
    out.loss.backward()
    assert q.grad is not None
    # d Huber / d Q: the TD error clipped to +-delta, over the 2 rows' mean.
    assert q.grad.tolist() == [approx(0.0, -1.0 / 2), approx(0.5 / 2, 0.0)]
    assert next_target_q.grad is None  # the target is a constant
    assert not (out.td_target.requires_grad or out.old_val.requires_grad or out.td_error.requires_grad)


def test_sac_critics_regress_on_the_soft_backup_of_the_smaller_target_critic() -> None:
    q1, q2 = t(1.0, 2.0).requires_grad_(True), t(1.5, 1.0).requires_grad_(True)
    out = sac_critic_loss(
        q1,
        q2,
        rewards=t(1.0, -1.0),
        discounts=t(0.5, 0.0),
        next_q1_target=t(2.0, 4.0),
        next_q2_target=t(3.0, 1.0),
        next_log_prob=t(-1.0, 0.5),
        alpha=torch.tensor(0.2),
    )
    # min target Q (2, 1), minus alpha * log pi: (2 + 0.2, 1 - 0.1); row 1 terminated.
    assert out.td_target.tolist() == approx(1.0 + 0.5 * 2.2, -1.0)
    assert out.q1_error.tolist() == approx(1.0 - 2.1, 2.0 + 1.0)
    assert out.q2_error.tolist() == approx(1.5 - 2.1, 1.0 + 1.0)
    assert out.loss.item() == pytest.approx(((1.1**2 + 0.6**2) + (3.0**2 + 2.0**2)) / 2)
    out.loss.backward()
    assert q1.grad is not None and q1.grad.tolist() == approx(2 * -1.1 / 2, 2 * 3.0 / 2)
    backup = (t(1.0, -1.0), t(0.5, 0.0), t(2.0, 4.0), t(3.0, 1.0), t(-1.0, 0.5), torch.tensor(0.2))
    weighted = sac_critic_loss(q1, q2, *backup, importance=t(2.0, 0.0))  # row 1 weighs nothing
    assert weighted.loss.item() == pytest.approx(2.0 * (1.1**2 + 0.6**2) / 2)


def test_sacs_actor_maximises_the_smaller_critic_minus_alpha_log_pi() -> None:
    log_prob = t(-1.0, -2.0).requires_grad_(True)
    loss = sac_actor_loss(t(1.0, 3.0), t(2.0, 0.0), log_prob, alpha=torch.tensor(0.5))
    # alpha * log pi (-0.5, -1.0) minus min Q (1, 0).
    assert loss.item() == pytest.approx((-1.5 + -1.0) / 2)
    loss.backward()
    assert log_prob.grad is not None and log_prob.grad.tolist() == approx(0.25, 0.25)


def test_sacs_alpha_shrinks_while_the_entropy_is_above_its_target() -> None:
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    log_prob = t(-1.0, -3.0).requires_grad_(True)  # entropy -log pi: 2 on average
    loss = sac_alpha_loss(log_alpha, log_prob, target_entropy=-2.0)
    # -alpha * (log pi + target): -0.5 * (-3, -5).
    assert loss.item() == pytest.approx((1.5 + 2.5) / 2)
    loss.backward()
    # Its gradient in log(alpha) is the loss itself: positive, so a step lowers alpha.
    assert log_alpha.grad is not None and log_alpha.grad.item() == pytest.approx(2.0)
    assert log_prob.grad is None  # the policy is not trained by alpha's loss
    below = sac_alpha_loss(log_alpha, t(1.0, 1.0), target_entropy=0.0)  # entropy -1 < 0
    assert below.item() < 0


# Two APPO steps: the current policy makes its actions 1.5 and 0.5 times as likely as the actors'
# did (behaviour log-probability 0), with advantages 2 and -1.
LOGP, BEHAVIOUR = t(math.log(1.5), math.log(0.5)), t(0.0, 0.0)
ENTROPY, VALUES, VS, ADVANTAGES = t(0.6, 0.4), t(1.0, 0.0), t(2.0, 1.0), t(2.0, -1.0)


def test_appo_takes_the_pessimistic_clipped_surrogate_plus_value_and_entropy_terms() -> None:
    out = appo_loss(LOGP, ENTROPY, VALUES, BEHAVIOUR, VS, ADVANTAGES, clip=0.2, vf_coef=0.5, ent_coef=0.01)
    # ratio (1.5, 0.5), clipped (1.2, 0.8); min(ratio * A, clipped * A) = (2.4, -0.8).
    assert out.policy_loss.item() == pytest.approx(-(2.4 - 0.8) / 2)
    assert out.value_loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    assert out.entropy.item() == pytest.approx(0.5)
    assert out.loss.item() == pytest.approx(-0.8 + 0.5 * 0.5 - 0.01 * 0.5)
    assert out.ratio_mean.item() == pytest.approx(1.0)
    assert out.clip_fraction.item() == 1.0  # both ratios are 0.5 from 1, past the clip
    # KL's k3 estimator: mean of (r - 1) - log r.
    k3 = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert out.approx_kl.item() == pytest.approx(k3, rel=1e-5)


def test_appo_without_a_clip_is_impalas_policy_gradient() -> None:
    out = appo_loss(LOGP, ENTROPY, VALUES, BEHAVIOUR, VS, ADVANTAGES, clip=None, vf_coef=0.5, ent_coef=0.01)
    assert out.policy_loss.item() == pytest.approx(-(math.log(1.5) * 2.0 + math.log(0.5) * -1.0) / 2)
    assert out.clip_fraction.item() == 0.0


def test_appo_normalizes_the_advantages_of_its_minibatch_when_asked() -> None:
    out = appo_loss(LOGP, ENTROPY, VALUES, BEHAVIOUR, VS, ADVANTAGES, 0.2, 0.5, 0.01, True)
    # (2, -1): mean 0.5, standard deviation 1.5 -> (1, -1); min(ratio * A, clipped * A) = (1.2, -0.8).
    assert out.policy_loss.item() == pytest.approx(-(1.2 - 0.8) / 2, rel=1e-5)


def test_appos_gradient_flows_into_the_policy_and_the_value_only() -> None:
    logp, values = LOGP.clone().requires_grad_(True), VALUES.clone().requires_grad_(True)
    entropy, behaviour, vs = ENTROPY.clone().requires_grad_(True), t(0.0, 0.0), VS.clone()
    out = appo_loss(logp, entropy, values, behaviour, vs, ADVANTAGES, clip=0.2, vf_coef=0.5, ent_coef=0.01)
    out.loss.backward()
    # vf_coef * d/dV 0.5 (V - vs)^2, over 2 steps; -ent_coef per step's entropy, over 2.
    assert values.grad is not None and values.grad.tolist() == approx(0.5 * -1.0 / 2, 0.5 * -1.0 / 2)
    assert entropy.grad is not None and entropy.grad.tolist() == approx(-0.01 / 2, -0.01 / 2)
    # Both ratios are clipped on the pessimistic side: the surrogate gives logp no gradient.
    assert logp.grad is not None and logp.grad.tolist() == approx(0.0, 0.0)
    assert not (out.approx_kl.requires_grad or out.clip_fraction.requires_grad)
