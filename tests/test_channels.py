"""Channels over real ZeroMQ sockets (inproc): junk is counted and dropped, never raised."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zmq

from zmqrl.config import load_config
from zmqrl.runtime.link import SupervisorLink
from zmqrl.spec import SampleSpec
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import (
    JOIN_RESEND_SECONDS,
    BadMessages,
    LearnerUnreachable,
    SampleReceiver,
    SampleSender,
    WeightsPublisher,
    WeightsSubscriber,
)
from zmqrl.transport.control import (
    DRAIN_MAX_MESSAGES,
    ControlPublisher,
    ControlSubscriber,
    HeartbeatReceiver,
    HeartbeatSender,
)
from zmqrl.transport.fingerprint import FingerprintMismatch
from zmqrl.transport.wire import Fingerprint, HeartbeatMsg, SamplesMsg, StopMsg
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
    # inproc, not TCP: once the subscription is through, a send returns only after the message is
    # queued in the subscriber's pipe, so all three below are there when latest() drains, with no
    # wait on the clock (over TCP nothing tells when the last of them has arrived).
    pub_sock, endpoint = sockets.weights_pub(ctx, "inproc://weights-newest", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    reference = {"w": ((2,), "float32")}
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), reference, BadMessages("w"))
    got = first_weights(publisher, sub, {"w": np.zeros(2, np.float32)})
    assert got.weights.version == publisher.version
    for version in (publisher.version + 1, publisher.version + 2):
        publisher.publish(Weights(version, {"w": np.full(2, version, np.float32)}))
    pub_sock.send(b"junk after the newest")
    newest = sub.latest()
    assert newest is not None and newest.weights.version == publisher.version
    assert sub.bad.count == 1


def test_weights_publisher_refuses_to_go_backwards(ctx: zmq.Context) -> None:
    pub_sock, _ = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    publisher.publish(Weights(3, {"w": np.zeros(1, np.float32)}))
    with pytest.raises(ValueError, match="backwards"):
        publisher.publish(Weights(2, {"w": np.zeros(1, np.float32)}))


def send_with_housekeeping(sender: SampleSender, msg: SamplesMsg, idle: Callable[[], bool]) -> bool:
    """What an actor does with a batch the learner's queue holds back: ``idle()`` (its housekeeping;
    True: told to stop) between retries. Returns whether the batch went out."""
    sent = sender.send(msg)
    while not sent:
        if idle():
            sender.abandon()
            return False
        sent = sender.retry()
    return True


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

    sent = send_with_housekeeping(sender, SamplesMsg(0, 0, 0, batch, []), idle)
    assert not sent and len(calls) == 3 and sender.messages_sent == 0
    assert sender.blocked_seconds > 0 and not sender.held


def test_a_held_back_sample_goes_out_on_a_retry_once_there_is_room(ctx: zmq.Context) -> None:
    """The sender never blocks on its own: a send the high-water mark refuses returns False and
    keeps the message; a retry after the learner read sends that same message, once."""
    small = sockets.SocketLimits(samples_hwm=1, linger_ms=0, samples_buffer_bytes=4096)
    pull, endpoint = sockets.samples_pull(ctx, "tcp://127.0.0.1:0", small)
    sender = SampleSender(sockets.samples_push(ctx, endpoint, small), endpoint)
    big = TransitionBatch(*(np.repeat(a, 4096, axis=0) for a in one_row_batch()))
    seq = 0
    deadline = time.monotonic() + 10
    while sender.send(SamplesMsg(0, seq, 0, big, [])):  # fills the queue and buffers, then is held
        seq += 1
        assert time.monotonic() < deadline, "the queue never filled"
    held_seq, sent_before = seq, sender.messages_sent
    assert sender.held
    with pytest.raises(RuntimeError, match="retried or abandoned"):
        sender.send(SamplesMsg(0, seq + 1, 0, big, []))
    seqs = []
    while not sender.retry():  # the learner reads meanwhile
        while pull.poll(0):
            seqs.append(wire.load(pull.recv_multipart()).seq)
        assert time.monotonic() < deadline, "the held message never went out"
    assert not sender.held and sender.messages_sent == sent_before + 1
    while len(seqs) < held_seq + 1 and pull.poll(2000):
        seqs.append(wire.load(pull.recv_multipart()).seq)
    assert seqs == list(range(held_seq + 1)), "each message once, in order, the held one last"
    sender.close()
    pull.close(linger=0)


def test_weights_subscriber_notices_the_learners_stop_announcement(ctx: zmq.Context) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), None, BadMessages("w"))
    deadline = time.monotonic() + 10
    while sub.stop is None:  # PUB/SUB: repeat until the subscription is through
        assert time.monotonic() < deadline, "the stop announcement never arrived"
        publisher.announce_stop("learner finished")
        sub._sock.poll(20)
        assert sub.latest() is None
    assert sub.stop == StopMsg("learner finished")
    assert sub.bad.count == 0, "a stop announcement is not a malformed message"


def link_config(control: str, heartbeat: str, *extra: str) -> Any:
    return load_config(
        None,
        [
            f"transport.control={control}",
            f"transport.heartbeat={heartbeat}",
            "supervisor.heartbeat_timeout=5",
            "supervisor.heartbeat_interval=1",
            *extra,
        ],
    )


def test_roles_leave_when_the_supervisor_falls_silent(ctx: zmq.Context) -> None:
    pub, control = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    _, heartbeat = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    clock = FakeClock()
    stop = threading.Event()
    # start=False: no heartbeat thread, each tick() services the link at once on the fake clock.
    link = SupervisorLink(
        ctx,
        link_config(control, heartbeat),
        "actor",
        0,
        stop,
        clock=clock,
        watch_supervisor=True,
        start=False,
        rejoin_grace=0.0,  # as under `launch`; the grace of watch-only roles: tests/test_rejoin_grace.py
    )
    supervisor = ControlPublisher(pub)
    for t in range(1, 9):  # a live supervisor: heartbeats keep the role going past the timeout
        clock.now = max(clock.now, float(t))
        deadline = time.monotonic() + 10
        while (link.control.supervisor_seen or 0.0) < t:  # PUB/SUB: resend until one is through
            assert time.monotonic() < deadline, f"the supervisor's heartbeat at t={t} never arrived"
            supervisor.heartbeat()
            link._ctl_sock.poll(20)
            clock.now += 0.1  # the control socket is read at most once per CONTROL_POLL_SECONDS
            assert not link.tick(dict), f"stopped at t={t} although the supervisor is alive"
    # A stall of this process (SIGSTOP, starved) longer than heartbeat_timeout is its own silence,
    # not the supervisor's: the supervisor's beats may still be in the kernel when it resumes.
    clock.now += 10.0
    assert not link.tick(dict), "a stopped-and-continued role took its own stall for a silent supervisor"
    # ... then real silence, the role's loop turning all along, for longer than heartbeat_timeout.
    silent_from = clock.now
    while not link.tick(dict):
        assert clock.now - silent_from < 10, "the role never noticed the supervisor's silence"
        clock.now += 0.1
    assert stop.is_set() and link.stop_reason.startswith("supervisor silent for")
    assert clock.now - silent_from >= 5.0  # supervisor.heartbeat_timeout above
    link.close()


def test_roles_started_by_hand_do_not_watch_for_a_supervisor(ctx: zmq.Context) -> None:
    cfg = link_config("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    clock = FakeClock()
    link = SupervisorLink(
        ctx, cfg, "learner", 0, threading.Event(), clock=clock, watch_supervisor=False, start=False
    )
    for t in (0.0, 100.0, 10_000.0):  # far past heartbeat_timeout and join_timeout
        clock.now = t
        assert not link.tick(dict)
    assert link.stop_reason == ""
    link.close()


def received_heartbeats(pull: zmq.Socket, count: int, timeout: float) -> list[HeartbeatMsg]:
    """The first ``count`` heartbeats to arrive on ``pull``; fails after ``timeout`` seconds."""
    got: list[HeartbeatMsg] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and pull.poll(left_ms), (
            f"{len(got)} heartbeat(s) within {timeout} s, wanted {count}"
        )
        msg = wire.load(pull.recv_multipart())
        assert isinstance(msg, HeartbeatMsg)
        got.append(msg)
    return got


def test_each_heartbeat_carries_the_main_loops_progress_and_its_counters(ctx: zmq.Context) -> None:
    pull, heartbeat = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    clock = FakeClock()
    cfg = link_config("tcp://127.0.0.1:1", heartbeat)
    link = SupervisorLink(ctx, cfg, "actor", 3, clock=clock, watch_supervisor=False, start=False)
    steps = 0

    def counters() -> dict[str, float]:
        return {"steps": steps, "recent_return": float("nan")}

    for t in range(3):  # one tick per heartbeat_interval: each tick beats
        clock.now = float(t)
        steps += 10
        link.tick(counters, state="running")
    link.progress()  # long work inside one step still counts as progress
    link.final("stopped", counters())
    beats = received_heartbeats(pull, 4, 10)
    link.close()
    assert [hb.counters["progress"] for hb in beats] == [1, 2, 3, 4]
    assert [hb.counters["steps"] for hb in beats] == [10, 20, 30, 30]
    assert [hb.state for hb in beats] == ["running", "running", "running", "stopped"]
    assert all((hb.role, hb.id) == ("actor", 3) for hb in beats)
    assert all("recent_return" not in hb.counters for hb in beats), "NaN (not measured yet) is left out"


def test_the_heartbeat_thread_beats_while_the_main_loop_never_ticks(ctx: zmq.Context) -> None:
    pull, heartbeat = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    cfg = link_config("tcp://127.0.0.1:1", heartbeat, "supervisor.heartbeat_interval=0.05")
    link = SupervisorLink(ctx, cfg, "learner", 0, watch_supervisor=False)  # start=True: its own thread
    try:
        beats = received_heartbeats(pull, 2, 10)  # a main loop busy (or hung) elsewhere: still alive
    finally:
        link.close()
    assert all(hb.state == "starting" and hb.counters["progress"] == 0 for hb in beats), (
        "no tick yet: alive, but no progress"
    )


# ---------------------------------------------------------------------------------------------
# Rate-limited drop reports lose no count (issue 9, item 19)
# ---------------------------------------------------------------------------------------------


class Lines(logging.Handler):
    """A capturing logger's handler: every formatted line."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def capturing_bad_messages(clock: FakeClock) -> tuple[BadMessages, list[str]]:
    logger = logging.getLogger(f"test.bad.{id(clock)}")
    logger.propagate = False
    handler = Lines()
    logger.addHandler(handler)
    return BadMessages("learner samples", logger, interval=5.0, clock=clock), handler.lines


