"""The weights path after its fast-path work (issue 12): every check still holds, and what an actor
applies is bit for bit what the learner published.

Publisher and subscriber talk over inproc (once the subscription is through, a send returns only
after the message is queued at the subscriber, so ``latest()`` sees it without a wait on the
clock). Actors are a numpy policy and the CPU torch DQN agent, as the actors of those configs are.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.numpy_policies import NumpyDQNPolicy
from zmqrl.spec import SampleSpec
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages, WeightsPublisher, WeightsSubscriber
from zmqrl.transport.fingerprint import FingerprintMismatch, check_fingerprint
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.transport.wire import Fingerprint, WeightsMsg, WireError
from zmqrl.types import TransitionBatch, Weights

LIMITS = sockets.SocketLimits(samples_hwm=2, linger_ms=0)
FINGERPRINT: Fingerprint = {
    "env.id": "CartPole-v1",
    "obs.shape": [4],
    "agent.n_step": 3,
    "agent.double": True,
}
CONFIG = DQNConfig(hidden_sizes=[16, 16], device="cpu")
_endpoints = itertools.count()

Policy = NumpyDQNPolicy | DQNAgent


SPEC = SampleSpec((4,), "float32", (), "int64", num_actions=2)


def make_policy(kind: str) -> Policy:
    if kind == "numpy":
        return NumpyDQNPolicy(CONFIG, SPEC, seed=0)
    return DQNAgent(CONFIG, SPEC, seed=0)


def published(version: int, policy: Policy, seed: int = 1, special: bool = True) -> Weights:
    """Random weights in ``policy``'s layout; with ``special``, the first array starts with the
    float32 values that a copy through another type would change: -0.0, the largest finite value,
    a subnormal."""
    rng = np.random.default_rng(seed)
    shapes = {name: array.shape for name, array in applied(policy).items()}
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if special:
        first = next(iter(arrays.values())).reshape(-1)
        first[:3] = np.array([-0.0, np.finfo(np.float32).max, 1e-45], np.float32)
    return Weights(version, arrays)


def applied(policy: Policy) -> dict[str, np.ndarray]:
    """The weights ``policy`` acts with now, by name."""
    if isinstance(policy, NumpyDQNPolicy):
        return {name: array.copy() for name, array in policy.arrays.items()}
    return {name: t.detach().numpy().copy() for name, t in policy.online.state_dict().items()}


def assert_bitwise_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name].view(np.uint32), want[name].view(np.uint32), err_msg=name)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


class Channel:
    """A learner's publisher and an actor's subscriber and weights client (the policy checks
    names and shapes, the client versions)."""

    def __init__(self, ctx: zmq.Context, policy: Policy, fingerprint: Fingerprint = FINGERPRINT) -> None:
        self.pub_sock, endpoint = sockets.weights_pub(
            ctx, f"inproc://weights-fast-{next(_endpoints)}", LIMITS
        )
        self.publisher = WeightsPublisher(self.pub_sock, "dqn", fingerprint=fingerprint)
        self.sub = WeightsSubscriber(
            sockets.weights_sub(ctx, endpoint, LIMITS),
            None,
            BadMessages("test weights"),
            expected_fingerprint=dict(FINGERPRINT),
        )
        self.policy = policy
        self.client = WeightsClient(policy, self.sub.bad)

    def connect(self) -> WeightsMsg:
        """Publish version 1, 2, ... until the subscription is through; the message that arrived."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.publisher.publish(published(self.publisher.version + 1, self.policy))
            self.sub._sock.poll(20)
            msg = self.sub.latest()
            if msg is not None:
                return msg
        raise AssertionError("no weights arrived")

    def apply_latest(self) -> bool:
        """As an actor's weights sync does: the newest valid message, loaded if newer."""
        msg = self.sub.latest()
        return msg is not None and self.client.offer(msg.weights)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_the_applied_weights_are_the_published_ones_bit_for_bit(ctx: zmq.Context, kind: str) -> None:
    channel = Channel(ctx, make_policy(kind))
    channel.connect()
    weights = published(channel.publisher.version + 1, channel.policy, seed=7)
    channel.publisher.publish(weights)
    assert channel.apply_latest()
    assert channel.client.version == weights.version
    assert_bitwise_equal(applied(channel.policy), weights.arrays)
    assert channel.sub.bad.count == 0


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_applied_weights_are_copies_not_views_of_the_received_frames(ctx: zmq.Context, kind: str) -> None:
    channel = Channel(ctx, make_policy(kind))
    channel.connect()
    channel.publisher.publish(published(channel.publisher.version + 1, channel.policy, seed=3))
    msg = channel.sub.latest()
    assert msg is not None and channel.client.offer(msg.weights)
    mine = (
        channel.policy.arrays if isinstance(channel.policy, NumpyDQNPolicy) else channel.policy._online_arrays
    )
    assert mine is not None
    for name, array in msg.weights.arrays.items():
        assert not np.shares_memory(mine[name], array), name


