"""Behaviour of the DQN agent: export and load of weights, the TD update, networks and checkpoints."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents.dqn import DQNAgent, DQNConfig
from zmqrl.agents.nets import QNetwork, mlp, polyak_update, resolve_device
from zmqrl.agents.numpy_policies import NumpyDQNPolicy
from zmqrl.core import LearningAgent, Policy, UpdateResult
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch

torch.set_num_threads(1)

OBS_SHAPE = (4,)
N_ACTIONS = 3
SPEC = SampleSpec(OBS_SHAPE, "float32", (), "int64", num_actions=N_ACTIONS)


def discrete(obs_shape: tuple[int, ...], n_actions: int, obs_dtype: str = "float32") -> SampleSpec:
    return SampleSpec(obs_shape, obs_dtype, (), "int64", num_actions=n_actions)


def make_agent(seed: int = 0, **overrides: object) -> DQNAgent:
    config = DQNConfig(hidden_sizes=[32, 32], device="cpu", **overrides)  # type: ignore[arg-type]
    return DQNAgent(config, SPEC, seed=seed)


def random_obs(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *OBS_SHAPE)).astype(np.float32)


def fake_batch(n: int = 16, seed: int = 2, discount: float = 0.97) -> TransitionBatch:
    rng = np.random.default_rng(seed)
    return TransitionBatch(
        obs=rng.standard_normal((n, *OBS_SHAPE)).astype(np.float32),
        action=rng.integers(N_ACTIONS, size=n).astype(np.int64),
        reward=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, *OBS_SHAPE)).astype(np.float32),
        discount=np.full(n, discount, dtype=np.float32),
    )


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------- contract


def test_agent_satisfies_the_core_protocol() -> None:
    assert isinstance(make_agent(), LearningAgent) and isinstance(make_agent(), Policy)


def test_export_load_round_trip_makes_actor_act_like_learner() -> None:
    learner, actor = make_agent(seed=0), make_agent(seed=1)
    learner.update(fake_batch())
    obs = random_obs(256)
    assert not np.array_equal(learner.q_values(obs), actor.q_values(obs))

    actor.load_weights(learner.export_weights())
    np.testing.assert_array_equal(actor.act(obs, explore=False), learner.act(obs, explore=False))
    np.testing.assert_array_equal(actor.q_values(obs), learner.q_values(obs))


def test_exported_arrays_are_float32_contiguous_copies_of_the_online_net() -> None:
    agent = make_agent()
    arrays = agent.export_weights()
    assert list(arrays) == list(agent.online.state_dict())
    for name, array in arrays.items():
        assert (array.shape, array.dtype) == (tuple(agent.online.state_dict()[name].shape), np.float32)
        assert array.flags.c_contiguous
    before = agent.q_values(random_obs(8))
    for array in arrays.values():
        array[...] = 0.0  # mutating the snapshot must not reach the agent
    np.testing.assert_array_equal(agent.q_values(random_obs(8)), before)


def test_exporting_changes_nothing_and_gives_the_same_arrays_until_an_update() -> None:
    """Versions are the publisher's (zmqrl.transport.weights_channel): exporting is a plain read."""
    agent = make_agent()
    first, second = agent.export_weights(), agent.export_weights()
    assert all(np.array_equal(first[k], second[k]) for k in first)
    agent.update(fake_batch())
    assert not all(np.array_equal(first[k], v) for k, v in agent.export_weights().items())


def test_load_accepts_read_only_arrays_as_from_the_wire() -> None:
    learner, actor = make_agent(seed=0), make_agent(seed=1)
    arrays = learner.export_weights()
    for array in arrays.values():
        array.flags.writeable = False
    actor.load_weights(arrays)
    obs = random_obs(4)
    obs.flags.writeable = False
    np.testing.assert_array_equal(actor.act(obs, explore=False), learner.act(obs, explore=False))