def test_a_burst_inside_one_interval_is_reported_in_full_by_the_flush() -> None:
    clock = FakeClock()
    bad, lines = capturing_bad_messages(clock)
    for i in range(10_000):
        clock.now = i * 1e-4  # all within one 5 s interval
        bad.record(ValueError(f"junk {i}"))
    assert lines == [
        "learner samples: dropped 1 malformed message(s) since the last report (total 1); latest: junk 0"
    ]
    assert bad.pending == 9_999
    assert bad.flush()
    assert lines[1] == (
        "learner samples: dropped 9999 malformed message(s) since the last report (total 10000);"
        " latest: junk 9999"
    )
    assert not bad.flush(), "nothing pending: no line"
    assert len(lines) == 2 and bad.count == 10_000


def test_the_next_line_after_the_interval_includes_the_suppressed_drops() -> None:
    clock = FakeClock()
    bad, lines = capturing_bad_messages(clock)
    for _ in range(10_000):
        bad.record(ValueError("junk"))
    clock.now = 5.0
    bad.record(ValueError("one more"))
    assert len(lines) == 2
    assert (
        "dropped 10000 malformed message(s) since the last report (total 10001); latest: one more" in lines[1]
    )


def test_maybe_flush_reports_a_burst_that_stopped_once_the_interval_passed() -> None:
    clock = FakeClock()
    bad, lines = capturing_bad_messages(clock)
    for _ in range(10_000):
        bad.record(ValueError("junk"))
    clock.now = 4.9
    assert not bad.maybe_flush() and len(lines) == 1, "still inside the interval"
    clock.now = 5.0
    assert bad.maybe_flush()
    assert "dropped 9999 malformed message(s) since the last report (total 10000)" in lines[1]
    clock.now = 100.0
    assert not bad.maybe_flush(), "nothing new: housekeeping stays quiet"
    assert len(lines) == 2


