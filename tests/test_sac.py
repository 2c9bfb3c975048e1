"""Behaviour of the SAC agent: squashed-Gaussian acting, the policy-only weight sync, the soft
actor-critic update, checkpoints, and one short learning run on Pendulum."""

from __future__ import annotations

import copy
import io
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from tests.test_dqn import params, same
from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_learner
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.numpy_policies import NumpySACPolicy
from zmqrl.agents.sac import LOG_STD_MAX, LOG_STD_MIN, SACAgent
from zmqrl.agents.sac_nets import squashed_gaussian_log_prob
from zmqrl.core import LearningAgent, Policy
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

torch.set_num_threads(1)

OBS_SHAPE = (5,)
LOW = np.array([-1.0, 0.0, 2.0], np.float32)  # asymmetric, offset bounds catch a missing rescale
HIGH = np.array([3.0, 0.5, 2.5], np.float32)
ACT_DIM = 3
SPEC = SampleSpec(OBS_SHAPE, "float32", (ACT_DIM,), "float32", action_low=tuple(LOW), action_high=tuple(HIGH))


def box(
    act_dim: int, low: object = None, high: object = None, obs_shape: tuple[int, ...] = OBS_SHAPE
) -> SampleSpec:
    return SampleSpec(obs_shape, "float32", (act_dim,), "float32", action_low=low, action_high=high)  # type: ignore[arg-type]


def make_sac(seed: int = 0, **overrides: object) -> SACAgent:
    config = SACConfig(hidden_sizes=[32, 32], device="cpu", **overrides)  # type: ignore[arg-type]
    return SACAgent(config, SPEC, seed=seed)


def random_obs(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *OBS_SHAPE)).astype(np.float32)


def fake_batch(n: int = 32, seed: int = 2, discount: float = 0.97) -> TransitionBatch:
    rng = np.random.default_rng(seed)
    return TransitionBatch(
        obs=rng.standard_normal((n, *OBS_SHAPE)).astype(np.float32),
        action=rng.uniform(LOW, HIGH, size=(n, ACT_DIM)).astype(np.float32),
        reward=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, *OBS_SHAPE)).astype(np.float32),
        discount=np.full(n, discount, dtype=np.float32),
    )


def in_bounds(actions: np.ndarray) -> bool:
    return bool(np.all(actions >= LOW) and np.all(actions <= HIGH))


# ---------------------------------------------------------------------------------- acting


def test_agent_satisfies_the_core_protocol() -> None:
    assert isinstance(make_sac(), LearningAgent) and isinstance(make_sac(), Policy)


@pytest.mark.parametrize(("explore", "epsilon"), [(False, 0.0), (True, 0.0), (True, 0.5), (True, 1.0)])
def test_actions_are_float32_within_asymmetric_bounds(explore: bool, epsilon: float) -> None:
    agent = make_sac()
    with torch.no_grad():  # a wide policy: many samples squash onto the bounds themselves
        agent.policy.log_std.bias.fill_(LOG_STD_MAX)
        agent.policy.mean.weight.mul_(50.0)
    explorer = EpsilonExplorer(agent, SPEC, seed=0, epsilon=epsilon)
    actions = explorer.act(random_obs(2000)) if explore else agent.act(random_obs(2000), explore=False)
    assert actions.dtype == np.float32 and actions.shape == (2000, ACT_DIM)
    assert in_bounds(actions)
    if explore:  # the spread reaches (nearly) both ends of every dimension
        assert np.all(actions.min(axis=0) - LOW < 0.05 * (HIGH - LOW))
        assert np.all(HIGH - actions.max(axis=0) < 0.05 * (HIGH - LOW))


def test_the_explorers_epsilon_one_is_uniform_on_the_box() -> None:
    explorer = EpsilonExplorer(make_sac(), SPEC, seed=0, epsilon=1.0)
    obs = np.repeat(random_obs(1), 4000, axis=0)
    actions = explorer.act(obs)
    assert np.all(np.abs(actions.mean(axis=0) - (LOW + HIGH) / 2) < 0.03 * (HIGH - LOW))
    np.testing.assert_allclose(actions.std(axis=0), (HIGH - LOW) / math.sqrt(12), rtol=0.05)


