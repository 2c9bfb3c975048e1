"""Every receiving socket refuses a message once its frames pass the channel's limit (issue 23 item 8).

ZeroMQ's MAXMSGSIZE limits each frame, not a message: a peer could send many frames, each under
the limit, and the receiver copied all of them into Python before any check looked. Each receiver
now reads frame by frame and drops the rest of a message that passes its limit. What Python
allocates while receiving such a message is measured with tracemalloc (it sees the bytes copies a
receive makes; libzmq's own buffer is outside it, and is what docs/deployment.md's residual bound
is about). The real learner under a many-frame flood is tests/test_flood.py's heavy case.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator

import msgpack
import numpy as np
import pytest
import zmq

from tests.conftest import wait_until
from zmqrl.spec import SampleSpec
from zmqrl.supervisor.status import REQUEST_LIMIT, StatusServer
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages, SampleReceiver, WeightsPublisher, WeightsSubscriber
from zmqrl.transport.control import ControlSubscriber, HeartbeatReceiver
from zmqrl.transport.receiving import FrameLimit, MessageTooLarge, recv_bounded
from zmqrl.transport.wire import HeartbeatMsg, SamplesMsg, StopMsg
from zmqrl.types import TransitionBatch, Weights

MIB = 2**20
# transport.max_message_mb for these tests: each frame below stays under it, the message does not.
LIMIT_MB = 1
LIMITS = sockets.SocketLimits(samples_hwm=16, linger_ms=0, max_message_bytes=LIMIT_MB * MIB)
# The bomb: 40 frames of 256 KiB (10 MiB), each a quarter of the 1 MiB limit.
BOMB_FRAMES, BOMB_FRAME_BYTES = 40, 256 * 1024
SPEC = SampleSpec((4,), "float32", (), "int64", num_actions=2)


def bomb(first: bytes = b"\x80") -> list[bytes]:
    return [first] + [b"x" * BOMB_FRAME_BYTES] * (BOMB_FRAMES - 1)


def small_batch(rows: int = 2) -> TransitionBatch:
    return TransitionBatch(
        obs=np.zeros((rows, 4), np.float32),
        action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32),
        next_obs=np.zeros((rows, 4), np.float32),
        discount=np.full(rows, 0.9, np.float32),
    )


def samples(seq: int, rows: int = 2) -> list[bytes]:
    return [bytes(f) for f in wire.dump(SamplesMsg(0, seq, 0, small_batch(rows), []))]


@pytest.fixture
def traced() -> Iterator[Callable[[], float]]:
    """Peak Python allocation (MiB) since the last call."""
    tracemalloc.start()

    def peak() -> float:
        _, high = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        return high / MIB

    yield peak
    tracemalloc.stop()


def pull_pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    pull, endpoint = sockets.samples_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    push = ctx.socket(zmq.PUSH)  # a raw peer: no zmqrl checks on what it sends
    push.setsockopt(zmq.LINGER, 0)
    push.connect(endpoint)
    return push, pull


def test_recv_bounded_drops_the_rest_of_a_message_past_its_limit_and_stands_at_the_next(
    ctx: zmq.Context,
) -> None:
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://bounded")
    b.connect("inproc://bounded")
    a.send_multipart([b"h"] + [b"y" * 10] * 9)  # 10 frames
    a.send_multipart([b"h", b"y" * 100])  # 2 frames, 101 bytes
    a.send_multipart([b"h", b"ok"])
    limit = FrameLimit(max_frames=3, max_bytes=50)
    with pytest.raises(MessageTooLarge, match="after 10 frame"):
        recv_bounded(b, limit, copy=True)
    with pytest.raises(MessageTooLarge, match="101 byte"):
        recv_bounded(b, limit, copy=False)
    assert recv_bounded(b, limit, copy=True) == [b"h", b"ok"]
    with pytest.raises(zmq.Again):
        recv_bounded(b, limit, copy=True)
    a.close()
    b.close()


def test_the_learner_drops_a_many_frame_samples_message_without_copying_it(
    ctx: zmq.Context, traced: Callable[[], float]
) -> None:
    push, pull = pull_pair(ctx)
    receiver = SampleReceiver(pull, SPEC, BadMessages("samples"), zero_copy=False)  # the copying path
    push.send_multipart(bomb(samples(0)[0]), copy=False)
    push.send_multipart(samples(1))
    assert pull.poll(5000)
    traced()
    first = receiver.recv_nowait()
    peak = traced()
    wait_until(lambda: pull.poll(0), 5, "the valid message")
    second = receiver.recv_nowait()
    # At most a message limit's worth of copies: recv_multipart copied all 10 MiB before any check.
    assert peak < 2 * LIMIT_MB, f"{peak:.1f} MiB allocated receiving a refused message"
    assert first is None and receiver.bad.count == 1
    assert "refused after 40 frame(s)" in receiver.bad._latest
    assert isinstance(second, SamplesMsg) and second.seq == 1
    push.close()
    pull.close()


def test_a_samples_message_larger_in_all_than_max_message_mb_is_refused_though_each_frame_fits(
    ctx: zmq.Context,
) -> None:
    push, pull = pull_pair(ctx)
    receiver = SampleReceiver(pull, SPEC, BadMessages("samples"))
    rows = int(0.7 * MIB) // 16  # obs and next_obs are 0.7 MiB each: 1.4 MiB in all
    push.send_multipart(samples(0, rows))
    push.send_multipart(samples(1))
    received: list[SamplesMsg | None] = []

    def both_received() -> bool:
        if (got := receiver.recv_nowait()) is not False:
            received.append(got)
        return len(received) == 2

    wait_until(both_received, 5, "both messages")
    assert received[0] is None and "transport.max_message_mb" in receiver.bad._latest
    assert isinstance(received[1], SamplesMsg) and received[1].seq == 1
    push.close()
    pull.close()


def test_an_actor_refuses_weights_larger_in_all_than_max_message_mb(ctx: zmq.Context) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), None, BadMessages("w"))
    big = {f"w{i}": np.zeros(int(0.4 * MIB) // 4, np.float32) for i in range(4)}  # 1.6 MiB in all
    version = 0
    deadline = time.monotonic() + 10
    while sub.bad.count == 0 and time.monotonic() < deadline:  # until the subscription is through
        version += 1
        publisher.publish(Weights(version, big))
        sub._sock.poll(50)
        assert sub.latest() is None
    assert sub.bad.count >= 1 and "refused after 5 frame(s)" in sub.bad._latest
    publisher.publish(Weights(version + 1, {"w": np.zeros(4, np.float32)}))
    wait_until(lambda: sub.latest() is not None, 5, "small weights")
    pub_sock.close()
    sub._sock.close()


def test_the_supervisor_drops_a_many_frame_heartbeat_without_copying_it(
    ctx: zmq.Context, traced: Callable[[], float]
) -> None:
    pull, endpoint = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    receiver = HeartbeatReceiver(pull, BadMessages("hb"))
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(endpoint)
    header = bytes(wire.dump(HeartbeatMsg("actor", 1, 1, 0.0, "running", {}, {}))[0])
    frames = [header] + [b"x" * (60 * 1024)] * 100  # 6 MiB of 60 KiB frames, under the 64 KiB cap
    push.send_multipart(frames)
    push.send(header)
    assert pull.poll(5000)
    traced()
    got = receiver.recv_all(1000)
    peak = traced()
    if not got:  # the valid one may not have arrived yet
        got = receiver.recv_all(5000)
    assert [hb.id for hb in got] == [1] and receiver.bad.count == 1
    assert peak < 1, f"{peak:.1f} MiB allocated receiving a refused heartbeat"
    push.close()
    pull.close()


def test_a_role_drops_a_many_frame_control_message_without_copying_it_and_still_hears_the_stop(
    ctx: zmq.Context, traced: Callable[[], float]
) -> None:
    pub, endpoint = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    sub = ControlSubscriber(sockets.control_sub(ctx, endpoint, LIMITS), BadMessages("ctl"))
    stop = [bytes(f) for f in wire.dump(StopMsg("run finished"))]
    junk = [stop[0]] + [b"x" * (60 * 1024)] * 50  # 3 MiB of frames under the 64 KiB cap
    deadline = time.monotonic() + 10
    peak = 0.0
    while time.monotonic() < deadline:  # PUB drops until the subscription is through
        pub.send_multipart(junk)
        pub.send_multipart(stop)
        sub._sock.poll(50)
        traced()
        heard = sub.poll_stop()
        peak = max(peak, traced())
        if heard is not None:
            break
    assert peak < 1, f"{peak:.1f} MiB allocated receiving refused control messages"
    assert heard is not None and heard.reason == "run finished"
    assert sub.bad.count >= 1 and "refused after 51 frame(s)" in sub.bad._latest
    pub.close()
    sub._sock.close()


def test_the_status_server_drops_an_oversized_request_without_copying_it(
    ctx: zmq.Context, traced: Callable[[], float]
) -> None:
    router, endpoint = sockets.status_router(ctx, "tcp://127.0.0.1:0", LIMITS)
    server = StatusServer(router, lambda: None, BadMessages("status"))
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b""] + [b"x" * 4000] * 500)  # 2 MB of frames under the 4 KiB cap
    dealer.send_multipart([b"", msgpack.packb({"want": "status", "id": 7})])
    assert router.poll(5000)
    traced()
    server.serve()  # the oversized request is the first to be readable: it comes first on its connection
    peak = traced()

    def answered() -> bool:
        server.serve()
        return bool(dealer.poll(10))

    wait_until(answered, 5, "the reply to the valid request")
    reply = msgpack.unpackb(dealer.recv_multipart()[1])
    assert peak < 3 * REQUEST_LIMIT.max_bytes / MIB + 0.5, f"{peak:.1f} MiB allocated for one request"
    assert server.bad.count == 1 and "refused after" in server.bad._latest
    assert reply["id"] == 7  # answered (an error: there is no snapshot), the oversized one was not
    dealer.close()
    router.close()