# ---------------------------------------------------------------------------------------------
# Drains are capped, so a flood cannot stall a loop (issue 9, item 10)
# ---------------------------------------------------------------------------------------------


def pipe(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    """An inproc PUSH -> PULL pair: a send is queued for the PULL side as soon as it returns."""
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"inproc://{name}")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"inproc://{name}")
    return push, pull


def test_heartbeat_receiver_reads_at_most_max_messages_per_call(ctx: zmq.Context) -> None:
    push, pull = pipe(ctx, "hb-flood")
    receiver = HeartbeatReceiver(pull, BadMessages("hb"))
    frames = wire.dump(HeartbeatMsg("actor", 1, 2, 3.0, "running", {}, {}))
    for _ in range(299):
        push.send_multipart(frames)
    push.send(b"junk counts towards the cap too")
    assert len(receiver.recv_all(1000)) == DRAIN_MAX_MESSAGES == 256
    rest = receiver.recv_all(1000, max_messages=100)
    assert len(rest) == 299 - 256 and receiver.bad.count == 1
    assert receiver.recv_all(0) == []


def test_control_subscriber_finds_a_stop_behind_a_flood_on_a_later_call(ctx: zmq.Context) -> None:
    push, pull = pipe(ctx, "ctl-flood")
    sub = ControlSubscriber(pull, BadMessages("ctl"))
    beat = wire.dump(HeartbeatMsg("supervisor", 0, 2, 3.0, "running", {}, {}))
    for _ in range(300):
        push.send_multipart(beat)
    push.send_multipart(wire.dump(StopMsg("flooded")))
    assert sub.poll_stop(max_messages=256) is None, "the stop is still queued behind the flood"
    assert sub.supervisor_seen is not None
    assert sub.poll_stop(max_messages=256) == StopMsg("flooded")


