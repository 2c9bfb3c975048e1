"""Channels over real ZeroMQ sockets (inproc): junk is counted and dropped, never raised."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import zmq

from zmqrl.config import load_config
from zmqrl.roles.link import SupervisorLink
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import (
    BadMessages,
    ControlPublisher,
    ControlSubscriber,
    HeartbeatReceiver,
    HeartbeatSender,
    SampleSender,
    WeightsPublisher,
    WeightsSubscriber,
)
from zmqrl.transport.wire import SamplesMsg, StopMsg
from zmqrl.types import TransitionBatch, Weights

LIMITS = sockets.SocketLimits(samples_hwm=2, linger_ms=0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bad_messages_are_logged_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    bad = BadMessages("test channel", logging.getLogger("t"), interval=5.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            bad.record(ValueError("junk"))
        clock.now = 6.0
        bad.record(ValueError("more junk"))
    assert bad.count == 101
    assert len(caplog.records) == 2
    assert "dropped 100 malformed message(s)" in caplog.records[1].getMessage()


def test_heartbeat_receiver_keeps_heartbeats_and_counts_junk(ctx: zmq.Context) -> None:
    pull, endpoint = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    push = sockets.heartbeat_push(ctx, endpoint, LIMITS)
    receiver = HeartbeatReceiver(pull, BadMessages("hb"))
    HeartbeatSender(push, "actor", 3, interval=1.0).beat("running", {"steps": 10, "lag": float("nan")})
    push.send(b"\xc1 not msgpack")
    push.send_multipart(wire.dump(StopMsg("wrong channel")))
    got = []
    for _ in range(50):
        got += receiver.recv_all(100)
        if got and receiver.bad.count == 2:
            break
    assert [(h.role, h.id, h.state) for h in got] == [("actor", 3, "running")]
    assert got[0].counters == {"steps": 10}, "NaN counters are left out rather than breaking the message"
    assert receiver.bad.count == 2


def test_control_subscriber_sees_stop_and_survives_junk(ctx: zmq.Context) -> None:
    pub, endpoint = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    sub = ControlSubscriber(sockets.control_sub(ctx, endpoint, LIMITS), BadMessages("ctl"))
    publisher = ControlPublisher(pub)
    stop = None
    for _ in range(100):  # PUB/SUB drops until the subscription is through: repeat like the supervisor
        pub.send(b"junk")
        publisher.stop("finished")
        if pub.poll(0, zmq.POLLOUT) and sub._sock.poll(50):
            stop = sub.poll_stop()
            if stop is not None:
                break
    assert stop == StopMsg("finished")
    # The subscription may have gone through between a junk frame and its stop: send junk once more,
    # now that it surely arrives, and check that it was counted and did not stop anything.
    pub.send(b"junk")
    for _ in range(50):
        if sub.bad.count >= 1:
            break
        sub._sock.poll(100)
        sub.poll_stop()  # a stop still in flight from the loop above may come first
    assert sub.bad.count >= 1


def test_weights_subscriber_returns_only_the_newest_snapshot(ctx: zmq.Context) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    reference = {"w": ((2,), "float32")}
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), reference, BadMessages("w"))
    got = None
    for version in range(1, 200):
        publisher.publish(Weights(version, {"w": np.full(2, version, np.float32)}))
        sub._sock.poll(20)
        got = sub.latest()
        if got is not None:
            break
    assert got is not None and got.weights.version == publisher.version
    for version in (publisher.version + 1, publisher.version + 2):
        publisher.publish(Weights(version, {"w": np.full(2, version, np.float32)}))
    pub_sock.send(b"junk after the newest")
    time.sleep(0.3)  # let all three arrive before draining
    newest = sub.latest()
    assert newest is not None and newest.weights.version == publisher.version
    assert sub.bad.count == 1


def test_weights_publisher_refuses_to_go_backwards(ctx: zmq.Context) -> None:
    pub_sock, _ = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    publisher.publish(Weights(3, {"w": np.zeros(1, np.float32)}))
    with pytest.raises(ValueError, match="backwards"):
        publisher.publish(Weights(2, {"w": np.zeros(1, np.float32)}))


def test_blocked_sample_sender_gives_up_when_told_to_stop(ctx: zmq.Context) -> None:
    # No learner listening: with IMMEDIATE set, the PUSH socket has nowhere to queue.
    push = sockets.samples_push(ctx, "tcp://127.0.0.1:1", LIMITS)
    sender = SampleSender(push)
    batch = TransitionBatch(
        obs=np.zeros((1, 4), np.float32),
        action=np.zeros(1, np.int64),
        reward=np.zeros(1, np.float32),
        next_obs=np.zeros((1, 4), np.float32),
        discount=np.ones(1, np.float32),
    )
    calls = []

    def idle() -> bool:
        calls.append(1)
        return len(calls) >= 3

    sent = sender.send(SamplesMsg(0, 0, 0, batch, []), idle=idle)
    assert not sent and len(calls) == 3 and sender.messages_sent == 0
    assert sender.blocked_seconds > 0


def test_weights_subscriber_notices_the_learners_stop_announcement(ctx: zmq.Context) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), None, BadMessages("w"))
    for _ in range(100):  # PUB/SUB: repeat until the subscription is through
        publisher.announce_stop("learner finished")
        time.sleep(0.02)
        assert sub.latest() is None
        if sub.stop is not None:
            break
    assert sub.stop == StopMsg("learner finished")
    assert sub.bad.count == 0, "a stop announcement is not a malformed message"


def test_roles_leave_when_the_supervisor_falls_silent(ctx: zmq.Context) -> None:
    pub, control = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    _, heartbeat = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    cfg = load_config(
        None,
        [
            f"transport.control={control}",
            f"transport.heartbeat={heartbeat}",
            "supervisor.heartbeat_timeout=5",
            "supervisor.heartbeat_interval=1",
        ],
    )
    clock = FakeClock()
    stop = threading.Event()
    link = SupervisorLink(ctx, cfg, "actor", 0, stop, clock=clock, watch_supervisor=True)
    supervisor = ControlPublisher(pub)
    for t in range(1, 9):  # a live supervisor: heartbeats keep the role going past the timeout
        clock.now = float(t)
        supervisor.heartbeat()
        time.sleep(0.05)
        assert not link.tick(dict), f"stopped at t={t} although the supervisor is alive"
    assert link.control.supervisor_seen is not None
    clock.now = 8.0 + 5.5  # ... then silence for longer than supervisor.heartbeat_timeout
    assert link.tick(dict)
    assert link.stop_reason.startswith("supervisor silent for")
    link.close()


def test_roles_started_by_hand_do_not_watch_for_a_supervisor(ctx: zmq.Context) -> None:
    cfg = load_config(None, ["transport.control=tcp://127.0.0.1:1", "transport.heartbeat=tcp://127.0.0.1:2"])
    clock = FakeClock()
    link = SupervisorLink(ctx, cfg, "learner", 0, threading.Event(), clock=clock, watch_supervisor=False)
    clock.now = 10_000.0
    assert not link.tick(dict)
    link.close()