@pytest.mark.parametrize(
    ("corruption", "message"),
    [
        ("shape", "'head.bias' has shape"),
        ("missing", "missing parameter 'head.bias'"),
        ("extra", "unexpected"),
    ],
)
def test_mismatched_weights_raise_and_leave_weights_unchanged(corruption: str, message: str) -> None:
    learner, actor = make_agent(seed=0), make_agent(seed=1)
    arrays = learner.export_weights()
    last = list(arrays)[-1]
    if corruption == "shape":
        arrays[last] = np.zeros(arrays[last].shape[0] + 1, dtype=np.float32)
    elif corruption == "missing":
        del arrays[last]
    else:
        arrays["bogus.weight"] = np.zeros(3, dtype=np.float32)
    before = params(actor.online)
    with pytest.raises(ValueError, match=message):
        actor.load_weights(arrays)
    assert same(params(actor.online), before)


# ---------------------------------------------------------------------------------------- update


def test_one_update_returns_finite_metrics_and_moves_online_but_not_target() -> None:
    agent = make_agent(target_update_interval=5)
    online_before, target_before = params(agent.online), params(agent.target)
    metrics = agent.update(fake_batch())
    assert set(metrics) == {"loss", "q_mean", "td_abs_mean", "grad_norm", "target_q_mean"}
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert agent.updates == 1
    assert not same(params(agent.online), online_before)
    assert same(params(agent.target), target_before)


def test_hard_target_copy_happens_exactly_at_the_interval() -> None:
    agent = make_agent(target_update_interval=3, tau=1.0)
    target_before = params(agent.target)
    for _ in range(2):
        agent.update(fake_batch())
        assert same(params(agent.target), target_before)
    agent.update(fake_batch())
    assert same(params(agent.target), params(agent.online))
    agent.update(fake_batch())
    assert not same(params(agent.target), params(agent.online))


def test_polyak_with_half_tau_moves_target_halfway() -> None:
    target, online = mlp(3, [5], 2), mlp(3, [5], 2)
    t0, o0 = params(target), params(online)
    polyak_update(target, online, tau=0.5)
    for t, before, o in zip(params(target), t0, o0, strict=True):
        torch.testing.assert_close(t, (before + o) / 2)

    agent = make_agent(target_update_interval=1, tau=0.5)
    target_before = params(agent.target)
    agent.update(fake_batch())
    for t, before, o in zip(params(agent.target), target_before, params(agent.online), strict=True):
        torch.testing.assert_close(t, (before + o) / 2)


def _linear_agent(double: bool) -> DQNAgent:
    """2-d obs, 2 actions, no hidden layers: Q_online(x) = x, Q_target(x) = [10, 3] for every x."""
    config = DQNConfig(hidden_sizes=[], device="cpu", double=double, huber_delta=1.0)
    agent = DQNAgent(config, discrete((2,), 2), seed=0)
    with torch.no_grad():
        agent.online.head.weight.copy_(torch.eye(2))
        agent.online.head.bias.zero_()
        agent.target.head.weight.zero_()
        agent.target.head.bias.copy_(torch.tensor([10.0, 3.0]))
    return agent


def _one_transition(discount: float, next_obs: list[float]) -> TransitionBatch:
    return TransitionBatch(
        obs=np.zeros((1, 2), np.float32),  # Q_online(obs) = [0, 0]
        action=np.array([0]),
        reward=np.array([1.0], np.float32),
        next_obs=np.array([next_obs], np.float32),
        discount=np.array([discount], np.float32),
    )


@pytest.mark.parametrize(("double", "target_q"), [(True, 3.0), (False, 10.0)])
def test_double_dqn_evaluates_online_argmax_with_target_values(double: bool, target_q: float) -> None:
    # Online argmax on next_obs [0, 1] is action 1; the target values it at 3 but its own max is 10.
    metrics = _linear_agent(double).update(_one_transition(0.5, [0.0, 1.0]))
    td_target = 1.0 + 0.5 * target_q
    assert metrics["target_q_mean"] == pytest.approx(target_q)
    assert metrics["q_mean"] == pytest.approx(0.0)
    assert metrics["td_abs_mean"] == pytest.approx(td_target)
    assert metrics["loss"] == pytest.approx(td_target - 0.5)  # Huber, delta 1, |error| > 1