# ---------------------------------------------------------------------------------------------
# The run fingerprint on the weights channel (issue 9, item 6)
# ---------------------------------------------------------------------------------------------

LEARNER_FP: Fingerprint = {"env.id": "CartPole-v1", "agent.n_step": 3, "agent.gamma": 0.99}


def fingerprint_pair(
    ctx: zmq.Context, published: Fingerprint | None, expected: Fingerprint | None, reference: Any = None
) -> tuple[WeightsPublisher, WeightsSubscriber]:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn", fingerprint=published)
    sub = WeightsSubscriber(
        sockets.weights_sub(ctx, endpoint, LIMITS), reference, BadMessages("w"), expected_fingerprint=expected
    )
    return publisher, sub


def first_weights(publisher: WeightsPublisher, sub: WeightsSubscriber, params: dict[str, np.ndarray]) -> Any:
    """Publish until the subscription is through (PUB/SUB drops before it); return latest()'s result."""
    deadline = time.monotonic() + 10
    version = publisher.version
    while time.monotonic() < deadline:
        version += 1
        publisher.publish(Weights(version, params))
        sub._sock.poll(50)
        got = sub.latest()
        if got is not None:
            return got
    raise AssertionError("no weights arrived")


def test_matching_fingerprint_passes_and_is_exposed(ctx: zmq.Context) -> None:
    publisher, sub = fingerprint_pair(ctx, LEARNER_FP, dict(LEARNER_FP))
    got = first_weights(publisher, sub, {"w": np.zeros(2, np.float32)})
    assert got.fingerprint == LEARNER_FP and sub.fingerprint == LEARNER_FP


@pytest.mark.parametrize(
    ("mine", "keys"),
    [
        ({**LEARNER_FP, "agent.n_step": 5}, ["agent.n_step"]),  # the actor's setting differs
        (
            {"env.id": "CartPole-v1", "agent.n_step": 3},
            ["agent.gamma"],
        ),  # the learner has a key the actor lacks
        ({**LEARNER_FP, "agent.dueling": True}, ["agent.dueling"]),  # the actor has a key the learner lacks
    ],
)
def test_mismatched_fingerprint_raises_and_the_weights_are_never_returned(
    ctx: zmq.Context, mine: Fingerprint, keys: list[str]
) -> None:
    publisher, sub = fingerprint_pair(ctx, LEARNER_FP, mine)
    with pytest.raises(FingerprintMismatch) as info:
        first_weights(publisher, sub, {"w": np.zeros(2, np.float32)})
    assert info.value.keys == keys
    assert "\n" not in str(info.value) and all(k in str(info.value) for k in keys)
    assert sub.fingerprint is None and sub.bad.count == 0, "a mismatch is not a malformed message"


