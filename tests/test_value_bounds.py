"""Finite is not valid: samples whose values the run cannot mean are bad messages (issue 23 item 2).

Observations outside the env's declared bounds (unbounded components within
``transport.max_abs_obs``), rewards beyond ``transport.max_abs_reward``, discounts above gamma,
episode returns no such rewards can add up to: each makes its message a bad one, dropped alone
and counted, on both of the learner's receive paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from zmqrl.config import EnvConfig, TransportConfig
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.errors import ConfigError
from zmqrl.spec import DEFAULT_MAX_ABS_OBS, DEFAULT_MAX_ABS_REWARD, SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.channels import BadMessages, SampleReceiver
from zmqrl.transport.decoding import validate_samples
from zmqrl.transport.wire import SamplesMsg, WireError
from zmqrl.types import EpisodeStat, TransitionBatch

GAMMA = 0.99


@pytest.fixture(scope="module")
def cartpole() -> SampleSpec:
    """CartPole's spec as the learner builds it: x and angle bounded, both velocities not."""
    env = make_env(EnvConfig(id="CartPole-v1"))
    try:
        return sample_spec(env, max_discount=GAMMA)
    finally:
        env.close()


def message(
    seq: int = 0, n: int = 8, episodes: list[EpisodeStat] | None = None, **columns: object
) -> SamplesMsg:
    """A valid CartPole message, with ``columns`` (``obs`` rows, ``reward``, ...) replacing parts:
    a value at row 3, component ``col``, given as ``obs=(col, value)``."""
    rng = np.random.default_rng(seq)
    obs = rng.uniform(-0.2, 0.2, (n, 4)).astype(np.float32)
    batch = TransitionBatch(
        obs, rng.integers(0, 2, n), np.ones(n, np.float32), obs.copy(), np.full(n, GAMMA, np.float32)
    )
    for name, value in columns.items():
        column = getattr(batch, name).copy()
        if isinstance(value, tuple):
            column[3, value[0]] = value[1]
        else:
            column[3] = value
        batch = batch._replace(**{name: column})
    return SamplesMsg(0, seq, 1, batch, episodes or [])


def refused(msg: SamplesMsg, spec: SampleSpec) -> str:
    with pytest.raises(WireError) as info:
        validate_samples(msg, spec)
    return str(info.value)


def test_the_spec_carries_the_envs_declared_observation_bounds(cartpole: SampleSpec) -> None:
    limits = cartpole.obs_limits()
    assert limits is not None
    low, high = limits
    assert high[0] == pytest.approx(4.8, rel=2e-5) and high[2] == pytest.approx(0.4189, abs=1e-4)
    # Declared unbounded: the magnitude limit (each bound with a float32 rounding's slack).
    assert high[1] == high[3] == pytest.approx(DEFAULT_MAX_ABS_OBS, rel=2e-5)
    assert (low == -high).all() and low.dtype == np.float32


@pytest.mark.parametrize(
    ("component", "value"),
    [(0, 4.9), (0, 4.801), (2, -0.5), (1, 1e30), (3, -2e6), (1, np.nan), (0, np.inf)],
)
def test_an_observation_outside_what_the_env_declares_is_refused(
    cartpole: SampleSpec, component: int, value: float
) -> None:
    """Position and angle beyond their declared bounds; a velocity of 1e30 although CartPole
    declares velocities unbounded (the issue's 1e30 row turned every DQN parameter NaN)."""
    for column in ("obs", "next_obs"):
        reason = refused(message(**{column: (component, value)}), cartpole)
        assert f"{column} component {component}" in reason and "max_abs_obs" in reason
    validate_samples(message(obs=(component, 0.0)), cartpole)


def test_the_bounds_themselves_are_valid(cartpole: SampleSpec) -> None:
    limits = cartpole.obs_limits()
    assert limits is not None
    for row in (limits[0], limits[1]):
        validate_samples(message(obs=row, next_obs=row), cartpole)
    # A few ulps past a declared bound (an env's own float32 rounding) are within the tolerance.
    validate_samples(message(obs=(0, 4.80001), next_obs=(2, -0.418882)), cartpole)


@pytest.mark.parametrize("reward", [3e38, -3e38, 2 * DEFAULT_MAX_ABS_REWARD, np.nan, -np.inf])
def test_a_reward_beyond_the_limit_is_refused(cartpole: SampleSpec, reward: float) -> None:
    assert "max_abs_reward" in refused(message(reward=reward), cartpole)