def test_terminal_transitions_ignore_next_obs() -> None:
    results = []
    for next_obs in ([0.0, 1.0], [1e4, -1e4]):
        agent = _linear_agent(double=True)
        metrics = agent.update(_one_transition(0.0, next_obs))
        results.append((metrics["loss"], metrics["td_abs_mean"], params(agent.online)))
    (loss_a, td_a, params_a), (loss_b, td_b, params_b) = results
    assert loss_a == loss_b == pytest.approx(0.5)  # td_target = reward = 1, Huber(1) = 0.5
    assert td_a == td_b == pytest.approx(1.0)
    assert same(params_a, params_b)


def test_gradient_clipping_scales_gradients_and_reports_the_unclipped_norm() -> None:
    clipped, unclipped = make_agent(max_grad_norm=1e-3), make_agent(max_grad_norm=0.0)
    batch = fake_batch()
    m_clipped, m_unclipped = clipped.update(batch), unclipped.update(batch)
    assert m_clipped["grad_norm"] == pytest.approx(m_unclipped["grad_norm"], rel=1e-5)
    assert m_clipped["grad_norm"] > 1e-3

    def applied_norm(agent: DQNAgent) -> float:
        grads = [p.grad.flatten() for p in agent.online.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.cat(grads)))

    assert applied_norm(clipped) == pytest.approx(1e-3, rel=1e-3)
    assert applied_norm(unclipped) == pytest.approx(m_unclipped["grad_norm"], rel=1e-5)


# ------------------------------------------------------------------------------------ acting


def test_act_is_greedy_whether_or_not_it_explores() -> None:
    """DQN's exploration is the actor's explorer's epsilon-random rows (tests/test_exploring.py)."""
    agent = make_agent()
    obs = random_obs(300)
    greedy = agent.act(obs, explore=True)
    assert greedy.dtype == np.int64 and greedy.shape == (300,)
    np.testing.assert_array_equal(greedy, agent.q_values(obs).argmax(axis=1))
    np.testing.assert_array_equal(agent.act(obs, explore=False), greedy)


def test_numpy_act_path_tracks_updates_and_imports() -> None:
    agent = make_agent(dueling=True)
    obs = random_obs(512)
    for _ in range(3):
        agent.update(fake_batch())
    assert agent._online_arrays is not None  # on the CPU, act() goes through numpy
    mirrored = agent._numpy_q_values(agent._online_arrays, obs)
    np.testing.assert_allclose(mirrored, agent.q_values(obs), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(agent.act(obs, explore=False), agent.q_values(obs).argmax(axis=1))
    agent.load_weights(make_agent(seed=7, dueling=True).export_weights())
    np.testing.assert_array_equal(agent.act(obs, explore=False), agent.q_values(obs).argmax(axis=1))


@pytest.mark.parametrize("dueling", [False, True])
def test_cpu_acting_is_the_numpy_policys_own_code_bit_for_bit(dueling: bool) -> None:
    """On the CPU the agent acts through NumpyDQNPolicy's forward code, on views of its own
    parameters: with the same weights and seed, Q-values, actions and an actor's initial
    priorities are the very same numbers."""
    learner = make_agent(seed=0, dueling=dueling)
    for seed in range(3):
        learner.update(fake_batch(seed=seed))
    actor = make_agent(seed=4, dueling=dueling)
    policy = NumpyDQNPolicy(actor.config, SPEC, seed=4)
    weights = learner.export_weights()
    actor.load_weights(weights)
    policy.load_weights(weights)
    obs = random_obs(64)
    assert actor._online_arrays is not None
    np.testing.assert_array_equal(actor._numpy_q_values(actor._online_arrays, obs), policy.q_values(obs))
    for epsilon in (0.0, 0.5, np.linspace(0.0, 1.0, 64)):
        mine = EpsilonExplorer(actor, SPEC, seed=9, epsilon=epsilon)
        theirs = EpsilonExplorer(policy, SPEC, seed=9, epsilon=epsilon)
        np.testing.assert_array_equal(mine.act(obs), theirs.act(obs))
    batch = fake_batch(n=64, seed=5)
    np.testing.assert_array_equal(actor.initial_priorities(batch), policy.initial_priorities(batch))


# ----------------------------------------------------------------------------------- networks


def test_dueling_output_shape_and_mean_advantage_identity() -> None:
    net = QNetwork((2, 3), [16], n_actions=5, dueling=True, generator=torch.Generator().manual_seed(0))
    x = torch.randn(7, 2, 3)
    q = net(x)
    assert q.shape == (7, 5)
    features = net.torso(x.reshape(7, -1))
    value, advantage = net.value(features), net.advantage(features)
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), value)
    torch.testing.assert_close(q - value, advantage - advantage.mean(dim=1, keepdim=True))