def test_a_learner_with_another_network_is_named_as_a_mismatch_not_dropped_as_junk(ctx: zmq.Context) -> None:
    reference = {"w": ((2,), "float32")}  # the actor's own network
    publisher, sub = fingerprint_pair(
        ctx, {**LEARNER_FP, "agent.hidden_sizes": [64]}, {**LEARNER_FP}, reference
    )
    with pytest.raises(FingerprintMismatch, match=r"agent\.hidden_sizes"):
        first_weights(publisher, sub, {"w": np.zeros(3, np.float32)})
    assert sub.bad.count == 0


def test_weights_without_fingerprint_or_without_expectation_are_not_checked(ctx: zmq.Context) -> None:
    old_learner, sub = fingerprint_pair(ctx, None, LEARNER_FP)
    assert first_weights(old_learner, sub, {"w": np.zeros(2, np.float32)}).fingerprint is None
    publisher, unchecked = fingerprint_pair(ctx, LEARNER_FP, None)
    assert first_weights(publisher, unchecked, {"w": np.zeros(2, np.float32)}).fingerprint == LEARNER_FP


# ---------------------------------------------------------------------------------------------
# Lost and reordered batches per actor (issue 9, item 7)
# ---------------------------------------------------------------------------------------------

CARTPOLE_SPEC = SampleSpec(
    obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2
)


def one_row_batch() -> TransitionBatch:
    return TransitionBatch(
        obs=np.zeros((2, 4), np.float32),
        action=np.zeros(2, np.int64),
        reward=np.zeros(2, np.float32),
        next_obs=np.zeros((2, 4), np.float32),
        discount=np.ones(2, np.float32),
    )


def test_sample_receiver_counts_lost_reordered_and_restarted_batches_per_actor(ctx: zmq.Context) -> None:
    push, pull = pipe(ctx, "samples-seq")
    receiver = SampleReceiver(pull, CARTPOLE_SPEC, BadMessages("samples"))
    sent = [(0, 0), (0, 1), (0, 4), (0, 3), (1, 10), (1, 11), (0, 0), (0, 1)]  # (actor_id, seq)
    for actor_id, seq in sent:
        push.send_multipart(wire.dump(SamplesMsg(actor_id, seq, 0, one_row_batch(), [])))
    push.send(b"junk is not tracked")
    got = []
    while (msg := receiver.recv_nowait()) is not False:
        got.append(msg)
    assert len(got) == len(sent) + 1 and got[-1] is None
    per_actor = receiver.seqs.per_actor()
    assert per_actor[0] == {
        "batches": 6,
        "samples": 12,
        "lost": 2,
        "reordered": 1,
        "restarts": 1,
        "last_seq": 1,
    }
    assert per_actor[1] == {
        "batches": 2,
        "samples": 4,
        "lost": 0,
        "reordered": 0,
        "restarts": 0,
        "last_seq": 11,
    }
    totals = receiver.seqs.totals()
    assert (totals["lost_batches"], totals["reordered_batches"], totals["actor_restarts"]) == (2, 1, 1)