def test_the_explorers_partial_epsilon_replaces_that_share_of_rows() -> None:
    agent = make_sac()
    explorer = EpsilonExplorer(agent, SPEC, seed=0, epsilon=0.3)
    obs = np.repeat(random_obs(1), 4000, axis=0)
    greedy = agent.act(obs[:1], explore=False)[0]
    with torch.no_grad():
        agent.policy.log_std.bias.fill_(LOG_STD_MIN)  # sampled rows sit on the greedy action
        agent.policy.log_std.weight.zero_()
    actions = explorer.act(obs)
    on_policy = np.all(np.abs(actions - greedy) < 0.05, axis=1)
    assert float(np.mean(~on_policy)) == pytest.approx(0.3, abs=0.04)


def test_greedy_is_deterministic_tanh_of_the_mean_rescaled() -> None:
    agent = make_sac()
    obs = random_obs(64)
    greedy = agent.act(obs, explore=False)
    np.testing.assert_array_equal(agent.act(obs, explore=False), greedy)
    mean, _ = agent.policy_outputs(obs)  # computed by torch: checks the numpy mirror too
    expected = LOW + (np.tanh(mean) + 1.0) / 2.0 * (HIGH - LOW)
    np.testing.assert_allclose(greedy, expected, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(agent.act(obs, explore=True), greedy)


def test_numpy_act_path_tracks_updates_and_matches_torch() -> None:
    agent = make_sac()
    obs = random_obs(256)
    for seed in range(3):
        agent.update(fake_batch(seed=seed))
    assert agent._policy_arrays is not None  # on the CPU, act() goes through numpy
    for mirrored, reference in zip(agent._policy_outputs(obs), agent.policy_outputs(obs), strict=True):
        np.testing.assert_allclose(mirrored, reference, rtol=1e-5, atol=1e-5)


def test_cpu_acting_is_the_numpy_policys_own_code_bit_for_bit() -> None:
    """On the CPU the agent acts through NumpySACPolicy's forward code, on views of its own
    parameters: with the same weights and seed the actions are the very same floats."""
    agent = make_sac(seed=4)
    for seed in range(3):  # updates draw learning noise only, never the acting RNG
        agent.update(fake_batch(seed=seed))
    policy = NumpySACPolicy(agent.config, SPEC, seed=4)
    policy.load_weights(agent.export_weights())
    obs = random_obs(64)
    np.testing.assert_array_equal(agent._policy_outputs(obs), policy.policy_outputs(obs))
    for epsilon in (0.0, 0.5, np.linspace(0.0, 1.0, 64)):
        mine = EpsilonExplorer(agent, SPEC, seed=9, epsilon=epsilon)
        theirs = EpsilonExplorer(policy, SPEC, seed=9, epsilon=epsilon)
        np.testing.assert_array_equal(mine.act(obs), theirs.act(obs))
        np.testing.assert_array_equal(agent.act(obs, explore=False), policy.act(obs, explore=False))


def test_default_bounds_are_minus_one_to_one_and_bad_bounds_are_refused() -> None:
    agent = SACAgent(SACConfig(hidden_sizes=[8], device="cpu"), box(2), seed=0)
    with torch.no_grad():  # a wide policy: many samples squash onto the bounds themselves
        agent.policy.log_std.bias.fill_(LOG_STD_MAX)
        agent.policy.mean.weight.mul_(50.0)
    actions = agent.act(random_obs(1000), explore=True)
    assert actions.min() >= -1.0 and actions.max() <= 1.0 and actions.min() < -0.9 and actions.max() > 0.9
    config = SACConfig(hidden_sizes=[8], device="cpu")
    for low, high, message in [
        ((-np.inf, -1.0), (1.0, 1.0), "finite"),
        ((1.0, 1.0), (1.0, 1.0), "action_low must be < action_high"),
    ]:
        with pytest.raises(ValueError, match=message):
            SACAgent(config, box(2, low, high))
    with pytest.raises(ValueError, match="1-D Box"):
        SACAgent(config, SampleSpec(OBS_SHAPE, "float32", (2, 2), "float32"))


# ----------------------------------------------------------------------------- log-probability


def test_squashed_log_prob_matches_the_change_of_variables_formula() -> None:
    """log pi(a) = log N(atanh(a); mean, std) - log(1 - a^2), evaluated independently in float64."""
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(1000, 2, generator=gen, dtype=torch.float64)
    log_std = torch.empty(1000, 2, dtype=torch.float64).uniform_(-2.0, 0.5, generator=gen)
    noise = torch.randn(1000, 2, generator=gen, dtype=torch.float64)
    pre_tanh = mean + log_std.exp() * noise
    action = torch.tanh(pre_tanh)
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = (normal.log_prob(pre_tanh) - torch.log1p(-action.square())).sum(dim=1)
    keep = action.abs().max(dim=1).values < 0.999  # where the naive formula is still accurate
    got = squashed_gaussian_log_prob(noise, log_std, pre_tanh)
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-9, atol=1e-9)