def test_uint8_observations_are_flattened_and_cast() -> None:
    net = QNetwork((2, 2), [8], n_actions=2)
    x = torch.randint(0, 255, (3, 2, 2), dtype=torch.uint8)
    torch.testing.assert_close(net(x), net(x.float()))


def test_same_seed_same_initial_weights_without_touching_global_rng() -> None:
    state = torch.random.get_rng_state()
    a, b, c = make_agent(seed=5), make_agent(seed=5), make_agent(seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert same(params(a.online), params(b.online))
    assert same(params(a.online), params(a.target))
    assert not same(params(a.online), params(c.online))
    obs = random_obs(50)
    np.testing.assert_array_equal(a.act(obs, explore=True), b.act(obs, explore=True))


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the no-GPU branches cannot be checked here")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="cuda"):
        resolve_device("cuda")


# ----------------------------------------------------------------------------- config, checkpoint


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gamma", 0.0),
        ("gamma", 1.5),
        ("n_step", 0),
        ("lr", 0.0),
        ("tau", 0.0),
        ("tau", 1.1),
        ("batch_size", 0),
        ("target_update_interval", 0),
        ("device", "gpu"),
        ("hidden_sizes", [64, 0]),
        ("kind", "ppo"),
    ],
)
def test_config_check_names_the_bad_field(field: str, value: object) -> None:
    DQNConfig().check()
    with pytest.raises(ValueError, match=f"^agent.{field}: "):
        DQNConfig(**{field: value}).check()  # type: ignore[arg-type]


def test_state_dict_round_trip_through_torch_save_restores_everything() -> None:
    agent = make_agent(seed=0)
    for seed in range(3):
        agent.update(fake_batch(seed=seed))
    agent.update(fake_batch(seed=9))

    buffer = io.BytesIO()
    torch.save(agent.state_dict(), buffer)
    buffer.seek(0)
    restored = make_agent(seed=123)
    restored.load_state_dict(torch.load(buffer, weights_only=True))

    obs = np.repeat(random_obs(1), 64, axis=0)
    np.testing.assert_array_equal(restored.q_values(obs), agent.q_values(obs))
    np.testing.assert_array_equal(restored.act(obs, explore=True), agent.act(obs, explore=True))
    assert restored.updates == 4
    step = restored.optimizer.state_dict()["state"][0]["step"]
    assert float(step) == 4
    restored.update(fake_batch(seed=10))
    agent.update(fake_batch(seed=10))
    assert same(params(restored.online), params(agent.online))  # Adam moments restored too
    assert same(params(restored.target), params(agent.target))


# ----------------------------------------------------------------------------------- learning


def test_q_values_converge_to_the_analytical_solution_on_a_two_state_problem() -> None:
    """s1: action 0 pays 2, action 1 pays 0, both terminal -> Q(s1) = [2, 0].
    s0: action 0 pays 1 and moves to s1; action 1 pays 0 and stays in s0 (discount 0.9 for both)
    -> Q(s0, 0) = 1 + 0.9 * 2 = 2.8, Q(s0, 1) = 0.9 * 2.8 = 2.52."""
    s0, s1 = [1.0, 0.0], [0.0, 1.0]
    transitions = [  # (obs, action, reward, next_obs, discount)
        (s0, 0, 1.0, s1, 0.9),
        (s0, 1, 0.0, s0, 0.9),
        (s1, 0, 2.0, s0, 0.0),
        (s1, 1, 0.0, s0, 0.0),
    ]
    obs, action, reward, next_obs, discount = (np.array(col) for col in zip(*transitions * 8, strict=True))
    batch = TransitionBatch(
        obs.astype(np.float32),
        action,
        reward.astype(np.float32),
        next_obs.astype(np.float32),
        discount.astype(np.float32),
    )
    config = DQNConfig(hidden_sizes=[32], lr=1e-2, target_update_interval=20, device="cpu")
    agent = DQNAgent(config, discrete((2,), 2), seed=0)
    for _ in range(400):
        agent.update(batch)
    q = agent.q_values(np.array([s0, s1], np.float32))
    np.testing.assert_allclose(q, [[2.8, 2.52], [2.0, 0.0]], atol=0.05)