def test_a_sender_that_cannot_deliver_says_so_then_gives_up(
    ctx: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody listens at the endpoint: the sender warns after 5 s (then at doubling intervals) with
    what to check, and raises LearnerUnreachable past its give-up time; it never spins."""
    push = sockets.samples_push(ctx, "tcp://127.0.0.1:1", LIMITS)
    clock = FakeClock()
    sender = SampleSender(push, "tcp://127.0.0.1:1", give_up_after=30.0, clock=clock)
    polls = 0

    def idle() -> bool:
        nonlocal polls
        polls += 1
        clock.now += 1.0
        return False

    msg = SamplesMsg(actor_id=0, seq=0, weights_version=0, batch=one_row_batch(), episodes=[])
    with caplog.at_level(logging.WARNING), pytest.raises(LearnerUnreachable, match=r"connect_timeout"):
        send_with_housekeeping(sender, msg, idle)
    warnings = [r.getMessage() for r in caplog.records if "no samples delivered" in r.getMessage()]
    assert len(warnings) == 3, warnings  # after 5, 10 and 20 s
    assert "tcp://127.0.0.1:1" in warnings[0] and "key_name" in warnings[0]
    assert 30 <= polls <= 33
    push.close(linger=0)


def test_a_subscriber_that_joins_gets_the_latest_weights_without_waiting_for_the_republish(
    ctx: zmq.Context,
) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    publisher.publish(Weights(7, {"w": np.full(2, 7, np.float32)}))  # nobody listens yet: lost
    sub = WeightsSubscriber(sockets.weights_sub(ctx, endpoint, LIMITS), None, BadMessages("w"))
    deadline = time.monotonic() + 10
    while not publisher.republish_if_due(interval=3600.0):  # the timed republish never comes due
        assert time.monotonic() < deadline, "the subscription was never reported"
        pub_sock.poll(20)
    assert publisher.joins == 1
    assert sub._sock.poll(5000), "the joiner got nothing"
    got = sub.latest()
    assert got is not None and got.weights.version == 7


def test_joiners_in_a_burst_get_one_send_per_resend_gap(ctx: zmq.Context) -> None:
    now = [100.0]
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn", clock=lambda: now[0])
    publisher.publish(Weights(1, {"w": np.zeros(2, np.float32)}))
    sent_before = publisher.publishes
    subs = [sockets.weights_sub(ctx, endpoint, LIMITS) for _ in range(5)]
    deadline = time.monotonic() + 10
    while publisher.joins < len(subs):  # the clock stands still: one join-send at most
        assert time.monotonic() < deadline, f"only {publisher.joins} of {len(subs)} joins reported"
        publisher.republish_if_due(interval=3600.0)
        pub_sock.poll(20)
    assert publisher.publishes == sent_before + 1
    late = sockets.weights_sub(ctx, endpoint, LIMITS)  # within the gap: it waits for the gap's end
    while publisher.joins < len(subs) + 1:
        assert time.monotonic() < deadline, "the late joiner was never reported"
        assert not publisher.republish_if_due(interval=3600.0)
        pub_sock.poll(20)
    now[0] += 2 * JOIN_RESEND_SECONDS
    assert publisher.republish_if_due(interval=3600.0)
    assert publisher.publishes == sent_before + 2
    assert not publisher.republish_if_due(interval=3600.0), "one send answers every waiting joiner"
    for sock in (*subs, late):
        sock.close(linger=0)


def test_an_actor_started_seconds_before_the_learner_binds_joins_within_a_quarter_second(
    ctx: zmq.Context,
) -> None:
    # launch starts actors while the learner imports torch. libzmq doubles the reconnect interval
    # while the peer is away; capped at 2 s, an actor could join up to ~2 s after the bind.
    with socket.socket() as probe:  # a free port, held by nobody while the actor retries
        probe.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    sub = sockets.weights_sub(ctx, endpoint, LIMITS)
    away_until = time.monotonic() + 3.2  # long enough for the old backoff to reach 2 s
    while time.monotonic() < away_until:  # the scenario: the learner is away this long
        time.sleep(0.05)
    pub_sock, _ = sockets.weights_pub(ctx, endpoint, LIMITS)
    bound = time.monotonic()
    publisher = WeightsPublisher(pub_sock, "dqn")
    while publisher.joins == 0:
        assert time.monotonic() - bound < 1.0, "the subscriber was still backing off a second after the bind"
        publisher.republish_if_due(interval=3600.0)
        pub_sock.poll(10)
    sub.close(linger=0)


def test_what_a_peer_sends_the_weights_socket_besides_subscribing_is_no_join_and_no_harm(
    ctx: zmq.Context,
) -> None:
    pub_sock, endpoint = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    publisher = WeightsPublisher(pub_sock, "dqn")
    publisher.publish(Weights(3, {"w": np.zeros(2, np.float32)}))
    hostile = ctx.socket(zmq.XSUB)  # may send anything upstream, unlike a SUB
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.connect(endpoint)
    hostile.send(b"\x02not a subscription")
    hostile.send(b"\x01" + b"x" * (sockets.SUBSCRIPTION_MAX_BYTES * 4))  # over the limit: cut off
    honest = sockets.weights_sub(ctx, endpoint, LIMITS)
    sub = WeightsSubscriber(honest, None, BadMessages("w"))
    deadline = time.monotonic() + 10
    while sub.latest() is None:  # the honest subscriber's join is answered
        assert time.monotonic() < deadline, "the honest subscriber got no weights"
        publisher.republish_if_due(interval=3600.0)
        honest.poll(20)
    assert publisher.joins == 1, "only the honest subscription counts as a join"
    hostile.close()


# ---------------------------------------------------------------------------------------------
# Backpressure is not an unreachable learner; a role reports its control drops (issue 23 item 11)
# ---------------------------------------------------------------------------------------------


def test_a_sender_waits_out_a_connected_learner_that_is_not_reading_and_gives_up_once_it_is_gone(
    ctx: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """The learner is connected but reads nothing (training, or held back by its replay ratio):
    that is backpressure, and an actor must wait as long as it takes, not give up after
    give_up_after of blocked time. Once nothing is connected any more, it gives up as before."""
    small = sockets.SocketLimits(samples_hwm=2, linger_ms=0, samples_buffer_bytes=4096)
    pull, endpoint = sockets.samples_pull(ctx, "tcp://127.0.0.1:0", small)
    sender = SampleSender(sockets.samples_push(ctx, endpoint, small), endpoint, give_up_after=0.3)
    msg = SamplesMsg(actor_id=0, seq=0, weights_version=0, batch=one_row_batch(), episodes=[])
    big = SamplesMsg(0, 0, 0, TransitionBatch(*(np.repeat(a, 4096, axis=0) for a in one_row_batch())), [])
    blocked_since: list[float] = []

    def idle() -> bool:  # the actor's housekeeping while blocked; stops after 2 s of backpressure
        blocked_since.append(blocked_since[0] if blocked_since else time.monotonic())
        return time.monotonic() - blocked_since[0] > 2.0

    with caplog.at_level(logging.WARNING):
        while send_with_housekeeping(sender, big, idle):  # fills the queue and socket buffers, then blocks
            assert time.monotonic() - (blocked_since[0] if blocked_since else time.monotonic()) < 10
    assert sender.messages_sent > 0
    assert sender.backpressure_seconds > 1.5, "it was blocked by a connected learner"
    pull.close(linger=0)  # the learner is gone: nothing connected from now on
    started = time.monotonic()
    with pytest.raises(LearnerUnreachable, match="no learner to deliver samples to"):
        # A first send may still fit the pipe the learner's end drained before it closed (a busy
        # machine's I/O threads lag): that message is lost with the learner, the next is held back.
        while time.monotonic() - started < 5:
            send_with_housekeeping(sender, msg, lambda: time.monotonic() - started > 20)
    assert time.monotonic() - started < 5
    sender.close()


def test_a_role_reports_the_control_messages_it_dropped_in_its_heartbeats(ctx: zmq.Context) -> None:
    pull, heartbeat = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    pub, control = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    clock = FakeClock()
    link = SupervisorLink(
        ctx, link_config(control, heartbeat), "actor", 1, clock=clock, watch_supervisor=False, start=False
    )
    deadline = time.monotonic() + 10
    while link.control.bad.count < 3:  # PUB drops until the subscription is through
        assert time.monotonic() < deadline, "no junk reached the role's control socket"
        pub.send(b"not a control message")
        link._ctl_sock.poll(20)
        clock.now += 1.0  # past CONTROL_POLL_SECONDS and the heartbeat interval: each tick polls, beats
        link.tick(dict)
    link.final("stopped", {})
    beats = received_heartbeats(pull, 2, 10)
    while pull.poll(200):
        beats.append(received_heartbeats(pull, 1, 1)[0])
    link.close()
    assert beats[-1].state == "stopped" and beats[-1].counters["bad_control"] == link.control.bad.count >= 3
