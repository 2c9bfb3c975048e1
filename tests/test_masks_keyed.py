"""Action masks beside several keys: a masked Dict observation of two or more entries beside its
``action_mask`` travels as records whose field ``action_mask`` holds the legal actions, and every
part of a run reads them there: the env adapter and spec, the wire's refusals (transitions,
rollouts, windows), acting in numpy and torch (feed-forward, LSTM and R2D2, an image key through
the CNN), DQN's target, serial runs of DQN, APPO and APPO with an LSTM core, and load_policy on
the raw Dict. PickLargest (``extra_key``) raises at an illegal move, so a finished run took none."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import zmqrl
from zmqrl.actor.exploration import EpsilonExplorer
from zmqrl.agents import make_learner, make_policy
from zmqrl.agents.configs import APPOConfig, DQNConfig
from zmqrl.agents.keyed import mask_field, obs_fields
from zmqrl.agents.losses import dqn_loss
from zmqrl.agents.masks import MASKED_VALUE, legal_actions, mask_torch
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.config import EnvConfig
from zmqrl.envs.factory import _supported_observations, make_env, make_vector_env, sample_spec
from zmqrl.envs.pick_largest import PICK_LARGEST, PickLargest
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.types import (
    SEQUENCE_BURN_IN,
    SEQUENCE_LEARNED,
    RolloutBatch,
    SequenceBatch,
    TransitionBatch,
    as_bytes,
)

torch.set_num_threads(1)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
A = 6  # PickLargest's slots, and actions


def env_spec(extra_key: str, **changes: Any) -> SampleSpec:
    """The spec ``sample_spec`` makes of PickLargest with ``extra_key`` beside values and mask."""
    env = make_env(EnvConfig(id=PICK_LARGEST, kwargs={"extra_key": extra_key}))
    try:
        return dataclasses.replace(sample_spec(env), **changes)
    finally:
        env.close()


SPEC = env_spec("progress")  # action_mask, observation (6,), progress (1,)
BOARD = env_spec("board")  # action_mask, board (1, 9, 6) uint8, observation (6,)


def records(rng: np.random.Generator, n: int, spec: SampleSpec = SPEC) -> np.ndarray:
    """``n`` random records of ``spec``: each key within its bounds, a random mask with at least
    one legal action (every fifth record exactly one)."""
    out = np.zeros(n, spec.obs_np_dtype)
    for entry in spec.obs_entries:
        if entry.key == "action_mask":
            legal = rng.random((n, A)) < 0.3
            legal[::5] = False
            legal[np.arange(n), rng.integers(A, size=n)] = True
            out["action_mask"] = legal
        elif entry.dtype == "uint8":
            out[entry.key] = rng.integers(0, 2, (n, *entry.shape))
        else:
            out[entry.key] = rng.random((n, *entry.shape))
    return out


def is_legal(obs: np.ndarray, actions: np.ndarray) -> bool:
    return bool(legal_actions(obs, A)[np.arange(len(obs)), actions].all())


# ------------------------------------------------------------------------------ env and spec


def test_make_env_keeps_several_keys_beside_the_mask_as_records_with_the_mask_as_a_field() -> None:
    env = make_env(EnvConfig(id=PICK_LARGEST, kwargs={"extra_key": "board"}))
    obs, _ = env.reset(seed=0)
    assert obs.dtype.names == ("action_mask", "board", "observation")
    assert obs["action_mask"].dtype == np.uint8 and obs["action_mask"].tolist() == [1] * A
    assert obs["board"].sum() == A  # one cell per free slot
    obs, *_ = env.step(2)
    assert obs["action_mask"].tolist() == [1, 1, 0, 1, 1, 1] and obs["board"].sum() == A - 1
    env.close()
    mask = next(e for e in BOARD.obs_entries if e.key == "action_mask")
    assert BOARD.action_mask and BOARD.obs_shape == () and BOARD.num_actions == A
    assert (mask.shape, mask.dtype, mask.low, mask.high) == ((A,), "uint8", 0.0, 1.0)
    vector = make_vector_env(EnvConfig(id=PICK_LARGEST, kwargs={"extra_key": "progress"}), 3)
    batch, _ = vector.reset(seed=0)
    assert batch.shape == (3,) and legal_actions(batch, A).all() and sample_spec(vector) == SPEC
    vector.close()


def test_a_multibinary_or_float_mask_beside_two_boxes_becomes_uint8_flags() -> None:
    class TwoBoxes(gym.Env[dict[str, np.ndarray], int]):
        observation_space = gym.spaces.Dict(
            {
                "a": gym.spaces.Box(0, 1, (2,)),
                "b": gym.spaces.Box(0, 1, (3,)),
                "action_mask": gym.spaces.MultiBinary(4),
            }
        )
        action_space = gym.spaces.Discrete(4)

        def reset(
            self, *, seed: int | None = None, options: Any = None
        ) -> tuple[dict[str, np.ndarray], dict]:
            mask = np.array([0.0, 1.0, 0.0, 1.0])  # given as floats: still flags
            return {"a": np.zeros(2, np.float32), "b": np.ones(3, np.float32), "action_mask": mask}, {}

    env = _supported_observations(TwoBoxes(), "two-boxes")
    obs, _ = env.reset()
    assert obs["action_mask"].dtype == np.uint8 and obs["action_mask"].tolist() == [0, 1, 0, 1]
    assert sample_spec(env).action_mask


def test_a_masked_spec_of_records_needs_a_field_action_mask_of_num_actions_flags_in_0_1() -> None:
    entries = {e.key: e for e in SPEC.obs_entries}
    others = tuple(e for key, e in entries.items() if key != "action_mask")
    mask = entries["action_mask"]
    for bad in (
        others,  # no mask field
        (*others, dataclasses.replace(mask, shape=(A - 1,), low=0.0, high=1.0)),
        (*others, dataclasses.replace(mask, high=2.0)),
        (*others, dataclasses.replace(mask, low=None, high=None)),
    ):
        with pytest.raises(ValueError, match="action_mask"):
            dataclasses.replace(SPEC, obs_entries=bad)
    assert not dataclasses.replace(SPEC, action_mask=False).action_mask  # an unmasked run may have one


# ---------------------------------------------------------------------------------- the wire


def transitions(rng: np.random.Generator, n: int = 32) -> TransitionBatch:
    obs, next_obs = records(rng, n), records(rng, n)
    action = np.argmax(obs["action_mask"], axis=1).astype(np.int64)
    return TransitionBatch(
        obs, action, rng.random(n).astype(np.float32), next_obs, np.full(n, 0.9, np.float32)
    )


ROLLOUT_SPEC = dataclasses.replace(SPEC, rollout_length=4)


def rollouts(rng: np.random.Generator) -> RolloutBatch:
    obs = records(rng, 2 * 5).reshape(2, 5)
    return RolloutBatch(
        obs, np.argmax(obs["action_mask"][:, :4], axis=2).astype(np.int64), np.zeros((2, 4), np.float32),
        np.zeros((2, 4), bool), np.zeros((2, 4), bool), np.full((2, 4), -1.0, np.float32),
        np.zeros(0, SPEC.obs_np_dtype),
    )  # fmt: skip


def roundtrip(batch: Any, spec: SampleSpec = SPEC) -> Any:
    frames = wire.dump(wire.SamplesMsg(0, 0, 0, batch, []))
    return wire.load_samples([bytes(f) for f in frames], spec).batch


def test_masked_records_cross_the_wire_with_their_mask_field() -> None:
    batch = transitions(np.random.default_rng(0))
    got = roundtrip(batch)
    assert all(np.array_equal(a, b) for a, b in zip(got, batch, strict=True))
    terminal = batch._replace(next_obs=batch.next_obs.copy(), discount=batch.discount.copy())
    terminal.next_obs["action_mask"][0] = 0  # a terminal next state: no target reads it
    terminal.discount[0] = 0.0
    roundtrip(terminal)
    rollout = rollouts(np.random.default_rng(1))
    assert np.array_equal(roundtrip(rollout, ROLLOUT_SPEC).obs, rollout.obs)


def edited(batch: Any, column: str, index: tuple[int, ...], value: Any, key: str = "action_mask") -> Any:
    """``batch`` with ``column[index]`` (its field ``key`` for records) set to ``value``."""
    array = getattr(batch, column).copy()
    if array.dtype.names is not None:
        array[key][index] = value
    else:
        array[index] = value
    return batch._replace(**{column: array})


def illegal_transition() -> TransitionBatch:
    batch = transitions(np.random.default_rng(0))
    return edited(batch, "action", (4,), int(np.flatnonzero(batch.obs["action_mask"][4] == 0)[0]))


def illegal_rollout() -> RolloutBatch:
    batch = rollouts(np.random.default_rng(1))
    return edited(edited(batch, "obs", (1, 2), [1, 0, 0, 0, 0, 0]), "action", (1, 2), 3)


REFUSED: dict[str, tuple[Callable[[], Any], SampleSpec, str]] = {
    "transitions: a mask component of 2": (
        lambda: edited(transitions(np.random.default_rng(0)), "obs", (2, 1), 2), SPEC, "action_mask",
    ),
    "transitions: no legal action in a state acted in": (
        lambda: edited(transitions(np.random.default_rng(0)), "obs", (3,), 0), SPEC, "no legal action",
    ),
    "transitions: an illegal action taken": (illegal_transition, SPEC, "illegal under its own action mask"),
    "transitions: a bootstrapped next state without a legal action": (
        lambda: edited(transitions(np.random.default_rng(0)), "next_obs", (5,), 0), SPEC, "discount > 0",
    ),
    "rollouts: a mask component of 2": (
        lambda: edited(rollouts(np.random.default_rng(1)), "obs", (0, 1, 3), 2), ROLLOUT_SPEC, "action_mask",
    ),
    "rollouts: no legal action in a state acted in": (
        lambda: edited(rollouts(np.random.default_rng(1)), "obs", (1, 0), 0), ROLLOUT_SPEC, "no legal action",
    ),
    "rollouts: an illegal action taken": (illegal_rollout, ROLLOUT_SPEC, "illegal under its own action mask"),
    "rollouts: no legal action at the bootstrap observation": (
        lambda: edited(rollouts(np.random.default_rng(1)), "obs", (0, 4), 0), ROLLOUT_SPEC, "bootstrap",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_masked_run_of_records_refuses_what_its_masks_cannot_mean(case: str) -> None:
    make, spec, match = REFUSED[case]
    with pytest.raises(wire.WireError, match=match):
        roundtrip(make(), spec)


H, BURN_IN, LENGTH = 8, 2, 4
WINDOW_SPEC = dataclasses.replace(SPEC, sequence_length=BURN_IN + LENGTH, burn_in=BURN_IN, core_size=H)


def test_masked_windows_of_records_cross_the_wire_and_an_illegal_action_in_one_is_refused() -> None:
    rng = np.random.default_rng(2)
    length = BURN_IN + LENGTH
    obs = records(rng, 2 * (length + 1)).reshape(2, length + 1)
    mask = np.full((2, length), SEQUENCE_LEARNED, np.uint8)
    mask[:, :BURN_IN] = SEQUENCE_BURN_IN
    action = np.argmax(obs["action_mask"][:, :length], axis=2).astype(np.int64)
    state = rng.uniform(-0.5, 0.5, (2, 2, H)).astype(np.float32)
    batch = SequenceBatch(
        obs, action, np.ones((2, length), np.float32), np.zeros((2, length), bool), mask, state
    )
    assert np.array_equal(roundtrip(batch, WINDOW_SPEC).obs, obs)
    bad = edited(edited(batch, "obs", (1, 3), [0, 1, 0, 0, 0, 0]), "action", (1, 3), 0)
    with pytest.raises(wire.WireError, match="illegal under its own action mask"):
        roundtrip(bad, WINDOW_SPEC)


# ------------------------------------------------------------------------------------- acting

DQN = DQNConfig(hidden_sizes=[32], device="cpu")
APPO = APPOConfig(hidden_sizes=[32], device="cpu")
LSTM = APPOConfig(hidden_sizes=[16], core="lstm", core_size=H, device="cpu")
R2D2 = R2D2Config(hidden_sizes=[16], core_size=H, sequence_length=LENGTH, burn_in=BURN_IN, device="cpu")
CNN = {"torso": "minatar_cnn"}  # the board key through the CNN, the others flattened beside it


def torch_acting(agent: Any) -> Any:
    """The agent acting through its torch modules instead of numpy views of them."""
    for name in ("_online_arrays", "_policy_arrays"):
        if hasattr(agent, name):
            setattr(agent, name, None)
    return agent


ACTING: dict[str, tuple[Any, SampleSpec]] = {
    "dqn": (DQN, SPEC),
    "dqn cnn": (dataclasses.replace(DQN, **CNN), BOARD),
    "appo": (APPO, SPEC),
    "appo cnn": (dataclasses.replace(APPO, **CNN), BOARD),
    "appo lstm": (LSTM, SPEC),
    "appo lstm cnn": (dataclasses.replace(LSTM, **CNN), BOARD),
    "r2d2": (R2D2, WINDOW_SPEC),
}


@pytest.mark.parametrize("case", list(ACTING))
def test_numpy_and_torch_acting_never_pick_an_illegal_action_and_agree(case: str) -> None:
    config, spec = ACTING[case]
    agent = torch_acting(make_learner(config, spec, seed=1))
    policy = make_policy(config, spec, seed=2)
    weights = agent.export_weights()
    policy.load_weights(weights)
    if getattr(config, "torso", "mlp") != "mlp":  # the image key beside the mask goes through the CNN
        assert "torso.board.convs.0.weight" in weights and "torso.0.weight" in weights
    explorer = EpsilonExplorer(policy, spec, seed=3, epsilon=0.5)
    rng = np.random.default_rng(7)
    for _ in range(4):  # a recurrent policy's state moves on from step to step
        obs = records(rng, 300, spec)
        greedy = policy.act(obs, explore=False)
        assert is_legal(obs, greedy) and is_legal(obs, agent.act(obs, explore=False))
        assert is_legal(obs, explorer.act(obs))
        if hasattr(policy, "sample"):
            actions, logp = policy.sample(obs)
            assert is_legal(obs, actions) and np.isfinite(logp).all()
            assert np.allclose(logp[::5], 0.0, atol=1e-5)  # a single legal action: probability 1
    for acting in (policy, agent):
        if hasattr(acting, "reset_core"):  # both from a zero state, to compare their outputs
            acting.reset_core()
    obs = records(rng, 50, spec)
    outputs = "q_values" if hasattr(policy, "q_values") else "policy_outputs"
    got, want = getattr(policy, outputs)(obs), getattr(agent, outputs)(obs)
    got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
    legal = legal_actions(obs, A)
    assert (got[~legal] == MASKED_VALUE).all() and (want[~legal] == MASKED_VALUE).all()
    np.testing.assert_allclose(got[legal], want[legal], rtol=1e-4, atol=1e-5)


def test_dqns_target_maximises_over_the_next_records_legal_actions_only() -> None:
    # As tests/test_action_masks.py's flat rows: row 0's next state allows actions 1 and 2 only,
    # so the target is 0.5 + 0.9 * 4.0 = 4.1; row 1 is terminal with no legal action.
    next_obs = records(np.random.default_rng(0), 2)
    next_obs["action_mask"] = [[0, 1, 1, 0, 0, 0], [0] * A]
    raw = torch.from_numpy(as_bytes(next_obs).copy())
    field = mask_field(obs_fields(SPEC))
    raw_target = torch.tensor([[9.0, 2.0, 4.0, 8.0, 1.0, 7.0], [3.0] * A])
    q = torch.tensor([[1.0] * A, [2.0] * A], requires_grad=True)
    args = (q, torch.tensor([1, 0]), torch.tensor([0.5, -1.0]), torch.tensor([0.9, 0.0]))
    out = dqn_loss(*args, mask_torch(raw_target, raw, field))
    assert out.target_max[0].item() == 4.0 and out.td_target.tolist() == pytest.approx([4.1, -1.0])
    agent = make_learner(DQN, SPEC, seed=1)
    with torch.no_grad():
        target = agent.target(raw)
    assert (target[0, [0, 3, 4, 5]] == MASKED_VALUE).all() and (target[0, 1:3] > MASKED_VALUE).all()


# ---------------------------------------------------------------------- serial runs, load_policy

SHORT = ["learner.eval_episodes=3", "learner.checkpoint_interval=1000"]
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "dqn, the board through the CNN": (
        "pick_largest_dqn.yaml", "board",
        ["agent.torso=minatar_cnn", "agent.hidden_sizes=[32]", "learner.max_updates=60",
         "learner.min_replay_size=100", "learner.eval_interval=30"],
    ),
    "appo": ("pick_largest_appo.yaml", "progress", ["learner.max_updates=6", "learner.eval_interval=3"]),
    "appo lstm, the board through the CNN": (
        "pick_largest_appo.yaml", "board",
        ["agent.core=lstm", "agent.core_size=16", "agent.torso=minatar_cnn", "agent.hidden_sizes=[32]",
         "learner.max_updates=6", "learner.eval_interval=3"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(RUNS))
def test_a_short_serial_run_takes_no_illegal_move_and_load_policy_obeys_the_raw_dicts_mask(
    kind: str, tmp_path: Path
) -> None:
    config, extra_key, overrides = RUNS[kind]
    result = zmqrl.train(
        CONFIGS / config,
        mode="serial",
        overrides=[f"run.dir={tmp_path}", f"env.kwargs={{extra_key: {extra_key}}}", *SHORT, *overrides],
    )
    assert result.state == "finished" and result.learner["bad_messages"] == 0
    assert result.learner["samples"] > 0 and result.learner["evaluations"] >= 1
    policy = zmqrl.load_policy(result.run_dir)
    env = PickLargest(extra_key=extra_key)  # raises at an illegal move
    obs, _ = env.reset(seed=0)
    policy.reset()
    for _ in range(600):
        obs, _, terminated, _, _ = env.step(policy.act(obs))
        if terminated:
            obs, _ = env.reset()
            policy.reset()
    assert env.illegal_moves == 0
    policy.reset()
    batch = {key: np.stack([value] * 3) for key, value in env.reset(seed=1)[0].items()}
    batch["action_mask"] = batch["action_mask"].astype(bool)  # any 0/1 array, as an env gives it
    batch["action_mask"][:, :5] = False  # only the last slot is legal
    assert policy.act(batch).tolist() == [5, 5, 5]


class BoardOnly(gym.ObservationWrapper[Any, Any, Any]):
    """PickLargest seen through its board image and its mask alone: one image beside the mask."""

    def __init__(self) -> None:
        super().__init__(PickLargest(extra_key="board"))
        spaces = self.env.observation_space.spaces  # type: ignore[attr-defined]
        self.observation_space = gym.spaces.Dict({k: spaces[k] for k in ("action_mask", "board")})

    def observation(self, observation: Any) -> Any:
        return {k: observation[k] for k in ("action_mask", "board")}


def test_one_image_beside_the_mask_travels_as_records_so_a_cnn_sees_it_whole() -> None:
    env = _supported_observations(BoardOnly(), "board-only")
    spec = sample_spec(env)
    assert spec.action_mask and [e.key for e in spec.obs_entries] == ["action_mask", "board"]
    config = DQNConfig(torso="minatar_cnn", hidden_sizes=[32], device="cpu")
    policy = make_policy(config, spec, seed=0)
    obs, _ = env.reset(seed=0)
    for _ in range(30):  # PickLargest raises at an illegal move
        obs, _, terminated, _, _ = env.step(int(policy.act(obs[None], explore=False)[0]))
        if terminated:
            obs, _ = env.reset()
    env.close()