def test_a_reward_at_the_limit_is_valid(cartpole: SampleSpec) -> None:
    validate_samples(message(reward=-DEFAULT_MAX_ABS_REWARD), cartpole)
    tight = dataclasses.replace(cartpole, max_abs_reward=100.0)
    validate_samples(message(reward=100.0), tight)
    assert "max_abs_reward" in refused(message(reward=100.5), tight)


def test_a_discount_above_gamma_is_refused(cartpole: SampleSpec) -> None:
    """A transition's discount is gamma ** k (k >= 1) or 0; 1.0 at gamma 0.99 would bootstrap
    without discounting, a value no actor of this run sends."""
    validate_samples(message(discount=np.float32(GAMMA)), cartpole)  # gamma ** 1, as float32
    validate_samples(message(discount=0.0), cartpole)
    assert "agent.gamma" in refused(message(discount=1.0), cartpole)


def test_an_episode_return_no_reward_of_the_limit_can_make_is_refused(cartpole: SampleSpec) -> None:
    validate_samples(message(episodes=[EpisodeStat(-DEFAULT_MAX_ABS_REWARD * 500, 500)]), cartpole)
    for ret, length in [(3e38, 500), (DEFAULT_MAX_ABS_REWARD * 2, 1), (DEFAULT_MAX_ABS_REWARD * 2, 0)]:
        assert "episode return" in refused(message(episodes=[EpisodeStat(ret, length)]), cartpole)


def test_integer_observations_are_checked_only_when_bounds_are_narrower_than_the_dtype() -> None:
    grid = SampleSpec((2, 3, 3), "uint8", (), "int64", num_actions=3, obs_low=0, obs_high=1)  # MinAtar
    frames = SampleSpec((2, 3, 3), "uint8", (), "int64", num_actions=3, obs_low=0, obs_high=255)  # Atari
    assert frames.obs_limits() is None
    ones = np.ones((4, 2, 3, 3), np.uint8)
    msg = SamplesMsg(
        0,
        0,
        1,
        TransitionBatch(ones, np.zeros(4, np.int64), np.zeros(4, np.float32), ones, np.zeros(4, np.float32)),
        [],
    )
    validate_samples(msg, grid)
    twos = msg.batch._replace(next_obs=ones * 2)
    assert "next_obs component" in refused(dataclasses.replace(msg, batch=twos), grid)
    validate_samples(dataclasses.replace(msg, batch=twos), frames)


def test_declared_bounds_wholly_beyond_the_magnitude_limit_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"transport\.max_abs_obs"):
        SampleSpec((2,), "float32", (), "int64", num_actions=2, obs_low=(0.0, 1e7), obs_high=(1.0, 2e7))


def test_the_spec_defaults_are_the_config_defaults() -> None:
    assert TransportConfig().max_abs_obs == DEFAULT_MAX_ABS_OBS
    assert TransportConfig().max_abs_reward == DEFAULT_MAX_ABS_REWARD


@pytest.fixture
def link(cartpole: SampleSpec) -> Iterator[tuple[zmq.Socket, SampleReceiver]]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://bounds")
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://bounds")
    yield push, SampleReceiver(pull, cartpole, BadMessages("samples"), zero_copy=False)
    push.close(0)
    pull.close(0)
    ctx.term()


def poisoned_and_good() -> tuple[list[SamplesMsg], set[int]]:
    msgs = [
        message(0),
        message(1, obs=(1, 1e30)),
        message(2),
        message(3, reward=3e38),
        message(4, next_obs=(2, 5.0)),
        message(5),
        message(6, discount=1.0),
    ]
    return msgs, {0, 2, 5}


@pytest.mark.parametrize("path", ["recv_nowait", "recv_group"])
def test_both_receive_paths_drop_exactly_the_poisoned_messages(
    link: tuple[zmq.Socket, SampleReceiver], path: str
) -> None:
    push, receiver = link
    msgs, good = poisoned_and_good()
    for msg in msgs:
        push.send_multipart(wire.dump(msg))
    received: list[SamplesMsg] = []
    if path == "recv_group":  # the merged scan fails, then each message is scanned alone
        while (group := receiver.recv_group(16)) is not None:
            received.extend(group.messages)
    else:
        while (msg := receiver.recv_nowait()) is not False:
            if msg is not None:
                assert isinstance(msg, SamplesMsg)
                received.append(msg)
    assert {m.seq for m in received} == good
    assert receiver.bad.count == len(msgs) - len(good)