def test_squashed_density_integrates_to_one_and_stays_finite_at_saturation() -> None:
    a = torch.linspace(-1.0, 1.0, 200_001, dtype=torch.float64)[1:-1]
    pre_tanh = torch.atanh(a)
    mean, log_std = torch.tensor(0.7, dtype=torch.float64), torch.tensor(-0.3, dtype=torch.float64)
    noise = (pre_tanh - mean) / log_std.exp()
    density = squashed_gaussian_log_prob(noise[:, None], log_std.expand(len(a), 1), pre_tanh[:, None]).exp()
    assert float(torch.trapezoid(density, a)) == pytest.approx(1.0, abs=1e-3)
    # float32 tanh rounds to exactly 1 here; the stable form still gives a finite value.
    far = torch.tensor([[30.0]])
    assert torch.isfinite(squashed_gaussian_log_prob(torch.zeros(1, 1), torch.zeros(1, 1), far)).all()


def test_policy_samples_come_with_their_own_log_probs() -> None:
    agent = make_sac()
    obs = torch.from_numpy(random_obs(500))
    actions, log_prob = agent.policy.sample(obs, torch.Generator().manual_seed(3))
    mean, log_std = (t.detach().double() for t in agent.policy(obs))
    a = actions.detach().double()
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = (normal.log_prob(torch.atanh(a)) - torch.log1p(-a.square())).sum(dim=1)
    keep = a.abs().max(dim=1).values < 0.999
    torch.testing.assert_close(log_prob.detach().double()[keep], expected[keep], rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------------- weight sync


def test_export_load_round_trip_makes_actor_act_like_learner() -> None:
    learner, actor = make_sac(seed=0), make_sac(seed=1)
    learner.update(fake_batch())
    obs = random_obs(128)
    assert not np.array_equal(learner.act(obs, explore=False), actor.act(obs, explore=False))
    actor.load_weights(learner.export_weights())
    np.testing.assert_array_equal(actor.act(obs, explore=False), learner.act(obs, explore=False))
    assert not same(params(actor.critic), params(learner.critic))  # critics never travel


def test_weights_cover_only_the_policy_as_float32_copies() -> None:
    agent = make_sac()
    arrays = agent.export_weights()
    assert list(arrays) == list(agent.policy.state_dict())
    assert not any(name.startswith(("q1", "q2", "critic")) for name in arrays)
    assert sum(a.size for a in arrays.values()) == sum(p.numel() for p in agent.policy.parameters())
    for array in arrays.values():
        assert array.dtype == np.float32 and array.flags.c_contiguous
    before = agent.act(random_obs(8), explore=False)
    for array in arrays.values():
        array[...] = 0.0  # mutating the snapshot must not reach the agent
    np.testing.assert_array_equal(agent.act(random_obs(8), explore=False), before)


def test_the_exported_policy_changes_only_with_policy_steps() -> None:
    """What a new weights version means (zmqrl.transport.weights_channel numbers them)."""
    agent = make_sac(policy_update_interval=2)
    first = agent.export_weights()
    agent.update(fake_batch())  # critic step only: the exported policy is unchanged
    assert all(np.array_equal(first[k], v) for k, v in agent.export_weights().items())
    agent.update(fake_batch())  # policy steps
    assert not all(np.array_equal(first[k], v) for k, v in agent.export_weights().items())


def test_read_only_arrays_load() -> None:
    learner, actor = make_sac(seed=0), make_sac(seed=1)
    learner.update(fake_batch(seed=3))
    arrays = learner.export_weights()
    for array in arrays.values():
        array.flags.writeable = False
    actor.load_weights(arrays)
    obs = random_obs(16)
    np.testing.assert_array_equal(actor.act(obs, explore=False), learner.act(obs, explore=False))


@pytest.mark.parametrize(
    ("corruption", "message"),
    [
        ("shape", "'log_std.bias' has shape"),
        ("missing", "missing parameter 'log_std.bias'"),
        ("extra", "unexpected"),
    ],
)
def test_mismatched_weights_raise_and_leave_the_policy_unchanged(corruption: str, message: str) -> None:
    learner, actor = make_sac(seed=0), make_sac(seed=1)
    arrays = learner.export_weights()
    last = list(arrays)[-1]
    if corruption == "shape":
        arrays[last] = np.zeros(arrays[last].shape[0] + 1, dtype=np.float32)
    elif corruption == "missing":
        del arrays[last]
    else:
        arrays["q1.0.weight"] = np.zeros(3, dtype=np.float32)
    before = params(actor.policy)
    with pytest.raises(ValueError, match=message):
        actor.load_weights(arrays)
    assert same(params(actor.policy), before)


def test_actors_have_no_initial_priorities() -> None:
    from zmqrl.agents import make_priorities

    assert make_priorities(SACConfig(), make_sac()) is None, "actors hold no critic"


# -------------------------------------------------------------------------------------- update


def test_one_update_returns_finite_metrics_and_moves_the_targets_by_tau() -> None:
    agent = make_sac(tau=0.5)
    critic_before, target_before = params(agent.critic), params(agent.critic_target)
    policy_before = params(agent.policy)
    metrics = agent.update(fake_batch())
    assert set(metrics) == {
        "critic_loss",
        "actor_loss",
        "alpha",
        "alpha_loss",
        "q_mean",
        "entropy",
        "td_abs_mean",
    }
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert metrics["alpha"] == pytest.approx(1.0)  # the alpha this update used: the initial one
    assert agent.updates == 1
    assert not same(params(agent.policy), policy_before)
    for target, before, online in zip(
        params(agent.critic_target), target_before, params(agent.critic), strict=True
    ):
        torch.testing.assert_close(target, (before + online) / 2)
    assert not same(params(agent.critic), critic_before)


def test_delayed_policy_steps_catch_up_and_targets_follow_their_interval() -> None:
    agent = make_sac(policy_update_interval=3, target_update_interval=2)
    policy_before, target_before = params(agent.policy), params(agent.critic_target)
    for _ in range(2):
        metrics = agent.update(fake_batch())
        assert math.isnan(metrics["actor_loss"])  # no policy step yet
    assert same(params(agent.policy), policy_before)
    assert not agent.policy_optimizer.state_dict()["state"]
    assert not same(params(agent.critic_target), target_before)  # moved at update 2
    metrics = agent.update(fake_batch())
    assert np.isfinite(metrics["actor_loss"])
    assert float(agent.policy_optimizer.state_dict()["state"][0]["step"]) == 3


def test_last_td_errors_average_the_two_critics_per_row() -> None:
    agent = make_sac()
    batch = fake_batch(n=16, discount=0.0)  # target = reward: independent of the sampled next actions
    critic = copy.deepcopy(agent.critic)
    result = agent.update(batch)
    metrics = result.metrics
    actions = (torch.from_numpy(batch.action) - torch.from_numpy((LOW + HIGH) / 2)) / torch.from_numpy(
        (HIGH - LOW) / 2
    )
    with torch.no_grad():
        q1, q2 = critic(torch.from_numpy(batch.obs), actions)
    reward = torch.from_numpy(batch.reward)
    expected = ((q1 - reward).abs() + (q2 - reward).abs()).numpy() / 2
    td = result.td_errors
    assert td.dtype == np.float32 and td.shape == (16,)
    np.testing.assert_allclose(td, expected, rtol=1e-5, atol=1e-6)
    assert metrics["td_abs_mean"] == pytest.approx(float(td.mean()), rel=1e-5)


def test_importance_weights_scale_rows_of_the_critic_loss() -> None:
    def critic_grads(agent: SACAgent) -> list[torch.Tensor]:
        return [p.grad.clone() for p in agent.critic.parameters() if p.grad is not None]

    batch = fake_batch(n=8, discount=0.0)  # discount 0: the (random) next actions cannot matter
    plain, doubled, masked, shorter = (make_sac() for _ in range(4))
    m_plain = plain.update(batch)
    m_doubled = doubled.update(batch, np.full(8, 2.0, np.float32))
    assert m_doubled["critic_loss"] == pytest.approx(2 * m_plain["critic_loss"], rel=1e-6)
    for g_plain, g_doubled in zip(critic_grads(plain), critic_grads(doubled), strict=True):
        torch.testing.assert_close(g_doubled, 2 * g_plain)
    weights = np.ones(8, np.float32)
    weights[-1] = 0.0
    masked.update(batch, weights)
    shorter.update(TransitionBatch(*(column[:7] for column in batch)))
    for g_masked, g_shorter in zip(critic_grads(masked), critic_grads(shorter), strict=True):
        torch.testing.assert_close(g_masked * 8, g_shorter * 7)
    with pytest.raises(ValueError, match="importance must have shape"):
        plain.update(batch, np.ones((8, 1), np.float32))


def test_updates_reduce_the_critic_loss_on_a_fixed_batch() -> None:
    agent = make_sac(critic_lr=3e-3)
    batch = fake_batch(n=64, discount=0.0)
    first = agent.update(batch)["critic_loss"]
    for _ in range(150):
        last = agent.update(batch)["critic_loss"]
    assert last < 0.1 * first


@pytest.mark.parametrize(("target_entropy", "direction"), [(-20.0, -1), (20.0, 1)])
def test_alpha_moves_towards_the_target_entropy(target_entropy: float, direction: int) -> None:
    agent = make_sac(target_entropy=target_entropy, alpha=0.5, alpha_lr=1e-2)
    for seed in range(10):
        metrics = agent.update(fake_batch(seed=seed))
    # The entropy (a few nats here) is far above -20, so alpha falls; far below +20, so it grows.
    assert (metrics["entropy"] - target_entropy) * direction < 0
    assert metrics["alpha_loss"] * direction < 0
    assert (agent.alpha - 0.5) * direction > 0.02


def test_fixed_alpha_stays_put() -> None:
    agent = make_sac(autotune=False, alpha=0.2)
    for seed in range(3):
        metrics = agent.update(fake_batch(seed=seed))
    assert agent.alpha_optimizer is None
    assert agent.alpha == pytest.approx(0.2) and metrics["alpha"] == pytest.approx(0.2)
    assert metrics["alpha_loss"] == 0.0


def test_same_seed_same_weights_and_samples_without_touching_global_rng() -> None:
    state = torch.random.get_rng_state()
    a, b, c = make_sac(seed=5), make_sac(seed=5), make_sac(seed=6)
    for agent in (a, b):
        agent.update(fake_batch())
    assert torch.equal(torch.random.get_rng_state(), state)
    assert same(params(a.policy), params(b.policy)) and same(params(a.critic), params(b.critic))
    assert not same(params(a.policy), params(c.policy))
    obs = random_obs(16)
    np.testing.assert_array_equal(a.act(obs, explore=True), b.act(obs, explore=True))


# ------------------------------------------------------------------------------------ checkpoint


def test_state_dict_round_trip_gives_identical_subsequent_updates() -> None:
    agent = make_sac(seed=0, policy_update_interval=2)
    for seed in range(3):
        agent.update(fake_batch(seed=seed))
    agent.update(fake_batch(seed=9))

    buffer = io.BytesIO()
    torch.save(agent.state_dict(), buffer)
    buffer.seek(0)
    restored = make_sac(seed=123, policy_update_interval=2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))

    assert restored.updates == 4
    assert restored.alpha == agent.alpha
    obs = random_obs(32)
    np.testing.assert_array_equal(restored.act(obs, explore=True), agent.act(obs, explore=True))
    for seed in (10, 11):
        mine, theirs = restored.update(fake_batch(seed=seed)), agent.update(fake_batch(seed=seed))
        assert mine.metrics == theirs.metrics
        np.testing.assert_array_equal(mine.td_errors, theirs.td_errors)
    for name in ("policy", "critic", "critic_target"):
        assert same(params(getattr(restored, name)), params(getattr(agent, name))), name