def test_learning_rate_anneals_linearly_to_lr_final_then_holds() -> None:
    agent = make_agent(lr=1e-3, lr_final=1e-4, lr_decay_updates=4)
    seen = []
    for _ in range(6):
        agent.update(fake_batch())
        seen.append(agent.optimizer.param_groups[0]["lr"])
    # the lr used by update k (k = 0..5) is lr + min(k/4, 1) * (lr_final - lr)
    np.testing.assert_allclose(seen, [1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4], rtol=1e-6)
    assert agent.current_lr() == pytest.approx(1e-4)


def test_constant_learning_rate_without_lr_final() -> None:
    agent = make_agent(lr=3e-4)
    for _ in range(3):
        agent.update(fake_batch())
    assert agent.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)


def test_lr_final_needs_a_decay_length() -> None:
    with pytest.raises(ValueError, match="lr_decay_updates"):
        DQNConfig(lr_final=1e-4).check()


# ------------------------------------------------------------------- priorities (PER, Ape-X)


def _grads(agent: DQNAgent) -> list[torch.Tensor]:
    return [p.grad.clone() for p in agent.online.parameters() if p.grad is not None]


def _rows(batch: TransitionBatch, stop: int) -> TransitionBatch:
    return TransitionBatch(*(column[:stop] for column in batch))


def test_importance_weights_scale_each_rows_gradient() -> None:
    # max_grad_norm=0: clipping would rescale the gradients compared here.
    batch = fake_batch(n=8)
    plain, doubled, masked, shorter = (make_agent(max_grad_norm=0.0) for _ in range(4))
    m_plain = plain.update(batch)
    m_doubled = doubled.update(batch, np.full(8, 2.0, np.float32))
    assert m_doubled["loss"] == pytest.approx(2 * m_plain["loss"], rel=1e-6)
    for g_plain, g_doubled in zip(_grads(plain), _grads(doubled), strict=True):
        torch.testing.assert_close(g_doubled, 2 * g_plain)

    # A zero weight removes the row: the loss is then a mean over 8 rows of which 7 count.
    weights = np.ones(8, np.float32)
    weights[-1] = 0.0
    masked.update(batch, weights)
    shorter.update(_rows(batch, 7))
    for g_masked, g_shorter in zip(_grads(masked), _grads(shorter), strict=True):
        torch.testing.assert_close(g_masked * 8, g_shorter * 7)


def test_importance_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"importance must have shape \(16,\)"):
        make_agent().update(fake_batch(), np.ones((16, 1), np.float32))


def test_update_gives_the_rows_absolute_td_errors_before_the_step() -> None:
    agent = _linear_agent(double=True)
    batch = TransitionBatch(  # Q_online(obs) = obs; Q_target(next) = [10, 3]; online argmax on next
        obs=np.array([[0.0, 0.0], [2.0, -1.0], [0.5, 4.0]], np.float32),
        action=np.array([0, 0, 1]),
        reward=np.array([1.0, -1.0, 0.5], np.float32),
        next_obs=np.array([[0.0, 1.0], [1.0, 0.0], [5.0, 5.0]], np.float32),
        discount=np.array([0.5, 0.9, 0.0], np.float32),
    )
    # targets: 1 + 0.5 * 3 = 2.5; -1 + 0.9 * 10 = 8; 0.5 (terminal). Q taken: 0, 2, 4.
    result = agent.update(batch)
    assert isinstance(result, UpdateResult) and not result.skipped
    metrics, td = result.metrics, result.td_errors
    assert td.dtype == np.float32 and td.shape == (3,)
    np.testing.assert_allclose(td, [2.5, 6.0, 3.5], rtol=1e-6)
    assert metrics["td_abs_mean"] == pytest.approx(float(td.mean()))


