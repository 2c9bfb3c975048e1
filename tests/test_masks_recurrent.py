"""Action masks with a recurrent core (issue 40): recurrent APPO (``agent.core: lstm``) and R2D2
act, learn and are checked on the wire under each step's own legal actions. The heads read the
core's ``h``; the mask comes from the row each step acts on. The feed-forward agents' masks are
tests/test_action_masks.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import zmqrl
from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_learner, make_policy
from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.appo_batch import as_rollouts, rollout_arrays
from zmqrl.agents.appo_policy import NumpyAPPOPolicy
from zmqrl.agents.appo_rnn import recurrent_outputs
from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.losses import r2d2_loss
from zmqrl.agents.masks import MASKED_VALUE, legal_actions
from zmqrl.agents.r2d2 import R2D2Agent, unroll
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.agents.r2d2_policy import NumpyR2D2Policy
from zmqrl.config import load_config
from zmqrl.envs.pick_largest import PickLargest
from zmqrl.serial import run_serial
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.types import EpisodeStat, RolloutBatch, SequenceBatch

torch.set_num_threads(1)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
A, D, H = 6, 6, 8  # actions, values before the mask, core size
BURN_IN, LENGTH = 2, 4
L = BURN_IN + LENGTH
SPEC = SampleSpec(
    obs_shape=(D + A,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=A,
    obs_low=-5.0, obs_high=5.0, action_mask=True, sequence_length=L, burn_in=BURN_IN, core_size=H,
    max_abs_core_cell=50.0,
)  # fmt: skip
APPO = APPOConfig(hidden_sizes=[16], core="lstm", core_size=H, device="cpu")
R2D2 = R2D2Config(hidden_sizes=[16], core_size=H, sequence_length=LENGTH, burn_in=BURN_IN, device="cpu")


def masked_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random rows: values, then a random mask with at least one legal action (every fifth
    row exactly one)."""
    legal = rng.random((n, A)) < 0.3
    legal[::5] = False
    legal[np.arange(n), rng.integers(A, size=n)] = True
    return np.concatenate([rng.random((n, D)), legal], axis=1).astype(np.float32)


def is_legal(obs: np.ndarray, actions: np.ndarray) -> bool:
    return bool(legal_actions(obs, A)[np.arange(len(obs)), actions].all())


def torch_acting(agent: APPOAgent) -> APPOAgent:
    """The agent acting through its torch modules instead of numpy views of them."""
    agent._policy_arrays = None
    return agent


# ------------------------------------------------------------------------------------- acting

ACTING: dict[str, Callable[[], object]] = {
    "appo lstm numpy": lambda: make_policy(APPO, SPEC, seed=1),
    "appo lstm agent numpy views": lambda: make_learner(APPO, SPEC, seed=1),
    "appo lstm agent torch": lambda: torch_acting(APPOAgent(APPO, SPEC, seed=1)),
    "r2d2 numpy": lambda: make_policy(R2D2, SPEC, seed=1),
    "r2d2 agent torch": lambda: make_learner(R2D2, SPEC, seed=1),
}


@pytest.mark.parametrize("case", list(ACTING))
def test_recurrent_acting_never_picks_an_illegal_action_as_its_state_moves_on(case: str) -> None:
    rng = np.random.default_rng(7)
    policy = ACTING[case]()
    explorer = EpsilonExplorer(policy, SPEC, seed=3, epsilon=0.5)  # type: ignore[arg-type]
    for step in range(12):  # one state per row, carried from step to step, some rows reset
        obs = masked_rows(rng, 500)
        assert is_legal(obs, policy.act(obs, explore=False))  # type: ignore[attr-defined]
        assert is_legal(obs, policy.act(obs, explore=True))  # type: ignore[attr-defined]
        assert is_legal(obs, explorer.act(obs))
        if hasattr(policy, "sample"):
            actions, logp = policy.sample(obs)
            assert is_legal(obs, actions) and np.isfinite(logp).all() and logp.max() <= 0.0
            assert np.allclose(logp[::5], 0.0, atol=1e-5)  # a single legal action: probability 1
        policy.reset_core(np.arange(500) % 3 == step % 3)  # type: ignore[attr-defined]


