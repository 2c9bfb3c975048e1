"""The run fingerprint: which settings must agree between learner and actors, and how a mismatch reads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zmqrl.config import Config, load_config
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.spec import SampleSpec
from zmqrl.transport.fingerprint import FingerprintMismatch, check_fingerprint, fingerprint_mismatch
from zmqrl.transport.wire import WeightsMsg, dump, load_weights
from zmqrl.types import Weights

CARTPOLE = SampleSpec(
    obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2
)
PENDULUM = SampleSpec(
    obs_shape=(3,),
    obs_dtype="float32",
    action_shape=(1,),
    action_dtype="float32",
    action_low=-2.0,
    action_high=2.0,
)


def cfg(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def test_dqn_fingerprint_holds_env_spaces_network_and_n_step_settings() -> None:
    fp = run_fingerprint(cfg(), CARTPOLE)
    assert fp == {
        "env.id": "CartPole-v1",
        "env.kwargs": "{}",
        "env.preprocess": "none",
        "obs.shape": [4],
        "obs.dtype": "float32",
        "action.shape": [],
        "action.dtype": "int64",
        "action.n": 2,
        "agent.kind": "dqn",
        "agent.hidden_sizes": [256, 256],
        "agent.dueling": False,
        "agent.torso": "mlp",
        "agent.n_step": 3,
        "agent.gamma": 0.99,
    }


def test_sac_fingerprint_carries_the_action_bounds_and_no_dqn_fields() -> None:
    fp = run_fingerprint(cfg("agent.kind=sac", "env.id=Pendulum-v1"), PENDULUM)
    assert fp["action.low"] == [-2.0] and fp["action.high"] == [2.0]
    assert "action.n" not in fp and "agent.dueling" not in fp
    assert fp["agent.kind"] == "sac" and fp["agent.n_step"] == 1


def test_infinite_bounds_travel_as_strings_because_the_wire_carries_finite_floats_only() -> None:
    half = SampleSpec(
        obs_shape=(3,), obs_dtype="float32", action_shape=(2,), action_dtype="float32",
        action_low=(-math.inf, 0.0), action_high=(1.0, math.inf),
    )  # fmt: skip
    fp = run_fingerprint(cfg("agent.kind=sac"), half)
    assert fp["action.low"] == ["-inf", 0.0] and fp["action.high"] == [1.0, "inf"]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("agent.n_step=5", "agent.n_step"),
        ("agent.gamma=0.9", "agent.gamma"),
        ("agent.hidden_sizes=[64]", "agent.hidden_sizes"),
        ("agent.dueling=true", "agent.dueling"),
        ("env.id=Acrobot-v1", "env.id"),
        ("env.kwargs={sutton_barto_reward: true}", "env.kwargs"),
    ],
)
def test_settings_that_change_targets_or_the_network_differ(override: str, key: str) -> None:
    learner = run_fingerprint(cfg(), CARTPOLE)
    actor = run_fingerprint(cfg(override), CARTPOLE)
    assert fingerprint_mismatch(actor, learner) == [key]
    assert fingerprint_mismatch(learner, actor) == [key], "the check is symmetric"


@pytest.mark.parametrize(
    "override",
    [
        "agent.lr=0.1",
        "agent.batch_size=7",
        "agent.double=false",
        "agent.target_update_interval=3",
        "actor.epsilon=0.9",
        "actor.send_batch=3",
        "replay.capacity=5000",
        "learner.max_updates=10",
        "env.max_episode_steps=100",
        "agent.device=cpu",
    ],
)
def test_learner_only_and_actor_only_settings_may_differ(override: str) -> None:
    assert (
        fingerprint_mismatch(run_fingerprint(cfg(override), CARTPOLE), run_fingerprint(cfg(), CARTPOLE)) == []
    )


def test_atari_preprocessing_that_changes_transitions_is_in_but_noop_max_is_not() -> None:
    pixels = SampleSpec(
        obs_shape=(4, 84, 84), obs_dtype="uint8", action_shape=(), action_dtype="int64", num_actions=6
    )
    base = cfg("env.preprocess=atari", "agent.torso=nature_cnn")
    fp = run_fingerprint(base, pixels)
    assert fp["env.atari.clip_rewards"] is True and fp["env.atari.frame_skip"] == 4
    assert "env.atari.noop_max" not in fp
    other = run_fingerprint(
        cfg("env.preprocess=atari", "agent.torso=nature_cnn", "env.atari.clip_rewards=false"), pixels
    )
    assert fingerprint_mismatch(fp, other) == ["env.atari.clip_rewards"]


def test_long_env_kwargs_are_sent_as_a_digest_that_still_tells_them_apart() -> None:
    long_a = run_fingerprint(cfg("env.kwargs={a: '" + "x" * 300 + "'}"), CARTPOLE)
    long_b = run_fingerprint(cfg("env.kwargs={a: '" + "y" * 300 + "'}"), CARTPOLE)
    assert str(long_a["env.kwargs"]).startswith("sha256:") and len(str(long_a["env.kwargs"])) < 80
    assert fingerprint_mismatch(long_a, long_b) == ["env.kwargs"]


def test_the_fingerprint_survives_the_wire_unchanged() -> None:
    for fp in (run_fingerprint(cfg(), CARTPOLE), run_fingerprint(cfg("agent.kind=sac"), PENDULUM)):
        frames = [bytes(f) for f in dump(WeightsMsg(Weights(1, {"w": np.zeros(1, np.float32)}), "dqn", fp))]
        got = load_weights(frames).fingerprint
        assert got == fp and fingerprint_mismatch(fp, got or {}) == []


def test_mismatch_rules_absent_keys_numbers_and_bools() -> None:
    assert fingerprint_mismatch({"a": 1}, {}) == ["a"]
    assert fingerprint_mismatch({}, {"b": 1}) == ["b"]
    assert fingerprint_mismatch({"g": 1}, {"g": 1.0}) == [], "another encoder may send 1.0 as 1"
    assert fingerprint_mismatch({"d": True}, {"d": 1}) == ["d"], "a bool is not a number"
    assert fingerprint_mismatch({"s": [84, 84]}, {"s": [84, 84, 4]}) == ["s"]
    assert fingerprint_mismatch({"s": [84]}, {"s": 84}) == ["s"]
    assert fingerprint_mismatch({"z": 1, "a": 2, "m": 3}, {"z": 0, "a": 0, "m": 3}) == ["a", "z"]


def test_mismatch_message_is_one_line_naming_each_key_and_both_values() -> None:
    mine = run_fingerprint(cfg("agent.n_step=5"), CARTPOLE)
    theirs = {**run_fingerprint(cfg(), CARTPOLE), "weird\nkey": "x" * 256}
    with pytest.raises(FingerprintMismatch) as info:
        check_fingerprint(mine, theirs)
    text = str(info.value)
    assert "\n" not in text
    assert "agent.n_step 5 here, 3 at the learner" in text
    assert "<absent> here" in text and "'weird\\nkey'" in text
    assert info.value.keys == ["agent.n_step", "weird\nkey"]
    assert isinstance(info.value, ValueError)
    check_fingerprint(mine, dict(mine))  # agreeing maps pass silently
