"""The agents on Dict observations (records): one encoder per key, concatenated, then the MLP.

A run whose env observes a Dict hands the agents records (``zmqrl.types``); towards torch they
cross as their bytes and the keyed torso reads each key back out (``zmqrl.agents.keyed_nets``),
while actors read ``obs[key]`` in numpy (``zmqrl.agents.keyed``). These tests hold the two sides
to one table: the same parameter names in the same order, the same numbers on the same weights,
learner updates (eager and captured) on record batches, and the refusals of what does not read
Dict observations yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.appo_policy import NumpyAPPOPolicy, appo_net
from zmqrl.agents.builtin import (
    check_appo,
    check_dqn,
    check_r2d2,
    check_sac,
    make_appo_policy,
    make_dqn_policy,
)
from zmqrl.agents.configs import APPOConfig, DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.keyed import obs_fields
from zmqrl.agents.keyed_nets import field_tensor
from zmqrl.agents.numpy_policies import NumpyDQNPolicy, NumpySACPolicy
from zmqrl.agents.r2d2 import R2D2Agent
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.agents.r2d2_policy import NumpyR2D2Policy
from zmqrl.agents.sac import SACAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import (
    SEQUENCE_BURN_IN,
    SEQUENCE_LEARNED,
    ObsEntry,
    RolloutBatch,
    SequenceBatch,
    TransitionBatch,
    as_bytes,
    to_records,
)

torch.set_num_threads(1)

ENTRIES = (
    ObsEntry("image", (2, 10, 10), "uint8", 0.0, 1.0),
    ObsEntry("state", (3,), "float32", -1.0, 1.0),
)
DISCRETE = SampleSpec(
    obs_shape=(),
    obs_dtype="record",
    obs_entries=ENTRIES,
    action_shape=(),
    action_dtype="int64",
    num_actions=4,
)
BOX = SampleSpec(
    obs_shape=(),
    obs_dtype="record",
    obs_entries=ENTRIES,
    action_shape=(2,),
    action_dtype="float32",
    action_low=(-1.0, -2.0),
    action_high=(1.0, 2.0),
)
TORSOS = ["mlp", "minatar_cnn"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
# Float rounding between numpy and torch (different summation orders).
RTOL, ATOL = 1e-5, 1e-5


def records(rng: np.random.Generator, *lead: int) -> np.ndarray:
    """Random Dict observations ``lead`` as records: 0/1 grids and states in [-1, 1]."""
    image = rng.integers(0, 2, (*lead, 2, 10, 10), dtype=np.uint8)
    state = rng.uniform(-1, 1, (*lead, 3)).astype(np.float32)
    return to_records({"image": image, "state": state}, DISCRETE.obs_np_dtype)


def transitions(rng: np.random.Generator, spec: SampleSpec, n: int = 16) -> TransitionBatch:
    if spec.num_actions is not None:
        actions: np.ndarray = rng.integers(0, spec.num_actions, n)
    else:
        actions = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
    discount = np.where(rng.random(n) < 0.1, 0.0, 0.97).astype(np.float32)
    reward = rng.normal(size=n).astype(np.float32)
    return TransitionBatch(records(rng, n), actions, reward, records(rng, n), discount)


def rollouts(rng: np.random.Generator, agent: APPOAgent, rows: int = 4, steps: int = 5) -> RolloutBatch:
    """Rollouts sampled by ``agent`` itself (its log-probabilities), with truncations."""
    obs = records(rng, rows, steps + 1)
    actions, logp = agent.sample(obs[:, :steps].reshape(-1))
    truncated = rng.random((rows, steps)) < 0.2
    return RolloutBatch(
        obs=obs,
        action=actions.reshape(rows, steps, *actions.shape[1:]),
        reward=rng.normal(size=(rows, steps)).astype(np.float32),
        terminated=(rng.random((rows, steps)) < 0.1) & ~truncated,
        truncated=truncated,
        logp=logp.reshape(rows, steps),
        final_obs=records(rng, int(truncated.sum())),
    )


def dqn(torso: str, **kw: Any) -> DQNConfig:
    return DQNConfig(hidden_sizes=[16, 8], torso=torso, device=kw.pop("device", "cpu"), **kw)


def appo(torso: str, **kw: Any) -> APPOConfig:
    return APPOConfig(hidden_sizes=[16], torso=torso, device=kw.pop("device", "cpu"), **kw)


def sac(**kw: Any) -> SACConfig:
    return SACConfig(hidden_sizes=[16, 16], device=kw.pop("device", "cpu"), **kw)


def torch_layout(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(t.shape)) for name, t in module.state_dict().items()]


def changed(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> bool:
    return any(not np.array_equal(before[name], after[name]) for name in before)


# ------------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("torso", TORSOS)
def test_every_state_dict_lists_the_tables_layout_name_for_name_in_order(torso: str) -> None:
    """Q-network, APPO policy and value network, SAC policy: the torch parameters are the keyed
    table's layout, the one the numpy policies load."""
    agent = DQNAgent(dqn(torso), DISCRETE, seed=0)
    assert torch_layout(agent.online) == list(agent._net.layout(()).items())
    learner = APPOAgent(appo(torso), DISCRETE, seed=0)
    assert torch_layout(learner.policy) == list(learner._net.layout(()).items())
    assert torch_layout(learner.value) == list(learner.value.net.layout(()).items())
    soft = SACAgent(sac(), BOX, seed=0)
    assert torch_layout(soft.policy) == list(soft._net.layout(()).items())