@pytest.mark.parametrize("numpy_path", [True, False])
@pytest.mark.parametrize("double", [True, False])
def test_initial_priorities_match_the_td_errors_update_computes(numpy_path: bool, double: bool) -> None:
    agent = make_agent(double=double, target_update_interval=1000, dueling=True)
    for seed in range(3):  # online and target now differ
        agent.update(fake_batch(seed=seed))
    if not numpy_path:
        agent._online_arrays = agent._target_arrays = None  # the torch path, as on a GPU or with a CNN
    batch = fake_batch(n=64, seed=5)
    priorities = agent.initial_priorities(batch)
    td_errors = agent.update(batch).td_errors
    assert priorities.dtype == np.float32 and priorities.shape == (64,)
    np.testing.assert_allclose(priorities, td_errors, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("numpy_path", [True, False])
def test_actor_priorities_after_a_load_use_the_loaded_net_as_target(numpy_path: bool) -> None:
    learner, actor = make_agent(seed=0), make_agent(seed=1)
    for seed in range(3):
        learner.update(fake_batch(seed=seed))
    actor.load_weights(learner.export_weights())
    if not numpy_path:
        actor._online_arrays = actor._target_arrays = None
    batch = fake_batch(n=64, seed=5)
    q, next_q = actor.q_values(batch.obs), actor.q_values(batch.next_obs)
    expected = np.abs(batch.reward + batch.discount * next_q.max(axis=1) - q[np.arange(64), batch.action])
    np.testing.assert_allclose(actor.initial_priorities(batch), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- CNN torso

ATARI_SHAPE = (4, 84, 84)


def _frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *ATARI_SHAPE), dtype=np.uint8)


@pytest.mark.parametrize("dueling", [False, True])
def test_nature_cnn_torso_forward_shapes_and_dueling(dueling: bool) -> None:
    pytest.importorskip("zmqrl.agents.conv")
    net = QNetwork(
        ATARI_SHAPE, [], 6, dueling=dueling, torso="nature_cnn", generator=torch.Generator().manual_seed(0)
    )
    frames = torch.from_numpy(_frames(3))
    q = net(frames)
    assert q.shape == (3, 6) and q.dtype == torch.float32
    torch.testing.assert_close(q, net(frames.float()))  # uint8 is widened inside
    if dueling:
        features = net.torso(frames)
        assert features.shape == (3, 512)
        value, advantage = net.value(features), net.advantage(features)
        torch.testing.assert_close(q - value, advantage - advantage.mean(dim=1, keepdim=True))
    twin = QNetwork(
        ATARI_SHAPE, [], 6, dueling=dueling, torso="nature_cnn", generator=torch.Generator().manual_seed(0)
    )
    assert same(params(net), params(twin))  # the seed fixes the convolutions too


def test_dqn_agent_with_nature_cnn_acts_and_learns_on_uint8_frames() -> None:
    pytest.importorskip("zmqrl.agents.conv")
    config = DQNConfig(torso="nature_cnn", dueling=True, device="cpu", target_update_interval=1000)
    agent = DQNAgent(config, discrete(ATARI_SHAPE, 6, "uint8"), seed=0)
    assert agent._online_arrays is None  # the numpy path is MLP-only
    actions = agent.act(_frames(2), explore=False)
    assert actions.dtype == np.int64 and actions.shape == (2,)
    batch = TransitionBatch(
        obs=_frames(4, seed=1),
        action=np.array([0, 5, 2, 3]),
        reward=np.ones(4, np.float32),
        next_obs=_frames(4, seed=2),
        discount=np.full(4, 0.99, np.float32),
    )
    priorities = agent.initial_priorities(batch)
    result = agent.update(batch)
    assert np.isfinite(result.metrics["loss"])
    np.testing.assert_allclose(priorities, result.td_errors, rtol=1e-5, atol=1e-5)