def test_a_numpy_policy_loads_into_the_arrays_it_already_holds() -> None:
    policy = make_policy("numpy")
    assert isinstance(policy, NumpyDQNPolicy)
    held = dict(policy.arrays)
    weights = published(1, policy)
    policy.load_weights(weights.arrays)
    assert all(policy.arrays[name] is held[name] for name in held), "no new arrays per load"
    assert_bitwise_equal(applied(policy), weights.arrays)


def corrupt_nan(weights: Weights) -> Weights:
    arrays = {name: array.copy() for name, array in weights.arrays.items()}
    arrays[next(reversed(arrays))].reshape(-1)[-1] = np.nan
    return Weights(weights.version, arrays)


def corrupt_inf(weights: Weights) -> Weights:
    arrays = {name: array.copy() for name, array in weights.arrays.items()}
    arrays[next(iter(arrays))].reshape(-1)[0] = -np.inf
    return Weights(weights.version, arrays)


def corrupt_shape(weights: Weights) -> Weights:
    arrays = dict(weights.arrays)
    name = next(iter(arrays))
    arrays[name] = np.zeros((arrays[name].shape[0], arrays[name].shape[1] + 1), np.float32)
    return Weights(weights.version, arrays)


def corrupt_dtype(weights: Weights) -> Weights:
    arrays = dict(weights.arrays)
    name = next(iter(arrays))
    arrays[name] = arrays[name].astype(np.float64)
    return Weights(weights.version, arrays)


def corrupt_names(weights: Weights) -> Weights:
    arrays = dict(weights.arrays)
    arrays["extra.weight"] = np.zeros(3, np.float32)
    return Weights(weights.version, arrays)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("corrupt", [corrupt_nan, corrupt_inf, corrupt_shape, corrupt_dtype, corrupt_names])
def test_an_invalid_snapshot_is_counted_dropped_and_never_applied(
    ctx: zmq.Context, kind: str, corrupt: object
) -> None:
    channel = Channel(ctx, make_policy(kind))
    channel.connect()
    before, version = applied(channel.policy), channel.client.version
    bad = corrupt(published(channel.publisher.version + 1, channel.policy, seed=5))  # type: ignore[operator]
    channel.publisher.publish(bad)
    assert not channel.apply_latest()
    assert channel.sub.bad.count == 1
    assert channel.client.version == version
    assert_bitwise_equal(applied(channel.policy), before)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_truncated_frame_is_counted_and_the_older_valid_snapshot_wins(ctx: zmq.Context, kind: str) -> None:
    channel = Channel(ctx, make_policy(kind))
    channel.connect()
    good = published(channel.publisher.version + 1, channel.policy, seed=11)
    channel.publisher.publish(good)
    frames = [
        bytes(f)
        for f in wire.dump(WeightsMsg(published(good.version + 1, channel.policy), "dqn", FINGERPRINT))
    ]
    frames[-1] = frames[-1][:-4]  # the last array's frame is shorter than its descriptor says
    channel.pub_sock.send_multipart(frames)
    assert channel.apply_latest()
    assert channel.sub.bad.count == 1
    assert channel.client.version == good.version
    assert_bitwise_equal(applied(channel.policy), good.arrays)


@pytest.mark.parametrize(
    "theirs",
    [
        {**FINGERPRINT, "agent.n_step": 5},
        {**FINGERPRINT, "agent.n_step": True},  # a bool is never a number, though True == 1
        {**FINGERPRINT, "agent.double": 1},
        {**FINGERPRINT, "obs.shape": [True]},
        {k: v for k, v in FINGERPRINT.items() if k != "agent.double"},
        {**FINGERPRINT, "env.extra": "x"},
    ],
)
def test_a_snapshot_with_another_fingerprint_is_refused_before_anything_is_applied(
    ctx: zmq.Context, theirs: Fingerprint
) -> None:
    policy = make_policy("numpy")
    channel = Channel(ctx, policy, fingerprint=theirs)
    deadline = time.monotonic() + 10
    with pytest.raises(FingerprintMismatch):
        while time.monotonic() < deadline:
            channel.publisher.publish(published(channel.publisher.version + 1, policy))
            channel.sub._sock.poll(20)
            channel.apply_latest()
    assert channel.client.version == 0


def test_fingerprints_compare_numbers_by_value_and_bools_by_type() -> None:
    check_fingerprint({"a": 1, "b": [2, 0.5]}, {"a": 1.0, "b": [2.0, 0.5]})
    for theirs in ({"a": True, "b": [2, 0.5]}, {"a": 1, "b": [2, 0.5, 1]}, {"a": 1, "b": (2, 0.5)}, {"a": 1}):
        with pytest.raises(FingerprintMismatch):
            check_fingerprint({"a": 1, "b": [2, 0.5]}, theirs)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_older_or_equal_version_is_never_applied(ctx: zmq.Context, kind: str) -> None:
    policy = make_policy(kind)
    client = WeightsClient(policy)
    newest = published(5, policy, seed=2)
    assert client.offer(newest)
    for version in (5, 4):
        assert not client.offer(published(version, policy, seed=9))
    assert client.version == 5
    assert_bitwise_equal(applied(policy), newest.arrays)


