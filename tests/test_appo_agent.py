"""APPO: the numpy actor and the torch learner agree on weights, actions and log-probabilities;
the update's targets, ratios, non-finite guard and checkpoints do what the agreement says."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.appo_nets import clipped_gaussian_logp
from zmqrl.agents.appo_policy import NumpyAPPOPolicy, appo_net, log_ndtr
from zmqrl.agents.appo_policy import clipped_gaussian_logp as numpy_clipped_logp
from zmqrl.agents.builtin import check_appo, make_appo_policy
from zmqrl.agents.configs import APPOConfig
from zmqrl.core import SamplingPolicy
from zmqrl.spec import SampleSpec
from zmqrl.types import RolloutBatch, TransitionBatch

torch.set_num_threads(1)

DISCRETE = SampleSpec((4,), "float32", (), "int64", num_actions=3)
BOX = SampleSpec((3,), "float32", (2,), "float32", action_low=(-1.0, -0.5), action_high=(1.0, 2.0))
UNBOUNDED = SampleSpec((3,), "float32", (2,), "float32")  # no bounds: nothing is clipped
HALF_BOUNDED = SampleSpec((3,), "float32", (2,), "float32", action_low=(-math.inf, -1.0), action_high=1.0)
# uint8 frames for the CNN torsos: MinAtar's 0/1 grids, and the smallest frames the Nature CNN takes.
GRIDS = SampleSpec((4, 10, 10), "uint8", (), "int64", num_actions=3, obs_low=0, obs_high=1)
PIXELS = SampleSpec((4, 36, 36), "uint8", (), "int64", num_actions=6, obs_low=0, obs_high=255)
TORSOS = [
    pytest.param(GRIDS, "minatar_cnn", id="minatar_cnn"),
    pytest.param(PIXELS, "nature_cnn", id="nature_cnn"),
]

# (spec, log_std mode) of every kind of policy.
POLICIES = [
    pytest.param(DISCRETE, "param", id="discrete"),
    pytest.param(BOX, "param", id="box-param"),
    pytest.param(BOX, "state", id="box-state"),
    pytest.param(UNBOUNDED, "param", id="unbounded-param"),
    pytest.param(HALF_BOUNDED, "state", id="half-bounded-state"),
]


def config(log_std: str = "param", **overrides: object) -> APPOConfig:
    values: dict[str, object] = {"hidden_sizes": [16, 16], "device": "cpu", "log_std": log_std}
    values.update(overrides)
    return APPOConfig(**values)  # type: ignore[arg-type]


def observations(rng: np.random.Generator, spec: SampleSpec, *shape: int) -> np.ndarray:
    """Random observations ``(*shape, *obs_shape)``: normal float32, or uint8 frames up to the
    spec's ``obs_high``."""
    size = (*shape, *spec.obs_shape)
    if spec.obs_dtype == "uint8":
        return rng.integers(0, int(spec.obs_high) + 1, size=size, dtype=np.uint8)  # type: ignore[arg-type]
    return rng.normal(size=size).astype(np.float32)


