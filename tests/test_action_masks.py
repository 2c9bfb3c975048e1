"""Action masks (issue 40): a masked env's rows end with their legal actions, and every part of a
run obeys them: the env adapter and spec, exploration and greedy acting (numpy and torch, both
families), DQN's target, APPO's log-probabilities and entropy, the wire's refusals, replay and its
snapshot, serial runs, load_policy and the ONNX export."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_learner, make_policy
from zmqrl.agents.appo_nets import APPOPolicyNet, categorical_logp_entropy
from zmqrl.agents.appo_policy import APPOActions, appo_net
from zmqrl.agents.configs import APPOConfig, DQNConfig
from zmqrl.agents.losses import dqn_loss
from zmqrl.agents.masks import MASKED_VALUE, legal_actions, mask_torch
from zmqrl.checkpoints.snapshots import read_replay_snapshot, write_replay_snapshot
from zmqrl.config import EnvConfig
from zmqrl.envs.action_masks import as_masked_rows
from zmqrl.envs.factory import make_env, make_vector_env, sample_spec
from zmqrl.envs.pick_largest import PICK_LARGEST, PickLargest
from zmqrl.errors import EnvError
from zmqrl.replay import UniformReplay
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.types import RolloutBatch, TransitionBatch

A, D = 6, 6  # PickLargest's actions, and its values before the mask
SPEC = SampleSpec(
    obs_shape=(D + A,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=A,
    obs_low=0.0, obs_high=1.0, action_mask=True,
)  # fmt: skip
DQN = DQNConfig(hidden_sizes=(32, 32), device="cpu")
APPO = APPOConfig(hidden_sizes=(32, 32), device="cpu")


def masked_rows(rng: np.random.Generator, n: int, *, empty: int = 0) -> np.ndarray:
    """``n`` random rows: values, then a random mask with at least one legal action (the first
    ``empty`` rows: none)."""
    legal = rng.random((n, A)) < 0.3
    legal[np.arange(n), rng.integers(A, size=n)] = True
    legal[:empty] = False
    return np.concatenate([rng.random((n, D)), legal], axis=1).astype(np.float32)


def is_legal(obs: np.ndarray, actions: np.ndarray) -> bool:
    return bool(legal_actions(obs, A)[np.arange(len(obs)), actions].all())


# ------------------------------------------------------------------------------ the env and adapter


def test_pick_largest_scores_the_largest_free_slot_and_refuses_a_slot_taken_twice() -> None:
    env = PickLargest()
    obs, _ = env.reset(seed=3)
    assert obs["action_mask"].tolist() == [1] * A
    total, done = 0.0, False
    while not done:  # the oracle: the largest free value
        slot = int(np.argmax(np.where(obs["action_mask"] == 1, obs["observation"], -1.0)))
        obs, reward, done, _, _ = env.step(slot)
        total += reward
        assert obs["action_mask"][slot] == 0 and obs["observation"][slot] == 0.0
    assert total == A and obs["action_mask"].sum() == 0  # the terminal state has no legal move
    env.reset(seed=3)
    env.step(0)
    with pytest.raises(ValueError, match="illegal move"):
        env.step(0)
    assert env.illegal_moves == 1
    lenient = PickLargest(illegal="lose", mask_observation=False)
    values, _ = lenient.reset(seed=3)
    lenient.step(1)
    _, reward, terminated, _, info = lenient.step(1)
    assert (reward, terminated, info["illegal"], lenient.illegal_moves) == (0.0, True, True, 1)
    assert values.shape == (D,)


def test_make_env_turns_a_masked_dict_into_rows_ending_with_the_mask_and_the_spec_says_so() -> None:
    env = make_env(EnvConfig(id=PICK_LARGEST))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (D + A,) and obs.dtype == np.float32 and obs[D:].tolist() == [1.0] * A
    obs, *_ = env.step(2)
    assert obs[D + 2] == 0.0 and obs[2] == 0.0
    spec = sample_spec(env)
    assert spec.action_mask and spec.obs_shape == (D + A,) and spec.num_actions == A
    assert sample_spec(make_vector_env(EnvConfig(id=PICK_LARGEST), 2)).action_mask
    plain = sample_spec(make_env(EnvConfig(id=PICK_LARGEST, kwargs={"mask_observation": False})))
    assert not plain.action_mask and plain.obs_shape == (D,)
    # A raw Dict observation, one or a batch, becomes the same rows (what load_policy is given).
    raw = {"observation": np.full(D, 0.5, np.float32), "action_mask": np.eye(A, dtype=np.int8)[1]}
    assert as_masked_rows(raw, np.dtype(np.float32)).tolist() == [0.5] * D + np.eye(A)[1].tolist()
    batch = {key: np.stack([value, value]) for key, value in raw.items()}
    assert as_masked_rows(batch, np.dtype(np.float32)).shape == (2, D + A)


def test_a_masked_dict_whose_one_other_entry_is_not_a_box_is_refused_naming_it() -> None:
    # Several entries beside the mask travel as records: tests/test_masks_keyed.py.
    class NotABox(gym.Env[dict[str, np.ndarray], int]):
        observation_space = gym.spaces.Dict(
            {"a": gym.spaces.Discrete(3), "action_mask": gym.spaces.MultiBinary(3)}
        )
        action_space = gym.spaces.Discrete(3)

    from zmqrl.envs.factory import _supported_observations

    with pytest.raises(EnvError, match="exactly one Box entry"):
        _supported_observations(NotABox(), "not-a-box")


def test_a_masked_spec_needs_discrete_actions_and_rows_long_enough_for_the_mask() -> None:
    with pytest.raises(ValueError, match="action_mask"):
        dataclasses.replace(SPEC, obs_shape=(A - 1,), obs_low=None, obs_high=None)
    with pytest.raises(ValueError, match="action_mask"):
        SampleSpec((D + A,), "float32", (1,), "float32", action_mask=True)


# ------------------------------------------------------------------------------------- acting


def torch_acting(policy: object) -> object:
    """The agent acting through its torch modules instead of numpy views of them."""
    for name in ("_online_arrays", "_target_arrays", "_policy_arrays"):
        if hasattr(policy, name):
            setattr(policy, name, None)
    return policy


ACTING = {
    "dqn numpy": lambda: make_policy(DQN, SPEC, seed=1),
    "dqn agent numpy views": lambda: make_learner(DQN, SPEC, seed=1),
    "dqn agent torch": lambda: torch_acting(make_learner(DQN, SPEC, seed=1)),
    "appo numpy": lambda: make_policy(APPO, SPEC, seed=1),
    "appo agent numpy views": lambda: make_learner(APPO, SPEC, seed=1),
    "appo agent torch": lambda: torch_acting(make_learner(APPO, SPEC, seed=1)),
}


@pytest.mark.parametrize("case", list(ACTING))
@pytest.mark.parametrize("epsilon", [1.0, 0.5, 0.0])
def test_exploring_and_greedy_acting_never_pick_an_illegal_action(case: str, epsilon: float) -> None:
    rng = np.random.default_rng(7)
    policy = ACTING[case]()
    explorer = EpsilonExplorer(policy, SPEC, seed=3, epsilon=epsilon)  # type: ignore[arg-type]
    for _ in range(5):
        obs = masked_rows(rng, 2000)
        assert is_legal(obs, explorer.act(obs))
        assert is_legal(obs, policy.act(obs, explore=False))  # type: ignore[attr-defined]
        if hasattr(policy, "sample"):
            actions, logp = policy.sample(obs)
            assert is_legal(obs, actions) and np.isfinite(logp).all() and logp.max() <= 0.0


def test_epsilon_random_rows_spread_uniformly_over_the_legal_actions() -> None:
    explorer = EpsilonExplorer(make_policy(DQN, SPEC, seed=1), SPEC, seed=3, epsilon=1.0)
    obs = np.tile(np.array([[0.5] * D + [1, 0, 1, 0, 0, 1]], np.float32), (30000, 1))
    counts = np.bincount(explorer.act(obs), minlength=A) / len(obs)
    assert counts[[1, 3, 4]].sum() == 0 and np.allclose(counts[[0, 2, 5]], 1 / 3, atol=0.015)


def test_a_masked_rows_sample_never_falls_through_to_an_illegal_last_action() -> None:
    """Rounding may leave the cdf's end below a draw; the fallback is the last legal action."""

    class Highest:
        def random(self, shape: tuple[int, ...]) -> np.ndarray:
            return np.full(shape, 1.0)  # past any cdf's end

    logits = np.where(np.array([0, 1, 0, 0, 1, 0], bool), 0.3, MASKED_VALUE).astype(np.float32)
    actions, logp = APPOActions(SPEC).sample(Highest(), np.tile(logits, (8, 1)), None)  # type: ignore[arg-type]
    assert set(actions.tolist()) == {4} and np.allclose(logp, np.log(0.5))