def test_the_masked_recurrent_appo_policy_in_numpy_is_the_torch_one() -> None:
    agent = torch_acting(APPOAgent(APPO, SPEC, seed=0))
    policy = NumpyAPPOPolicy(APPO, SPEC, seed=1)
    policy.load_weights(agent.export_weights())
    rng = np.random.default_rng(0)
    for _ in range(6):
        obs = masked_rows(rng, 40)
        got, _ = policy.policy_outputs(obs)
        want, _ = agent.policy_outputs(obs)
        legal = legal_actions(obs, A)
        assert (got[~legal] == MASKED_VALUE).all() and (want[~legal] == MASKED_VALUE).all()
        np.testing.assert_allclose(got[legal], want[legal], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(policy.core_state(), agent.core_state(), rtol=1e-5, atol=1e-6)


def test_the_masked_r2d2_policy_in_numpy_is_the_torch_one() -> None:
    agent = R2D2Agent(R2D2, SPEC, seed=3)
    policy = NumpyR2D2Policy(R2D2, SPEC, seed=9)
    policy.load_weights(agent.export_weights())
    rng = np.random.default_rng(0)
    for _ in range(6):
        obs = masked_rows(rng, 40)
        got, want = policy.q_values(obs), agent.q_values(obs)
        legal = legal_actions(obs, A)
        assert (got[~legal] == MASKED_VALUE).all() and (want[~legal] == MASKED_VALUE).all()
        np.testing.assert_allclose(got[legal], want[legal], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(policy.act(obs, False), agent.act(obs, False))


# ------------------------------------------------------------------------------------- learning


def test_the_learners_unroll_recomputes_the_actors_masked_log_probabilities() -> None:
    """Rows acted by the numpy policy from a start state: the unroll masks each step's logits with
    its own row, so the V-trace ratios of fresh data are 1 and a single legal action has
    probability 1 and entropy 0."""
    agent = APPOAgent(APPO, SPEC, seed=0)
    actor = NumpyAPPOPolicy(APPO, SPEC, seed=1)
    actor.load_weights(agent.export_weights())
    rng = np.random.default_rng(4)
    rows, steps = 8, 5
    obs = masked_rows(rng, rows * (steps + 1)).reshape(rows, steps + 1, D + A)
    actor.policy_outputs(obs[:, 0])  # a state to start from that is not zero
    start = actor.core_state()
    actions, logps = [], []
    for t in range(steps):
        action, logp = actor.sample(obs[:, t])
        actions.append(action)
        logps.append(logp)
    flags = np.zeros((rows, steps), bool)
    batch = RolloutBatch(
        obs, np.stack(actions, 1), np.zeros((rows, steps), np.float32), flags, flags.copy(),
        np.stack(logps, 1), np.zeros((0, D + A), np.float32), start,
    )  # fmt: skip
    data = as_rollouts(agent._on_device(rollout_arrays(batch, H)))
    with torch.no_grad():
        out = recurrent_outputs(agent.policy, agent.value, data)  # type: ignore[arg-type]
    np.testing.assert_allclose(out.logp.numpy(), batch.logp.reshape(-1), rtol=1e-4, atol=1e-5)
    single = (obs[:, :steps, D:].sum(axis=2) == 1).reshape(-1)
    assert single.any() and np.allclose(out.entropy.numpy()[single], 0.0, atol=1e-5)
    assert torch.isfinite(out.entropy).all()


def test_r2d2s_target_maximises_over_the_bootstrap_rows_legal_actions_only() -> None:
    """One learned step per window, Q-values the head's bias alone: action 0 has the highest raw
    Q (10) but is illegal at window 0's bootstrap row, so its target is 0.5 + 0.9 * 2 (not
    0.5 + 0.9 * 10). Window 1 terminates at a row with no legal action: its target is its reward."""
    cfg = R2D2Config(
        hidden_sizes=[8], core_size=4, sequence_length=1, burn_in=0, n_step=1, gamma=0.9, device="cpu"
    )
    spec = dataclasses.replace(SPEC, sequence_length=1, burn_in=0, core_size=4)
    agent = R2D2Agent(cfg, spec, seed=0)
    weights = agent.export_weights()
    weights["head.weight"] = np.zeros_like(weights["head.weight"])
    weights["head.bias"] = np.array([10, 1, 2, 0, 0, 0], np.float32)
    agent.load_weights(weights)
    obs = np.zeros((2, 2, D + A), np.float32)
    obs[:, 0, D:] = [0, 1, 1, 0, 0, 0]  # action 1 taken, legal
    obs[0, 1, D:] = [0, 1, 1, 0, 0, 0]  # bootstrap row: actions 1 and 2
    batch = SequenceBatch(
        obs, np.ones((2, 1), np.int64), np.full((2, 1), 0.5, np.float32), np.array([[False], [True]]),
        np.full((2, 1), 2, np.uint8), np.zeros((2, 2, 4), np.float32),
    )  # fmt: skip
    for double in (True, False):
        agent.config = dataclasses.replace(cfg, double=double)
        agent.load_weights(weights)
        result = agent.update(batch)
        assert not result.skipped
        assert result.metrics["target_q_mean"] == pytest.approx((0.5 + 0.9 * 2.0 + 0.5) / 2)
        assert np.isfinite(result.td_errors).all()


# ---------------------------------------------------------------------------------- the wire


def windows(seed: int = 0) -> SequenceBatch:
    """Valid masked windows: row 0 an episode's first (front padding), row 1 a middle one, row 2
    ending the episode with a termination at a row with no legal action (then padding copies it)."""
    rng = np.random.default_rng(seed)
    obs = masked_rows(rng, 3 * (L + 1)).reshape(3, L + 1, D + A)
    mask = np.zeros((3, L), np.uint8)
    mask[:, :BURN_IN], mask[:, BURN_IN:] = 1, 2
    mask[0, :BURN_IN] = 0  # front padding copies the first real row, where action 0 is illegal
    obs[0, BURN_IN, D:] = [0, 1, 0, 0, 0, 0]
    obs[0, :BURN_IN] = obs[0, BURN_IN]
    terminated = np.zeros((3, L), bool)
    mask[2, BURN_IN + 2 :] = 0
    terminated[2, BURN_IN + 1] = True
    obs[2, BURN_IN + 2 :, D:] = 0.0  # the terminal state and its copies: no legal action
    action = np.argmax(obs[:, :L, D:], axis=2) * (mask > 0)
    reward = (mask > 0).astype(np.float32)
    state = rng.uniform(-0.5, 0.5, size=(3, 2, H)).astype(np.float32)
    return SequenceBatch(obs, action.astype(np.int64), reward, terminated, mask, state)


def roundtrip(batch: SequenceBatch) -> wire.SamplesMsg:
    frames = wire.dump(wire.SamplesMsg(3, 7, 1, batch, [EpisodeStat(6.0, 6)]))
    return wire.load_samples([bytes(f) for f in frames], SPEC)


def test_masked_windows_cross_the_wire_padding_and_terminal_rows_included() -> None:
    batch = windows()
    got = roundtrip(batch).batch
    assert all(np.array_equal(a, b) for a, b in zip(got, batch, strict=True))


def broken(
    row: int, position: int, *, action: int | None = None, flags: list[float] | None = None
) -> SequenceBatch:
    batch = windows()
    obs, actions = batch.obs.copy(), batch.action.copy()
    if flags is not None:
        obs[row, position, D:] = flags
    if action is not None:
        actions[row, position] = action
    return batch._replace(obs=obs, action=actions)


def illegal_taken() -> SequenceBatch:
    batch = windows()
    row = batch.obs[1, 3, D:]
    return broken(1, 3, action=int(np.flatnonzero(row == 0)[0]))


REFUSED = {
    "an illegal action taken at a real position": (illegal_taken, "illegal under its own action mask"),
    "a mask component of 2": (lambda: broken(1, 0, flags=[2, 1, 0, 0, 0, 0]), "neither 0 nor 1"),
    "a mask component of 0.5 on padding": (
        lambda: broken(2, L, flags=[0.5, 0, 0, 0, 0, 0]), "neither 0 nor 1",
    ),
    "no legal action in a burn-in position": (lambda: broken(1, 1, flags=[0] * A), "no legal action"),
    "no legal action in a learned position": (lambda: broken(0, L - 1, flags=[0] * A), "no legal action"),
    "no legal action at a running episode's bootstrap row": (
        lambda: broken(1, L, flags=[0] * A), "bootstrap observation",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_masked_run_refuses_windows_its_masks_cannot_mean(case: str) -> None:
    make, match = REFUSED[case]
    with pytest.raises(wire.WireError, match=match):
        roundtrip(make())


def test_padding_after_a_terminal_row_with_no_legal_action_trips_nothing_in_the_loss() -> None:
    """Row 2 of ``windows`` terminates at a state with no legal action, and its padding copies
    that state: its Q-values are all MASKED_VALUE there, yet no target reads them (a zero
    discount, then padding) and the loss, targets and priorities stay finite and small."""
    batch = windows()
    agent = R2D2Agent(R2D2, SPEC, seed=0)
    x = {name: torch.as_tensor(np.asarray(column)) for name, column in batch._asdict().items()}
    advance = x["mask"] != 0
    with torch.no_grad():
        q = unroll(agent.online, x["obs"], x["core_state"], advance, BURN_IN)
        assert (q[2, 2:] == MASKED_VALUE).all()  # the terminal row and the padding copying it
        out = r2d2_loss(
            q, q, q, x["action"][:, BURN_IN:], x["reward"][:, BURN_IN:], x["terminated"][:, BURN_IN:],
            advance[:, BURN_IN:], 0.9, 3, 0.9,
        )  # fmt: skip
    assert torch.isfinite(out.loss) and out.loss.item() < 100.0
    assert out.td_target.abs().max().item() < 100.0 and (out.td_target[2, 2:] == 0).all()
    assert torch.isfinite(out.priorities).all() and out.priorities.max().item() < 100.0


# -------------------------------------------------------------------------------- serial runs

RUNS = {
    "appo_lstm": (
        "pick_largest_appo.yaml",
        ["agent.core=lstm", "agent.core_size=32", "learner.max_updates=6", "learner.eval_interval=3"],
    ),
    "r2d2": (
        "cartpole_novel_r2d2.yaml",
        [
            "env.id=zmqrl/PickLargest-v0", "agent.hidden_sizes=[32]", "agent.core_size=32",
            "agent.sequence_length=4", "agent.burn_in=2", "agent.gamma=0.9", "learner.max_updates=30",
            "learner.min_replay_size=40", "learner.eval_interval=15",
            "actor.max_steps_per_s=3000",
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(RUNS))
def test_a_short_masked_serial_run_takes_no_illegal_move_and_load_policy_obeys_the_mask(
    kind: str, tmp_path: Path
) -> None:
    """PickLargest raises at an illegal move, so a finished run (acting, exploring, evaluating)
    took none; then the loaded recurrent policy plays raw Dict observations with its state."""
    name, extra = RUNS[kind]
    overrides = [f"run.dir={tmp_path}", "learner.eval_episodes=3", "learner.checkpoint_interval=1000", *extra]
    stats = run_serial(load_config(CONFIGS / name, overrides), run_dir=tmp_path / "run")
    learner = stats["learner"]
    assert learner["bad_messages"] == 0 and learner["updates"] >= 1 and learner["evaluations"] >= 1
    policy = zmqrl.load_policy(tmp_path / "run")
    assert policy.recurrent
    env = PickLargest()  # raises at an illegal move
    obs, _ = env.reset(seed=0)
    policy.reset()
    for _ in range(600):
        obs, _, terminated, _, _ = env.step(policy.act(obs))
        if terminated:
            obs, _ = env.reset()
            policy.reset()
    assert env.illegal_moves == 0