# ------------------------------------------------------------------------------------ make_learner


def test_make_agent_dispatches_on_kind_and_checks_the_action_space() -> None:
    box = SampleSpec(obs_shape=(3,), obs_dtype="float32", action_shape=(1,), action_dtype="float32")
    discrete = SampleSpec(
        obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2
    )
    sac = make_learner(
        SACConfig(hidden_sizes=[8], device="cpu"), replace(box, action_low=-2.0, action_high=2.0)
    )
    assert isinstance(sac, SACAgent)
    assert sac.act(np.zeros((1, 3), np.float32), explore=False).shape == (1, 1)
    np.testing.assert_array_equal(sac.action_high, [2.0])

    with pytest.raises(ValueError, match=r"agent.kind 'sac' needs a continuous.*Discrete\(2\)"):
        make_learner(SACConfig(device="cpu"), discrete)
    with pytest.raises(ValueError, match=r"agent.kind 'dqn' needs a Discrete.*Box of shape \(1,\)"):
        make_learner(DQNConfig(device="cpu"), box)
    matrix = SampleSpec(obs_shape=(3,), obs_dtype="float32", action_shape=(2, 2), action_dtype="float32")
    with pytest.raises(ValueError, match=r"1-D Box.*\(2, 2\)"):
        make_learner(SACConfig(device="cpu"), matrix)
    with pytest.raises(ValueError, match="not known"):
        make_learner(SACConfig(kind="ppo"), box)