# ------------------------------------------------------------------------------------- losses


def test_dqns_target_maximises_over_the_next_states_legal_actions_only() -> None:
    # Row 0: next state allows actions 1 and 2 only; the target net's best overall (action 0,
    # 9.0) is illegal, so the target is 0.5 + 0.9 * max(2.0, 4.0) = 4.1. Row 1 is terminal with no
    # legal action: discount 0, target = its reward, finite.
    next_obs = torch.tensor([[0.0] * D + [0, 1, 1, 0, 0, 0], [0.0] * (D + A)])
    raw_target = torch.tensor([[9.0, 2.0, 4.0, 8.0, 1.0, 7.0], [3.0] * A])
    raw_online = torch.tensor([[5.0, 3.0, 1.0, 6.0, 0.0, 0.0], [0.0] * A])  # double DQN picks action 1
    q = torch.tensor([[1.0] * A, [2.0] * A], requires_grad=True)
    args = (q, torch.tensor([1, 0]), torch.tensor([0.5, -1.0]), torch.tensor([0.9, 0.0]))
    plain = dqn_loss(*args, mask_torch(raw_target, next_obs))
    assert plain.target_max[0].item() == 4.0 and plain.td_target.tolist() == pytest.approx([4.1, -1.0])
    double = dqn_loss(*args, mask_torch(raw_target, next_obs), mask_torch(raw_online, next_obs))
    assert double.target_max[0].item() == 2.0 and double.td_target.tolist() == pytest.approx([2.3, -1.0])
    assert torch.isfinite(double.loss) and torch.isfinite(plain.td_error).all()