def test_image_keys_get_a_cnn_of_their_own_and_the_mlp_reads_every_key_concatenated() -> None:
    cnn = dict(dqn_layout("minatar_cnn"))
    assert cnn["torso.image.convs.0.weight"] == (16, 2, 3, 3)
    assert cnn["torso.image.fc.0.weight"] == (128, 16 * 8 * 8)
    assert cnn["torso.0.weight"] == (16, 128 + 3)  # the CNN's features, then the state
    assert cnn["torso.2.weight"] == (8, 16)
    mlp = dict(dqn_layout("mlp"))
    assert not any(name.startswith("torso.image") for name in mlp)
    assert mlp["torso.0.weight"] == (16, 2 * 10 * 10 + 3)  # every key flattened


def dqn_layout(torso: str) -> list[tuple[str, tuple[int, ...]]]:
    return list(NumpyDQNPolicy(dqn(torso), DISCRETE, seed=0).net.layout(()).items())


def test_the_torch_side_reads_each_key_out_of_the_records_bytes() -> None:
    """Fields of every dtype at their aligned offsets, from bytes of a strided slice too."""
    entries = (
        ObsEntry("flag", (2,), "bool"),
        ObsEntry("count", (), "int64"),
        ObsEntry("pos", (2, 2), "float64"),
        ObsEntry("grid", (1, 3, 3), "uint8"),
        ObsEntry("vel", (3,), "float32"),
    )
    spec = SampleSpec((), "record", (), "int64", num_actions=2, obs_entries=entries)
    rng = np.random.default_rng(0)
    values = {
        "flag": rng.random((4, 3, 2)) < 0.5,
        "count": rng.integers(-5, 5, (4, 3)),
        "pos": rng.normal(size=(4, 3, 2, 2)),
        "grid": rng.integers(0, 255, (4, 3, 1, 3, 3), dtype=np.uint8),
        "vel": rng.normal(size=(4, 3, 3)).astype(np.float32),
    }
    recs = to_records(values, spec.obs_np_dtype)
    raw = torch.from_numpy(as_bytes(recs))[:, :2].flatten(0, 1)  # a slice, as APPO takes obs[:, :T]
    for field in obs_fields(spec):
        np.testing.assert_array_equal(
            field_tensor(raw, field).numpy(), values[field.key][:, :2].reshape(8, *field.shape)
        )


# ------------------------------------------------------------------------------ acting parity