# -------------------------------------------------------------------------------------- learning


def _greedy_return(agent: SACAgent, env: Any, episodes: int) -> float:
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs[None], explore=False)[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


@pytest.mark.slow
@pytest.mark.heavy  # ~30 s of training on a loaded 2-core machine: with the heavy runs
def test_sac_learns_pendulum_in_a_few_thousand_steps() -> None:
    """Synchronous SAC (no networking, plain replay) on Pendulum-v1: 5000 env steps, the first 500
    random, then one update of 128 per step; the greedy return must rise clearly from ~-1300.

    Measured over seeds 0-15: all ended between -561 and -140 (14 of 16 at about -142), ~8 s each;
    at 3000 steps only half the seeds had learned, so the budget is 5000."""
    gym = pytest.importorskip("gymnasium")
    total, warmup, batch_size = 5000, 500, 128
    env, eval_env = gym.make("Pendulum-v1"), gym.make("Pendulum-v1")
    config = SACConfig(
        hidden_sizes=[64, 64], batch_size=batch_size, actor_lr=1e-3, critic_lr=1e-3, device="cpu"
    )
    spec = SampleSpec((3,), "float32", (1,), "float32", action_low=-2.0, action_high=2.0)
    agent = SACAgent(config, spec, seed=0)
    explorer = EpsilonExplorer(agent, spec, seed=0, epsilon=1.0)  # the actors' random warm-up
    before = _greedy_return(agent, eval_env, episodes=5)

    columns: list[np.ndarray] = [np.zeros((total, 3), np.float32), np.zeros((total, 1), np.float32)]
    columns += [np.zeros(total, np.float32), np.zeros((total, 3), np.float32), np.zeros(total, np.float32)]
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    for step in range(total):
        explorer.epsilon = 1.0 if step < warmup else 0.0
        action = explorer.act(obs[None])[0]
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for column, value in zip(
            columns, (obs, action, reward, next_obs, 0.0 if terminated else config.gamma), strict=True
        ):
            column[step] = value
        obs = env.reset()[0] if terminated or truncated else next_obs
        if step >= warmup:
            rows = rng.integers(step + 1, size=batch_size)
            agent.update(TransitionBatch(*(column[rows] for column in columns)))
    after = _greedy_return(agent, eval_env, episodes=5)
    assert after > -700 and after > before + 500, (before, after)