def test_the_masked_q_network_values_illegal_actions_at_masked_value_with_no_gradient() -> None:
    agent = make_learner(DQN, SPEC, seed=1)
    obs = torch.as_tensor(masked_rows(np.random.default_rng(0), 64))
    q = agent.online(obs)  # type: ignore[attr-defined]
    legal = obs[:, D:] > 0.5
    assert (q[~legal] == MASKED_VALUE).all() and (q[legal] > MASKED_VALUE / 2).all()
    q.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in agent.online.parameters())  # type: ignore[attr-defined]


def test_appos_masked_policy_gives_illegal_actions_zero_probability_and_finite_logp_and_entropy() -> None:
    net = APPOPolicyNet(
        appo_net(APPO, SPEC), SPEC.obs_shape, 0.0, torch.Generator().manual_seed(0), masked=True
    )
    rows = masked_rows(np.random.default_rng(1), 256)
    rows[0, D:] = [0, 0, 1, 0, 0, 0]  # one legal action: probability 1, entropy 0
    obs = torch.as_tensor(rows)
    logits, _ = net(obs)
    probs = torch.softmax(logits, dim=-1)
    legal = obs[:, D:] > 0.5
    assert (probs[~legal] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(256))
    actions = torch.as_tensor(np.argmax(rows[:, D:], axis=1))  # a legal action per row
    logp, entropy = net.log_prob_entropy(obs, actions)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    assert logp[0].item() == pytest.approx(0.0, abs=1e-6) and entropy[0].item() == pytest.approx(
        0.0, abs=1e-6
    )
    # The entropy is the legal actions' own distribution's.
    unmasked = net.outputs(net.features(obs))[0]
    own = unmasked[3][legal[3]]
    _, expected = categorical_logp_entropy(own[None], torch.tensor([0]))
    assert entropy[3].item() == pytest.approx(expected.item(), rel=1e-5)
    (logp.sum() + entropy.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------- the wire


def transitions(rng: np.random.Generator, n: int = 32) -> TransitionBatch:
    obs, next_obs = masked_rows(rng, n), masked_rows(rng, n)
    action = np.argmax(obs[:, D:], axis=1).astype(np.int64)
    reward = rng.random(n).astype(np.float32)
    return TransitionBatch(obs, action, reward, next_obs, np.full(n, 0.9, np.float32))


def roundtrip(batch: TransitionBatch | RolloutBatch, spec: SampleSpec = SPEC) -> wire.SamplesMsg:
    frames = wire.dump(wire.SamplesMsg(0, 0, 0, batch, []))
    return wire.load_samples([bytes(f) for f in frames], spec)


def test_masked_transitions_and_rollouts_cross_the_wire_with_their_masks() -> None:
    batch = transitions(np.random.default_rng(0))
    got = roundtrip(batch).batch
    assert all(np.array_equal(a, b) for a, b in zip(got, batch, strict=True))
    # A terminal next state may have no legal action: no target reads it (discount 0).
    terminal = batch._replace(next_obs=batch.next_obs.copy(), discount=batch.discount.copy())
    terminal.next_obs[0, D:] = 0.0
    terminal.discount[0] = 0.0
    roundtrip(terminal)
    rows = masked_rows(np.random.default_rng(1), 2 * 5).reshape(2, 5, D + A)
    rollout = RolloutBatch(
        rows, np.argmax(rows[:, :4, D:], axis=2).astype(np.int64), np.zeros((2, 4), np.float32),
        np.zeros((2, 4), bool), np.zeros((2, 4), bool), np.full((2, 4), -1.0, np.float32),
        np.zeros((0, D + A), np.float32),
    )  # fmt: skip
    spec = dataclasses.replace(SPEC, rollout_length=4)
    assert np.array_equal(roundtrip(rollout, spec).batch.obs, rows)
    illegal = rollout._replace(obs=rows.copy(), action=rollout.action.copy())
    illegal.obs[1, 2, D:] = [1, 0, 0, 0, 0, 0]
    illegal.action[1, 2] = 3
    with pytest.raises(wire.WireError, match="illegal under its own action mask"):
        roundtrip(illegal, spec)


def broken(field: str, row: int, value: object) -> TransitionBatch:
    batch = transitions(np.random.default_rng(0))
    columns = {name: np.array(column) for name, column in batch._asdict().items()}
    columns[field][row] = value
    return TransitionBatch(**columns)


REFUSED = {
    "no legal action in a state acted in": (broken("obs", 3, [0.5] * D + [0] * A), "no legal action"),
    "an action outside the action space": (broken("action", 0, -1), "outside"),
    "a bootstrapped next state without a legal action": (
        broken("next_obs", 5, [0.5] * D + [0] * A), "discount > 0",
    ),
    "a mask flag neither 0 nor 1": (broken("obs", 2, [0.5] * D + [0.5] * A), "neither 0 nor 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_masked_run_refuses_rows_its_masks_cannot_mean(case: str) -> None:
    batch, match = REFUSED[case]
    with pytest.raises(wire.WireError, match=match):
        roundtrip(batch)


def test_an_action_outside_its_own_mask_is_refused() -> None:
    batch = transitions(np.random.default_rng(0))
    action = batch.action.copy()
    action[4] = int(np.flatnonzero(batch.obs[4, D:] == 0)[0])
    with pytest.raises(wire.WireError, match="illegal under its own action mask"):
        roundtrip(batch._replace(action=action))


def test_masked_rows_on_an_unmasked_run_and_unmasked_rows_on_a_masked_one_are_refused() -> None:
    batch = transitions(np.random.default_rng(0))
    unmasked = dataclasses.replace(SPEC, obs_shape=(D,), action_mask=False)
    with pytest.raises(wire.WireError, match="obs is float32"):
        roundtrip(batch, unmasked)
    plain = batch._replace(
        obs=np.ascontiguousarray(batch.obs[:, :D]), next_obs=np.ascontiguousarray(batch.next_obs[:, :D])
    )
    with pytest.raises(wire.WireError, match="obs is float32"):
        roundtrip(plain)


# -------------------------------------------------------------------------------------- replay


def test_replay_and_its_snapshot_keep_every_rows_mask(tmp_path: Path) -> None:
    batch = transitions(np.random.default_rng(0))
    replay = UniformReplay(100, SPEC.obs_shape, SPEC.obs_dtype, (), "int64", seed=0)
    replay.add(batch)
    drawn = replay.sample(64)
    drawn_batch = drawn.batch if hasattr(drawn, "batch") else drawn
    assert is_legal(drawn_batch.obs, drawn_batch.action)
    snap = replay.snapshot()
    write_replay_snapshot(tmp_path / "replay.npz", snap, 7, replay.total_added)
    restored, total = read_replay_snapshot(tmp_path / "replay.npz", 7, SPEC)
    assert (
        total == 32
        and np.array_equal(restored.obs, batch.obs)
        and np.array_equal(restored.next_obs, batch.next_obs)
    )
    # A snapshot is as untrusted as a peer: an illegal action in it is refused on resume.
    action = snap.action.copy()
    action[0] = int(np.flatnonzero(snap.obs[0, D:] == 0)[0])
    write_replay_snapshot(tmp_path / "bad.npz", snap._replace(action=action), 7, 32)
    with pytest.raises(ValueError, match="illegal"):
        read_replay_snapshot(tmp_path / "bad.npz", 7, SPEC)


# ---------------------------------------------------------------------- runs, evaluation, deploy

SERIAL = {
    "dqn": ["learner.max_updates=600", "learner.min_replay_size=500", "learner.eval_interval=300"],
    "appo": ["learner.max_updates=12", "learner.eval_interval=6"],
}


@pytest.fixture(scope="module", params=list(SERIAL))
def masked_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A short serial run of each family on PickLargest, whose env raises at any illegal move (so a
    finished run took none, acting or evaluating)."""
    import zmqrl

    kind = request.param
    out = tmp_path_factory.mktemp(kind)
    overrides = [f"run.dir={out}", "learner.eval_episodes=5", *SERIAL[kind]]
    result = zmqrl.train(f"configs/pick_largest_{kind}.yaml", mode="serial", overrides=overrides)
    assert result.state == "finished" and result.learner["bad_messages"] == 0
    assert result.learner["evaluations"] >= 2 and result.learner["samples"] > 0
    return kind, result.run_dir


def test_a_serial_masked_run_of_each_family_learns_without_an_illegal_move(
    masked_run: tuple[str, Path],
) -> None:
    kind, run_dir = masked_run
    assert (run_dir / "checkpoints" / "latest").exists(), kind


def test_load_policy_honours_the_mask_of_raw_dict_observations_for_ten_thousand_steps(
    masked_run: tuple[str, Path],
) -> None:
    import zmqrl

    policy = zmqrl.load_policy(masked_run[1])
    env = PickLargest()  # raises at an illegal move
    obs, _ = env.reset(seed=0)
    for _ in range(10_000):
        obs, _, terminated, _, _ = env.step(policy.act(obs))
        if terminated:
            obs, _ = env.reset()
    assert env.illegal_moves == 0
    batch = {key: np.stack([value] * 3) for key, value in env.reset(seed=1)[0].items()}
    assert policy.act(batch).shape == (3,)


def test_the_onnx_export_of_a_masked_policy_takes_the_mask_in_its_input_rows(
    masked_run: tuple[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    from zmqrl.checkpoints.onnx_export import export_onnx
    from zmqrl.checkpoints.onnx_policy import OnnxPolicy

    export_onnx(masked_run[1], tmp_path / "p.onnx")
    obs = masked_rows(np.random.default_rng(2), 500)
    assert is_legal(obs, OnnxPolicy(tmp_path / "p.onnx").act(obs))