def rollouts(
    agent: APPOAgent, spec: SampleSpec, rows: int = 4, steps: int = 6, seed: int = 0
) -> RolloutBatch:
    """Rollouts the agent itself sampled (fresh data: behaviour == current policy), with random
    terminations and truncations."""
    rng = np.random.default_rng(seed)
    obs = observations(rng, spec, rows, steps + 1)
    actions, logp = agent.sample(obs[:, :steps].reshape(rows * steps, *spec.obs_shape))
    truncated = rng.random((rows, steps)) < 0.15
    terminated = (rng.random((rows, steps)) < 0.15) & ~truncated
    final_obs = observations(rng, spec, int(truncated.sum()))
    return RolloutBatch(
        obs=obs,
        action=actions.reshape(rows, steps, *actions.shape[1:]),
        reward=rng.normal(size=(rows, steps)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        logp=logp.reshape(rows, steps),
        final_obs=final_obs,
    )


def trained(spec: SampleSpec, cfg: APPOConfig, seed: int = 0) -> APPOAgent:
    """An agent a few updates in (no parameter at its initial value)."""
    agent = APPOAgent(cfg, spec, seed=seed)
    for i in range(3):
        assert not agent.update(rollouts(agent, spec, seed=i)).skipped
    return agent


def copies(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# ------------------------------------------------------------------------ acting side parity


@pytest.mark.parametrize(("spec", "log_std"), POLICIES)
def test_exported_weights_make_the_numpy_policy_sample_exactly_as_the_agent(
    spec: SampleSpec, log_std: str
) -> None:
    cfg = config(log_std)
    weights = trained(spec, cfg).export_weights()
    assert list(weights) == list(appo_net(cfg, spec).layout(spec.obs_shape))
    assert all(w.dtype == np.float32 and w.flags.c_contiguous for w in weights.values())
    agent, policy = APPOAgent(cfg, spec, seed=7), NumpyAPPOPolicy(cfg, spec, seed=7)
    agent.load_weights(weights)
    policy.load_weights(weights)
    assert [(k, v.shape) for k, v in policy.arrays.items()] == [(k, v.shape) for k, v in weights.items()]

    obs = np.random.default_rng(1).normal(size=(300, *spec.obs_shape)).astype(np.float32)
    for _ in range(2):  # the generators stay in step
        actions, logp = agent.sample(obs)
        want_actions, want_logp = policy.sample(obs)
        np.testing.assert_array_equal(actions, want_actions)
        np.testing.assert_array_equal(logp, want_logp)
        assert logp.dtype == np.float32 and logp.shape == (300,)
    np.testing.assert_array_equal(agent.act(obs, explore=False), policy.act(obs, explore=False))
    np.testing.assert_array_equal(agent.act(obs, explore=True), policy.act(obs, explore=True))
    if spec.num_actions is None:
        assert actions.dtype == np.float32 and actions.shape == (300, 2)
        low, high = policy._actions.low, policy._actions.high
        assert ((actions >= low) & (actions <= high)).all()
    else:
        assert actions.dtype == np.int64 and set(np.unique(actions)) == {0, 1, 2}


@pytest.mark.parametrize(("spec", "log_std"), POLICIES)
def test_the_agents_torch_policy_matches_the_numpy_forward_pass(spec: SampleSpec, log_std: str) -> None:
    agent = trained(spec, config(log_std))
    policy = NumpyAPPOPolicy(config(log_std), spec)
    policy.load_weights(agent.export_weights())
    obs = np.random.default_rng(2).normal(size=(50, *spec.obs_shape)).astype(np.float32)
    out, log_std_t = agent.policy(torch.from_numpy(obs))
    want_out, want_log_std = policy.policy_outputs(obs)
    np.testing.assert_allclose(out.detach().numpy(), want_out, rtol=1e-5, atol=1e-6)
    assert (log_std_t is None) == (want_log_std is None)
    if log_std_t is not None:
        np.testing.assert_allclose(log_std_t.detach().numpy(), want_log_std, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("spec", "log_std"), POLICIES)
def test_sampled_logp_is_the_distributions_log_probability_at_the_sent_action(
    spec: SampleSpec, log_std: str
) -> None:
    """Checked against torch.distributions; continuous actions beyond a bound are sent clipped,
    with the probability of the clipped policy (the agreed semantics): the density inside the
    bounds, the Gaussian's mass beyond the bound at one."""
    cfg = config(log_std, log_std_init=1.0)  # wide: many samples land beyond the bounds
    agent = APPOAgent(cfg, spec, seed=3)
    obs = np.random.default_rng(3).normal(size=(400, *spec.obs_shape)).astype(np.float32)
    actions, logp = agent.sample(obs)
    out, spread = agent.policy(torch.from_numpy(obs))
    actions_t = torch.from_numpy(actions)
    if spread is None:
        want = torch.distributions.Categorical(logits=out).log_prob(actions_t)
    else:
        # In float64: the tails' masses are moderate here (|z| < 4), so log(cdf) is exact enough.
        normal = torch.distributions.Normal(out.double(), spread.double().exp())
        low, high = agent._actions.low, agent._actions.high
        at_low, at_high = actions == low, actions == high
        per_dim = torch.where(
            torch.from_numpy(at_low),
            normal.cdf(torch.from_numpy(low).double()).log(),
            torch.where(
                torch.from_numpy(at_high),
                (1.0 - normal.cdf(torch.from_numpy(high).double())).log(),
                normal.log_prob(actions_t.double()),
            ),
        )
        want = per_dim.sum(-1)
        if np.isfinite(low).any() or np.isfinite(high).any():
            assert (at_low | at_high).any(axis=1).mean() > 0.2
            assert (at_low.any() or not np.isfinite(low).any()) and (
                at_high.any() or not np.isfinite(high).any()
            )
        else:
            assert not (at_low | at_high).any()
    np.testing.assert_allclose(logp, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    learner_logp, _ = agent.policy.log_prob_entropy(torch.from_numpy(obs), actions_t)
    np.testing.assert_allclose(learner_logp.detach().numpy(), logp, rtol=1e-6, atol=1e-6)
    if spread is None:
        np.testing.assert_array_equal(agent.act(obs, explore=False), out.argmax(1).numpy())
    else:
        greedy = np.clip(out.detach().numpy(), agent._actions.low, agent._actions.high)
        np.testing.assert_allclose(agent.act(obs, explore=False), greedy, rtol=1e-6, atol=1e-6)


def test_numpy_log_ndtr_matches_torchs_far_into_the_lower_tail() -> None:
    z = np.concatenate([np.linspace(-40.0, 10.0, 20001), [-19.999999, -20.0, -20.000001, -1e3]])
    ours = log_ndtr(z)
    theirs = torch.special.log_ndtr(torch.from_numpy(z)).numpy()  # float64
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    as_float32 = torch.special.log_ndtr(torch.from_numpy(z.astype(np.float32))).double().numpy()
    assert (np.abs(log_ndtr(z.astype(np.float32)) - as_float32) / (1.0 + np.abs(ours))).max() < 1e-5
    # Exact values: log Phi(0) = log 1/2, log Phi(-inf) = -inf, log Phi(inf) = 0.
    np.testing.assert_array_equal(log_ndtr(np.array([0.0, -np.inf, np.inf])), [math.log(0.5), -np.inf, 0.0])


def far_outside(spec: SampleSpec, log_std: str, sigmas: float, std: float = 0.5) -> APPOAgent:
    """An agent whose means sit ``sigmas`` standard deviations below the first dimension's lower
    bound and above the second's upper one (weights zeroed: every observation alike)."""
    agent = APPOAgent(config(log_std, log_std_init=math.log(std)), spec, seed=0)
    low, high = agent._actions.low, agent._actions.high
    with torch.no_grad():
        agent.policy.mean.weight.zero_()
        agent.policy.mean.bias.copy_(torch.tensor([low[0] - sigmas * std, high[1] + sigmas * std]))
    return agent


@pytest.mark.parametrize("log_std", ["param", "state"])
def test_means_far_beyond_the_bounds_send_clipped_actions_almost_surely(log_std: str) -> None:
    """30 standard deviations out every action is clipped, and its log-probability is ~0, the
    tail's mass (the density at the bound, the old rule, was -0.5 * 30^2 per dimension). Fresh
    data still has every ratio 1, and the update stays finite."""
    agent = far_outside(BOX, log_std, sigmas=30.0)
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    actions, logp = agent.sample(obs)
    np.testing.assert_array_equal(actions, np.broadcast_to([BOX.action_low[0], BOX.action_high[1]], (64, 2)))
    assert ((logp <= 0.0) & (logp > -1e-6)).all()
    learner_logp, _ = agent.policy.log_prob_entropy(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_array_equal(learner_logp.detach().numpy(), logp)

    metrics = agent.update(rollouts(agent, BOX, rows=8, steps=8)).metrics
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert all(math.isfinite(v) for v in metrics.values())


def test_the_learners_tail_is_accurate_far_out_and_its_gradient_moves_the_mass() -> None:
    """Both bounds, in float32 and 30 standard deviations from the mean: log Phi(-30) per
    dimension (about -454), as the actor's rule computes it. One deviation beyond the bounds, the
    gradient moves the mean further out (more mass at the bound the action was clipped to), where
    the density at the bound would pull it back in."""
    low, high = torch.tensor([-1.0, -0.5]), torch.tensor([1.0, 2.0])
    log_std = torch.full((1, 2), math.log(0.5))
    actions = torch.tensor([[-1.0, 2.0]])
    mean = torch.tensor([[-1.0 + 15.0, 2.0 - 15.0]])  # 30 std of 0.5 inside, from the far side
    want = 2.0 * float(log_ndtr(np.array(-30.0)))
    assert -1e3 < want < -900.0
    np.testing.assert_allclose(
        clipped_gaussian_logp(mean, log_std, actions, low, high).numpy(), [want], rtol=1e-6
    )
    actor_logp = numpy_clipped_logp(mean.numpy(), log_std.numpy(), actions.numpy(), low.numpy(), high.numpy())
    np.testing.assert_allclose(actor_logp, [want], rtol=1e-6)

    beyond = torch.tensor([[-1.0 - 0.5, 2.0 + 0.5]], requires_grad=True)
    clipped_gaussian_logp(beyond, log_std, actions, low, high).sum().backward()
    assert beyond.grad is not None
    # d/dmean log Phi((low - mean) / std) = -phi(1) / Phi(1) / std at one std out; mirrored above.
    slope = math.exp(-0.5) / math.sqrt(2.0 * math.pi) / (0.5 * (1.0 + math.erf(math.sqrt(0.5)))) / 0.5
    np.testing.assert_allclose(beyond.grad.numpy(), [[-slope, slope]], rtol=1e-5)


def test_an_unbounded_side_takes_the_density_and_gradients_stay_finite() -> None:
    """An infinite bound is never reached: an action far beyond the mean on that side is scored
    by the density, and the discarded tail branch leaves no NaN in the gradient."""
    agent = APPOAgent(config("param"), HALF_BOUNDED, seed=0)
    mean = torch.tensor([[0.0, 0.0]], requires_grad=True)
    log_std = torch.zeros(1, 2, requires_grad=True)
    actions = torch.tensor([[-50.0, -1.0]])  # first dim: no lower bound; second: at its lower bound
    logp = clipped_gaussian_logp(mean, log_std, actions, agent.policy.action_low, agent.policy.action_high)
    want = -0.5 * 50.0**2 - 0.5 * math.log(2.0 * math.pi) + float(log_ndtr(np.array(-1.0)))
    np.testing.assert_allclose(logp.detach().numpy(), [want], rtol=1e-6)
    logp.sum().backward()
    assert mean.grad is not None and log_std.grad is not None
    assert torch.isfinite(mean.grad).all() and torch.isfinite(log_std.grad).all()
    zeros = np.zeros((1, 2), np.float32)  # the actor's rule on the same numbers
    actor_logp = numpy_clipped_logp(zeros, zeros, actions.numpy(), agent._actions.low, agent._actions.high)
    np.testing.assert_allclose(actor_logp, [want], rtol=1e-6)


def test_the_first_policy_is_near_uniform_with_the_configured_log_std() -> None:
    for seed, log_std in enumerate(("param", "state")):
        policy = NumpyAPPOPolicy(config(log_std, log_std_init=-0.5), BOX, seed=seed)
        mean, spread = policy.policy_outputs(np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32))
        assert np.abs(mean).max() < 0.05 and spread is not None
        np.testing.assert_allclose(spread, -0.5, atol=0.05)
    agent = APPOAgent(config(), DISCRETE, seed=0)
    logits, _ = agent.policy_outputs(np.ones((5, 4), np.float32))
    assert np.abs(logits).max() < 0.05


def test_load_weights_is_all_or_nothing() -> None:
    policy = NumpyAPPOPolicy(config(), BOX, seed=0)
    before = {k: v.copy() for k, v in policy.arrays.items()}
    weights = trained(BOX, config()).export_weights()
    for broken in (
        {k: v for k, v in weights.items() if k != "log_std"},
        {**weights, "log_std": np.zeros(3, np.float32)},
        {**weights, "extra": np.zeros(1, np.float32)},
        {**weights, "mean.bias": weights["mean.bias"].astype(np.float64)},
    ):
        with pytest.raises(ValueError):
            policy.load_weights(broken)
        for name, array in policy.arrays.items():
            np.testing.assert_array_equal(array, before[name])


def test_boxes_must_be_one_dimensional_and_the_mlp_flattens_any_observation() -> None:
    with pytest.raises(ValueError, match="1-D Box"):
        APPOAgent(config(), SampleSpec((3,), "float32", (2, 2), "float32"))
    grid = SampleSpec((2, 3), "float32", (), "int64", num_actions=2)  # as DQN's MLP: flattened
    assert check_appo(config(), grid, None) is None
    policy, agent = NumpyAPPOPolicy(config(), grid, seed=0), APPOAgent(config(), grid, seed=0)
    assert policy.arrays["torso.0.weight"].shape == (16, 6)
    policy.load_weights(agent.export_weights())
    obs = np.random.default_rng(0).normal(size=(5, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(policy.sample(obs)[1], agent.sample(obs)[1])


# -------------------------------------------------------------------------------- learning


@pytest.mark.parametrize(("spec", "log_std"), POLICIES)
def test_fresh_data_has_every_ratio_one_on_the_first_step(spec: SampleSpec, log_std: str) -> None:
    """approx_kl is the mean of (r - 1) - log r, which is >= 0 per step and 0 only at r == 1: with
    it ~0 every ratio of the (first and only) minibatch is 1, clipped continuous actions included."""
    agent = APPOAgent(config(log_std, log_std_init=1.0), spec, seed=4)
    batch = rollouts(agent, spec, rows=8, steps=8)
    if spec.num_actions is None and spec.action_low is not None:  # many actions sent clipped
        assert ((batch.action == agent._actions.low) | (batch.action == agent._actions.high)).mean() > 0.2
    metrics = agent.update(batch).metrics
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["rho_mean"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"epochs": 3, "minibatches": 2}, {"clip": None}, {"minibatches": 9}, {"max_grad_norm": 0.0}],
)
def test_updates_change_the_weights_and_report_finite_metrics(overrides: dict[str, object]) -> None:
    agent = APPOAgent(config(**overrides), DISCRETE, seed=5)
    before = copies(agent.policy)
    result = agent.update(rollouts(agent, DISCRETE))
    assert not result.skipped and agent.updates == 1
    assert set(result.metrics) >= {"policy_loss", "value_loss", "grad_norm", "lr", "skipped_minibatches"}
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["skipped_minibatches"] == 0.0
    np.testing.assert_array_equal(result.td_errors, np.zeros(4, np.float32))
    assert any(not torch.equal(before[k], v) for k, v in agent.policy.state_dict().items())


def constant_value(agent: APPOAgent, value: float) -> None:
    with torch.no_grad():
        agent.value.value.weight.zero_()
        agent.value.value.bias.fill_(value)


def uniform_policy(agent: APPOAgent) -> None:
    with torch.no_grad():
        agent.policy.logits.weight.zero_()
        agent.policy.logits.bias.zero_()


def test_truncated_steps_bootstrap_from_final_obs_and_terminated_ones_do_not() -> None:
    gamma, c = 0.9, 2.0
    agent = APPOAgent(config(gamma=gamma), DISCRETE, seed=0)
    constant_value(agent, c)
    uniform_policy(agent)  # every logp is -log 3: the behaviour's below, so every ratio is 1
    rewards = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    batch = RolloutBatch(
        obs=np.random.default_rng(0).normal(size=(1, 5, 4)).astype(np.float32),
        action=np.array([[0, 1, 2, 0]]),
        reward=rewards,
        terminated=np.array([[False, True, False, False]]),
        truncated=np.array([[False, False, True, False]]),
        logp=np.full((1, 4), -math.log(3.0), np.float32),
        final_obs=np.ones((1, 4), np.float32),
    )
    vs = agent.targets(batch).vs.numpy()[0]
    # t=3 bootstraps from obs[:, 4]; t=2 was cut: r + gamma V(final_obs); t=1 ended: r alone.
    want = [1.0 + gamma * 2.0, 2.0, 3.0 + gamma * c, 4.0 + gamma * c]
    np.testing.assert_allclose(vs, want, rtol=1e-6)

    # With a value net that tells observations apart, the cut step's bootstrap is V(final_obs),
    # not V of the next episode's first observation.
    agent = APPOAgent(config(gamma=gamma), DISCRETE, seed=1)
    uniform_policy(agent)
    with torch.no_grad():
        v = agent.value(torch.from_numpy(np.concatenate([batch.obs[0], batch.final_obs]))).numpy()
    vs = agent.targets(batch).vs.numpy()[0]
    np.testing.assert_allclose(vs[2], 3.0 + gamma * v[5], rtol=1e-5)
    assert abs(v[5] - v[3]) > 1e-3
    np.testing.assert_allclose(vs[1], 2.0, rtol=1e-6)
    np.testing.assert_allclose(vs[3], 4.0 + gamma * v[4], rtol=1e-5)


@pytest.mark.parametrize("where", ["reward-nan", "reward-inf", "logp-nan", "obs-inf"])
@pytest.mark.parametrize("overrides", [{}, {"epochs": 2, "minibatches": 2}])
def test_a_non_finite_batch_skips_the_update_and_changes_nothing(
    where: str, overrides: dict[str, object]
) -> None:
    agent = APPOAgent(config("param", **overrides), BOX, seed=6)
    agent.update(rollouts(agent, BOX, seed=1))  # optimizer state exists
    batch = rollouts(agent, BOX, seed=2)
    column, bad = where.split("-")
    array = getattr(batch, column).copy()
    array.reshape(-1)[5] = np.nan if bad == "nan" else np.inf
    batch = batch._replace(**{column: array})
    policy, value = copies(agent.policy), copies(agent.value)
    optimizer = {k: v.clone() for k, v in agent.optimizer.state_dict()["state"][0].items()}
    result = agent.update(batch)
    assert result.skipped
    assert result.metrics["skipped_minibatches"] == overrides.get("epochs", 1) * overrides.get(
        "minibatches", 1
    )
    assert agent.updates == 1
    assert_same(copies(agent.policy), policy)
    assert_same(copies(agent.value), value)
    assert_same({k: v.clone() for k, v in agent.optimizer.state_dict()["state"][0].items()}, optimizer)


def test_a_resumed_agent_continues_identically() -> None:
    cfg = config("state", epochs=2, minibatches=2, lr_final=0.0, lr_decay_updates=10)
    agent = trained(BOX, cfg, seed=8)
    buffer = io.BytesIO()
    torch.save(agent.state_dict(), buffer)
    buffer.seek(0)
    resumed = APPOAgent(cfg, BOX, seed=99)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for seed in (10, 11):  # sampling, shuffling and stepping, twice
        first, second = rollouts(agent, BOX, seed=seed), rollouts(resumed, BOX, seed=seed)
        for name in RolloutBatch._fields:
            np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
        assert agent.update(first).metrics == resumed.update(second).metrics
    assert_same(copies(agent.policy), copies(resumed.policy))
    assert_same(copies(agent.value), copies(resumed.value))
    assert agent.updates == resumed.updates == 5


def test_the_learning_rate_anneals_over_updates() -> None:
    agent = APPOAgent(config(lr=1e-3, lr_final=0.0, lr_decay_updates=2), DISCRETE, seed=0)
    rates = [agent.update(rollouts(agent, DISCRETE, seed=i)).metrics["lr"] for i in range(3)]
    assert rates == pytest.approx([1e-3, 5e-4, 0.0])


def test_update_refuses_what_it_cannot_train_on() -> None:
    agent = APPOAgent(config(), DISCRETE, seed=0)
    batch = rollouts(agent, DISCRETE)
    transitions = TransitionBatch(
        np.zeros((2, 4), np.float32), np.zeros(2, np.int64), np.zeros(2, np.float32),
        np.zeros((2, 4), np.float32), np.zeros(2, np.float32),
    )  # fmt: skip
    with pytest.raises(TypeError):
        agent.update(transitions)
    with pytest.raises(ValueError, match="importance"):
        agent.update(batch, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="final_obs"):
        agent.update(batch._replace(final_obs=np.zeros((len(batch.final_obs) + 1, 4), np.float32)))


# ------------------------------------------------------------------------------- CNN torsos


@pytest.mark.parametrize(("spec", "torso"), TORSOS)
def test_cnn_policies_sample_as_the_agent_acting_in_numpy_or_torch(spec: SampleSpec, torso: str) -> None:
    """The MinAtar CNN acts in numpy (on views of the agent's weights: the same numbers as the
    numpy policy), the Nature CNN through torch on the CPU (its actors' policy is the agent):
    the same draws give the same actions, log-probabilities equal up to float rounding."""
    cfg = config(torso=torso)
    weights = trained(spec, cfg).export_weights()
    assert list(weights) == list(appo_net(cfg, spec).layout(spec.obs_shape))
    assert "torso.convs.0.weight" in weights
    weights["logits.weight"] *= 100.0  # logits far from the first policy's near-uniform ones
    actor = make_appo_policy(cfg, spec, seed=7)
    assert isinstance(actor, SamplingPolicy)
    numpy_acting = torso == "minatar_cnn"
    if numpy_acting:
        assert isinstance(actor, NumpyAPPOPolicy)
    else:
        assert isinstance(actor, APPOAgent) and actor.device == "cpu" and actor._policy_arrays is None
    policy = NumpyAPPOPolicy(cfg, spec, seed=7)
    for receiver in (actor, policy):
        receiver.load_weights(weights)

    obs = observations(np.random.default_rng(1), spec, 200)
    for _ in range(2):  # the generators stay in step
        actions, logp = actor.sample(obs)
        want_actions, want_logp = policy.sample(obs)
        np.testing.assert_array_equal(actions, want_actions)
        if numpy_acting:
            np.testing.assert_array_equal(logp, want_logp)
        else:
            np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-6)
    assert len(np.unique(actions)) > 1 and np.ptp(logp) > 0.5  # neither one action nor uniform
    np.testing.assert_array_equal(actor.act(obs, explore=False), policy.act(obs, explore=False))
    # The torch forward (uint8 in, scaled inside) against numpy's, on the same weights.
    agent = APPOAgent(cfg, spec, seed=3)
    agent.load_weights(weights)
    logits, _ = agent.policy(torch.from_numpy(obs))
    np.testing.assert_allclose(logits.detach().numpy(), policy.policy_outputs(obs)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("spec", "torso"), TORSOS)
def test_an_update_on_uint8_frames_trains_both_cnns(spec: SampleSpec, torso: str) -> None:
    """Frames stay uint8 until the networks (which widen and scale them); the value network has
    the policy's torso shapes but its own parameters, and one update moves both, convolutions
    included. Seeded agents start equal."""
    cfg = config(torso=torso, epochs=2, minibatches=2)
    agent = APPOAgent(cfg, spec, seed=5)
    twin = APPOAgent(cfg, spec, seed=5)
    assert_same(copies(agent.policy), copies(twin.policy))
    assert_same(copies(agent.value), copies(twin.value))
    torso_shapes = {k: v.shape for k, v in agent.policy.state_dict().items() if k.startswith("torso.")}
    assert torso_shapes == {k: v.shape for k, v in agent.value.state_dict().items() if k.startswith("torso.")}
    policy_memory = {p.data_ptr() for p in agent.policy.parameters()}
    assert not policy_memory & {p.data_ptr() for p in agent.value.parameters()}

    batch = rollouts(agent, spec, rows=4, steps=4)
    assert batch.obs.dtype == np.uint8 and agent._tensors(batch).obs.dtype == torch.uint8
    policy, value = copies(agent.policy), copies(agent.value)
    result = agent.update(batch)
    assert not result.skipped and agent.updates == 1
    assert all(math.isfinite(v) for v in result.metrics.values())
    for before, after in ((policy, agent.policy.state_dict()), (value, agent.value.state_dict())):
        assert not torch.equal(before["torso.convs.0.weight"], after["torso.convs.0.weight"])


def test_check_appo_wants_frames_a_cnn_torso_can_take() -> None:
    flat = SampleSpec((4,), "float32", (), "int64", num_actions=2)
    for torso in ("minatar_cnn", "nature_cnn"):
        problem = check_appo(config(torso=torso), flat, None)
        assert problem is not None and f"agent.torso '{torso}' needs image observations (C, H, W)" in problem
        with pytest.raises(ValueError, match="needs image observations"):
            NumpyAPPOPolicy(config(torso=torso), flat)
    problem = check_appo(config(torso="nature_cnn"), GRIDS, None)
    assert problem is not None and "larger frames than 10x10: raise env.atari.screen_size" in problem
    with pytest.raises(ValueError, match="larger frames than 10x10"):
        APPOAgent(config(torso="nature_cnn"), GRIDS)
    assert check_appo(config(torso="minatar_cnn"), GRIDS, None) is None
    assert check_appo(config(torso="nature_cnn"), PIXELS, None) is None
    assert check_appo(config(), GRIDS, None) is None  # the MLP flattens the grids