@pytest.mark.parametrize("torso", TORSOS)
def test_numpy_dqn_gives_the_torch_q_values_on_the_learners_weights(torso: str) -> None:
    agent = DQNAgent(dqn(torso, dueling=True), DISCRETE, seed=1)
    agent.update(transitions(np.random.default_rng(0), DISCRETE))
    policy = NumpyDQNPolicy(dqn(torso, dueling=True), DISCRETE, seed=2)
    policy.load_weights(agent.export_weights())
    obs = records(np.random.default_rng(1), 9)
    np.testing.assert_allclose(policy.q_values(obs), agent.q_values(obs), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(policy.act(obs, explore=False), agent.act(obs, explore=False))
    batch = transitions(np.random.default_rng(2), DISCRETE)
    fresh = DQNAgent(dqn(torso, dueling=True), DISCRETE, seed=3)
    fresh.load_weights(agent.export_weights())
    np.testing.assert_allclose(
        policy.initial_priorities(batch), fresh.initial_priorities(batch), rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("torso", TORSOS)
@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_numpy_appo_gives_the_torch_policy_outputs_on_the_learners_weights(
    torso: str, spec: SampleSpec
) -> None:
    agent = APPOAgent(appo(torso), spec, seed=1)
    agent.update(rollouts(np.random.default_rng(0), agent))
    policy = NumpyAPPOPolicy(appo(torso), spec, seed=2)
    policy.load_weights(agent.export_weights())
    obs = records(np.random.default_rng(1), 9)
    with torch.no_grad():
        out, log_std = agent.policy(torch.from_numpy(as_bytes(obs)))
    numpy_out, numpy_log_std = policy.policy_outputs(obs)
    np.testing.assert_allclose(numpy_out, out.numpy(), rtol=RTOL, atol=ATOL)
    if log_std is not None:
        np.testing.assert_allclose(numpy_log_std, log_std.numpy(), rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        values = agent.value(torch.from_numpy(as_bytes(obs)))
    assert values.shape == (9,) and torch.isfinite(values).all()


def test_numpy_sac_gives_the_torch_mean_on_the_learners_weights() -> None:
    agent = SACAgent(sac(), BOX, seed=1)
    agent.update(transitions(np.random.default_rng(0), BOX))
    policy = NumpySACPolicy(sac(), BOX, seed=2)
    policy.load_weights(agent.export_weights())
    obs = records(np.random.default_rng(1), 9)
    mean, log_std = agent.policy_outputs(obs)
    numpy_mean, numpy_log_std = policy.policy_outputs(obs)
    np.testing.assert_allclose(numpy_mean, mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(numpy_log_std, log_std, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        policy.act(obs, explore=False), agent.act(obs, explore=False), rtol=RTOL, atol=ATOL
    )


def test_actors_act_in_numpy_for_the_mlp_and_the_minatar_cnn() -> None:
    for torso in TORSOS:
        assert isinstance(make_dqn_policy(dqn(torso), DISCRETE, seed=0), NumpyDQNPolicy)
        assert isinstance(make_appo_policy(appo(torso), DISCRETE, seed=0), NumpyAPPOPolicy)
        assert appo_net(appo(torso), DISCRETE).numpy_acting


# ---------------------------------------------------------------------------------- learning


def weights_of(agent: Any) -> dict[str, np.ndarray]:
    modules = [agent.online] if isinstance(agent, (DQNAgent, R2D2Agent)) else [agent.policy]
    modules += [agent.critic] if isinstance(agent, SACAgent) else []
    modules += [agent.value] if isinstance(agent, APPOAgent) else []
    return {
        f"{i}.{n}": t.detach().cpu().numpy().copy()
        for i, m in enumerate(modules)
        for n, t in m.state_dict().items()
    }


def learner(kind: str, torso: str, capture: str, device: str = "cpu") -> Any:
    if kind == "dqn":
        return DQNAgent(dqn(torso, capture=capture, device=device), DISCRETE, seed=3)
    if kind == "appo":
        return APPOAgent(appo(torso, capture=capture, device=device, minibatches=2), DISCRETE, seed=3)
    return SACAgent(sac(capture=capture, device=device), BOX, seed=3)


def batch_for(agent: Any, i: int) -> Any:
    rng = np.random.default_rng(i)
    if isinstance(agent, APPOAgent):
        return rollouts(rng, agent)
    return transitions(rng, BOX if isinstance(agent, SACAgent) else DISCRETE)


LEARNERS = [("dqn", "mlp"), ("dqn", "minatar_cnn"), ("appo", "mlp"), ("appo", "minatar_cnn"), ("sac", "mlp")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "torso"), LEARNERS)
def test_an_update_on_records_gives_finite_metrics_and_moves_the_weights(
    kind: str, torso: str, device: str
) -> None:
    agent = learner(kind, torso, "never", device)
    before = weights_of(agent)
    result = agent.update(batch_for(agent, 0))
    assert not result.skipped
    assert all(np.isfinite(value) for value in dict(result).values())
    assert changed(before, weights_of(agent))


@pytest.mark.parametrize(("kind", "torso"), LEARNERS)
def test_the_captured_update_gives_the_eager_numbers_on_records(kind: str, torso: str) -> None:
    """On a CPU ``capture: always`` runs the captured code (static buffers of the records' bytes)
    without a graph: the same numbers as the eager update, update after update."""
    eager, captured = learner(kind, torso, "never"), learner(kind, torso, "always")
    assert eager._captured is None and captured._captured is not None
    for i in range(3):
        batch = batch_for(eager, i)
        a, b = eager.update(batch), captured.update(batch)
        assert not a.skipped and a.skipped == b.skipped
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(b.td_errors, a.td_errors, rtol=RTOL, atol=1e-6)
    for name, value in weights_of(eager).items():
        np.testing.assert_allclose(weights_of(captured)[name], value, rtol=RTOL, atol=1e-6, err_msg=name)


@CUDA
@pytest.mark.parametrize(("kind", "torso"), LEARNERS)
def test_a_cuda_graph_of_the_update_gives_the_eager_numbers_on_records(kind: str, torso: str) -> None:
    """On CUDA the captured update is a graph over the records' bytes buffer (warm-ups, capture,
    replays): the eager numbers all the same."""
    eager, captured = learner(kind, torso, "never", "cuda"), learner(kind, torso, "always", "cuda")
    for i in range(6):
        batch = batch_for(eager, i)
        a, b = eager.update(batch), captured.update(batch)
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_a_nan_in_a_float_key_skips_the_appo_update() -> None:
    """Records cross as bytes, but their float keys are still checked as a plain observation is."""
    agent = learner("appo", "mlp", "never")
    batch = rollouts(np.random.default_rng(0), agent)
    batch.obs["state"][0, 1, 2] = np.nan
    before = weights_of(agent)
    assert agent.update(batch).skipped
    assert not changed(before, weights_of(agent))


# ---------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("torso", TORSOS)
def test_recurrent_appo_acts_on_records_in_numpy_as_in_torch_step_after_step(torso: str) -> None:
    """The LSTM reads the keyed torso's features; its state advances alike on both sides."""
    config = appo(torso, core="lstm", core_size=16)
    assert check_appo(config, DISCRETE, None) is None
    agent = APPOAgent(config, DISCRETE, seed=1)
    policy = NumpyAPPOPolicy(config, DISCRETE, seed=2)
    policy.load_weights(agent.export_weights())
    rng = np.random.default_rng(0)
    for _ in range(4):
        obs = records(rng, 6)
        got, _ = policy.policy_outputs(obs)
        want, _ = agent.policy_outputs(obs)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(policy.core_state(), agent.core_state(), rtol=RTOL, atol=1e-6)


def test_r2d2_acts_on_records_in_numpy_as_in_torch_step_after_step() -> None:
    config = R2D2Config(device="cpu", hidden_sizes=[32], core_size=16)
    assert check_r2d2(config, DISCRETE, None) is None
    agent = R2D2Agent(config, DISCRETE, seed=3)
    policy = NumpyR2D2Policy(config, DISCRETE, seed=9)
    policy.load_weights(agent.export_weights())
    rng = np.random.default_rng(0)
    for _ in range(4):
        obs = records(rng, 6)
        np.testing.assert_allclose(policy.q_values(obs), agent.q_values(obs), rtol=RTOL, atol=1e-6)


def test_the_recurrent_learners_update_on_record_rows() -> None:
    rng = np.random.default_rng(0)
    config = appo("minatar_cnn", core="lstm", core_size=16)
    agent = APPOAgent(config, DISCRETE, seed=1)
    batch = rollouts(rng, agent)._replace(core_state=np.zeros((4, 2, 16), np.float32))
    before = weights_of(agent)
    result = agent.update(batch)
    assert not result.skipped and all(np.isfinite(v) for v in result.values())
    assert changed(before, weights_of(agent))
    r2d2 = R2D2Agent(R2D2Config(device="cpu", hidden_sizes=[32], core_size=16), DISCRETE, seed=3)
    rows, length = 3, r2d2.config.burn_in + r2d2.config.sequence_length
    mask = np.full((rows, length), SEQUENCE_LEARNED, np.uint8)
    mask[:, : r2d2.config.burn_in] = SEQUENCE_BURN_IN
    windows = SequenceBatch(
        records(rng, rows, length + 1),
        rng.integers(0, 4, (rows, length)),
        rng.normal(size=(rows, length)).astype(np.float32),
        np.zeros((rows, length), bool),
        mask,
        np.zeros((rows, 2, 16), np.float32),
    )
    before = weights_of(r2d2)
    result = r2d2.update(windows)
    assert not result.skipped and changed(before, weights_of(r2d2))


def test_the_feed_forward_agents_take_dict_observations() -> None:
    for torso in TORSOS:
        assert check_dqn(dqn(torso), DISCRETE, None) is None
        assert check_appo(appo(torso), DISCRETE, None) is None
    assert check_sac(sac(), BOX, None) is None


def test_a_cnn_torso_needs_an_image_key_big_enough_for_it() -> None:
    flat = SampleSpec((), "record", (), "int64", num_actions=2, obs_entries=(ObsEntry("a", (3,), "float32"),))
    problem = check_dqn(dqn("minatar_cnn"), flat, None)
    assert problem is not None and "no" in problem and "agent.torso 'mlp'" in problem
    small = (ObsEntry("tiny", (4, 20, 20), "uint8"), ObsEntry("a", (3,), "float32"))
    spec = SampleSpec((), "record", (), "int64", num_actions=2, obs_entries=small)
    problem = check_appo(appo("nature_cnn"), spec, None)
    assert problem is not None and "'tiny'" in problem and "larger frames" in problem


def test_action_masks_cannot_come_with_dict_observations() -> None:
    with pytest.raises(ValueError, match=r"SampleSpec\.action_mask"):
        SampleSpec((), "record", (), "int64", num_actions=4, obs_entries=ENTRIES, action_mask=True)


def test_the_nature_cnn_acts_on_records_through_torch() -> None:
    """Its convolutions stay with torch (not numpy-cheap): the actor's policy is the torch agent,
    which sends the records as their bytes."""
    entries = (ObsEntry("frames", (4, 36, 36), "uint8"), ObsEntry("state", (3,), "float32"))
    spec = SampleSpec((), "record", (), "int64", num_actions=3, obs_entries=entries)
    policy = make_dqn_policy(dqn("nature_cnn"), spec, seed=0)
    assert isinstance(policy, DQNAgent) and not policy._net.numpy_acting
    rng = np.random.default_rng(0)
    obs = to_records(
        {"frames": rng.integers(0, 255, (5, 4, 36, 36), dtype=np.uint8), "state": rng.normal(size=(5, 3))},
        spec.obs_np_dtype,
    )
    assert policy.act(obs, explore=False).shape == (5,)
    batch = TransitionBatch(obs, rng.integers(0, 3, 5), np.ones(5, np.float32), obs, np.ones(5, np.float32))
    assert np.isfinite(policy.initial_priorities(batch)).all()


def test_an_image_key_may_spell_a_module_attribute() -> None:
    """Encoders are children named by their key, whatever the key (``type`` is a method of every
    torch module): the state dict is still the layout, and numpy and torch agree."""
    entries = (ObsEntry("type", (2, 10, 10), "uint8"), ObsEntry("training", (3,), "float32"))
    spec = SampleSpec((), "record", (), "int64", num_actions=4, obs_entries=entries)
    agent = DQNAgent(dqn("minatar_cnn"), spec, seed=0)
    assert torch_layout(agent.online) == list(agent._net.layout(()).items())
    assert "torso.type.convs.0.weight" in agent._net.layout(())
    rng = np.random.default_rng(0)
    obs = to_records(
        {"type": rng.integers(0, 2, (6, 2, 10, 10), dtype=np.uint8), "training": rng.normal(size=(6, 3))},
        spec.obs_np_dtype,
    )
    numpy_q = NumpyDQNPolicy(dqn("minatar_cnn"), spec)
    numpy_q.load_weights(agent.export_weights())
    np.testing.assert_allclose(numpy_q.q_values(obs), agent.q_values(obs), rtol=RTOL, atol=ATOL)