def test_the_torch_agents_target_equals_the_loaded_weights_whenever_it_is_used() -> None:
    agent = DQNAgent(
        DQNConfig(hidden_sizes=[16, 16], device="cpu", target_update_interval=1000), SPEC, seed=0
    )
    weights = published(1, agent, seed=4)
    agent.load_weights(weights.arrays)
    target = {name: t.detach().numpy().copy() for name, t in agent.target.state_dict().items()}
    assert_bitwise_equal(target, weights.arrays)
    # A learner that loaded (not an actor) trains on: the target is the loaded net, not the
    # online net after the step.
    agent.load_weights(published(2, agent, seed=6).arrays)
    rng = np.random.default_rng(0)
    batch = TransitionBatch(
        obs=rng.standard_normal((8, 4)).astype(np.float32),
        action=rng.integers(0, 2, 8),
        reward=np.ones(8, np.float32),
        next_obs=rng.standard_normal((8, 4)).astype(np.float32),
        discount=np.full(8, 0.99, np.float32),
    )
    agent.update(batch)
    target = {name: t.detach().numpy().copy() for name, t in agent.target.state_dict().items()}
    assert_bitwise_equal(target, published(2, agent, seed=6).arrays)
    restored = DQNAgent(CONFIG, SPEC, seed=1)
    agent.load_weights(published(3, agent, seed=8).arrays)
    restored.load_state_dict(agent.state_dict())  # a checkpoint holds the target as loaded
    saved = {name: t.detach().numpy().copy() for name, t in restored.target.state_dict().items()}
    assert_bitwise_equal(saved, published(3, agent, seed=8).arrays)


def test_validation_accepts_a_reference_in_other_spellings_and_still_rejects_misfits() -> None:
    arrays = {"w": np.ones((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    msg = WeightsMsg(Weights(1, arrays), "dqn")
    wire.validate_weights(msg, {"w": ([2, 3], np.dtype("float32")), "b": ((2,), "<f4")})  # type: ignore[dict-item]
    with pytest.raises(WireError, match="expected float32 \\(3, 2\\)"):
        wire.validate_weights(msg, {"w": ((3, 2), "float32"), "b": ((2,), "float32")})
    with pytest.raises(WireError, match="missing \\['c'\\]"):
        wire.validate_weights(msg, {"w": ((2, 3), "float32"), "b": ((2,), "float32"), "c": ((1,), "float32")})
    bad_bool = WeightsMsg(Weights(1, {"m": np.frombuffer(b"\x00\x02", np.bool_)}), "dqn")
    with pytest.raises(WireError, match="bool bytes"):
        wire.validate_weights(bad_bool)


def test_numpy_scalars_in_a_fingerprint_go_out_as_plain_values() -> None:
    fingerprint = {"a": np.int64(3), "b": [np.float32(0.5), 2], "c": np.bool_(True), "d": "x"}
    msg = WeightsMsg(Weights(1, {"w": np.zeros(1, np.float32)}), "dqn", fingerprint)  # type: ignore[arg-type]
    back = wire.load(wire.dump(msg))
    assert isinstance(back, WeightsMsg) and back.fingerprint == {"a": 3, "b": [0.5, 2], "c": True, "d": "x"}
    assert [type(v) for v in back.fingerprint.values()] == [int, list, bool, str]
    assert [type(v) for v in back.fingerprint["b"]] == [float, int]  # type: ignore[union-attr]


def test_the_torch_agent_loads_into_its_own_parameter_storage_and_acts_with_it() -> None:
    agent = make_policy("torch")
    assert isinstance(agent, DQNAgent)
    pointers = {name: p.data_ptr() for name, p in agent.online.named_parameters()}
    weights = published(1, agent, seed=12, special=False)
    agent.load_weights(weights.arrays)
    assert {name: p.data_ptr() for name, p in agent.online.named_parameters()} == pointers
    numpy_twin = make_policy("numpy")
    numpy_twin.load_weights(weights.arrays)
    obs = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    assert isinstance(numpy_twin, NumpyDQNPolicy)
    np.testing.assert_allclose(agent.q_values(obs), numpy_twin.q_values(obs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_load_that_fails_on_its_last_parameter_changes_nothing(kind: str) -> None:
    policy = make_policy(kind)
    policy.load_weights(published(1, policy, seed=13).arrays)
    before = applied(policy)
    arrays = dict(published(2, policy, seed=14).arrays)
    last = next(reversed(arrays))
    arrays[last] = np.full(arrays[last].shape, "x")  # right shape, not numbers
    with pytest.raises(ValueError, match="not float32"):
        policy.load_weights(arrays)
    assert_bitwise_equal(applied(policy), before)
